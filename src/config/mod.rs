//! Configuration (docs/cli.md): flags > environment > `--config` TOML file > defaults, resolved and
//! validated in one pass before any connection is made. Every error names its culprit: the
//! flag, the environment variable, or the key and file it came from.
//!
//! The environment is read through a function, so tests never touch the process environment.

pub mod cli;
/// `--redis-url`'s forms: [`crate::redis::url`], kept here under its old name.
pub use crate::redis::url as redis_url;
mod source;

pub use self::source::OPTIONS;

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use sqlx::ConnectOptions;

use self::cli::Flags;
use self::source::{Origin, Sources};
use crate::table::TableName;
use crate::telemetry::logging::LogFormat;
use crate::telemetry::redact;

/// A bad option: `{culprit}: {reason}`, e.g. `--batch-size: "ten" is not a whole number`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{culprit}: {reason}")]
pub struct ConfigError {
    /// The flag, variable or file key at fault.
    pub culprit: String,
    /// What is wrong with it, free of secrets.
    pub reason: String,
}

/// A connection URL whose password never shows in `Debug` or `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretUrl(String);

impl SecretUrl {
    /// The URL itself, password included. Pass it to a client; never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", redact::redact_url(&self.0))
    }
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact::redact_url(&self.0))
    }
}

/// A PEM file of trusted CA certificates (`--redis-ca-file`), read and checked once at start.
/// `Debug` shows the path only.
#[derive(Clone, PartialEq, Eq)]
pub struct CaFile {
    path: PathBuf,
    pem: Vec<u8>,
}

impl CaFile {
    /// Where the certificates were read from.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// The PEM text as read.
    pub fn pem(&self) -> &[u8] {
        &self.pem
    }
}

impl fmt::Debug for CaFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("CaFile").field(&self.path).finish()
    }
}

pub use crate::defaults::*;

/// The whole, validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// `--database-url`.
    pub database_url: SecretUrl,
    /// `--listen-url` (`None`: the listener uses `--database-url`).
    pub listen_url: Option<SecretUrl>,
    /// `--pg-max-connections`: the most Postgres connections the relay opens (see
    /// [`Config::pg_footprint`]).
    pub pg_max_connections: usize,
    /// `--redis-url`.
    pub redis_url: SecretUrl,
    /// `--redis-ca-file`: CA certificates that verify a `rediss://` server instead of the
    /// bundled web PKI roots.
    pub redis_ca_file: Option<CaFile>,
    /// `--redis-allow-eviction`.
    pub redis_allow_eviction: bool,
    /// `--redis-wait-replicas` (0: none).
    pub redis_wait_replicas: u32,
    /// `--redis-wait-timeout`.
    pub redis_wait_timeout: Duration,
    /// `--table`.
    pub table: TableName,
    /// `--namespace`.
    pub namespace: String,
    /// `--layout`.
    pub layout: crate::redis::layout::LayoutKind,
    /// `--batch-size`.
    pub batch_size: usize,
    /// `--batch-max-bytes`.
    pub batch_max_bytes: usize,
    /// `--max-job-size`.
    pub max_job_size: usize,
    /// `--workers`.
    pub workers: usize,
    /// `--claim-slots`.
    pub claim_slots: usize,
    /// `--poll-interval`.
    pub poll_interval: Duration,
    /// `--max-attempts`.
    pub max_attempts: u32,
    /// `--dedup-ttl` (zero: never expires).
    pub dedup_ttl: Duration,
    /// `--http-addr` (`None`: off).
    pub http_addr: Option<SocketAddr>,
    /// `--shutdown-timeout`.
    pub shutdown_timeout: Duration,
    /// `--push-timeout`.
    pub push_timeout: Duration,
    /// `--log-format`.
    pub log_format: LogFormat,
    /// `--sweep`.
    pub sweep: bool,
    /// `--older-than`.
    pub older_than: Duration,
    /// `--config`, if one was read.
    pub config_file: Option<PathBuf>,
}

impl Config {
    /// Resolves the configuration from `flags`, the environment (`env`) and the TOML file named
    /// by `--config` / `JOBRELAY_CONFIG`, then validates it. Registers the URLs' passwords for
    /// redaction.
    pub fn resolve(
        flags: &Flags,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let src = Sources::load(flags, env)?;

        let database_url = src.secret_url("database_url", "--database-url", "DATABASE_URL")?;
        let redis_url = src.secret_url("redis_url", "--redis-url", "REDIS_URL")?;
        let listen_url = src.secret_url("listen_url", "--listen-url", "JOBRELAY_LISTEN_URL")?;
        if let Some((url, origin)) = &listen_url {
            check_database_url(url, origin)?;
        }
        let database_url = match database_url {
            Some((url, origin)) => {
                check_database_url(&url, &origin)?;
                url
            }
            None => DEFAULT_DATABASE_URL.to_owned(),
        };
        let redis_url = match redis_url {
            Some((url, origin)) => {
                check_redis_url(&url, &origin)?;
                url
            }
            None => DEFAULT_REDIS_URL.to_owned(),
        };

        let redis_ca_file = match src.get("redis_ca_file") {
            Some((path, origin)) => Some(read_ca_file(&path, &origin, &redis_url)?),
            None => None,
        };

        let table = src.parse("table", TableName::parse)?.unwrap_or_default();
        let namespace = src
            .parse("namespace", |s| {
                if s.len() > 128 {
                    Err("at most 128 bytes".to_owned())
                } else if let Some(c) = s.chars().find(|c| c.is_whitespace() || c.is_control()) {
                    Err(format!(
                        "{s:?} contains {c:?}; whitespace and control characters are not allowed"
                    ))
                } else {
                    Ok(s.to_owned())
                }
            })?
            .unwrap_or_default();
        let layout = src
            .parse("layout", |s| s.parse::<crate::redis::layout::LayoutKind>())?
            .unwrap_or_default();
        let namespace = if layout == crate::redis::layout::LayoutKind::Bullmq
            && src.get("namespace").is_none()
        {
            // BullMQ's default prefix, "bull", and the ':' it joins keys with.
            "bull:".to_owned()
        } else {
            namespace
        };
        if layout == crate::redis::layout::LayoutKind::Bullmq
            && (namespace.len() < 2 || !namespace.ends_with(':'))
        {
            // BullMQ names a queue's keys <prefix>:<queue>:<type> and never has an empty prefix.
            return Err(ConfigError {
                culprit: "--namespace".into(),
                reason: format!(
                    "{namespace:?} cannot match a BullMQ worker: with --layout bullmq, give \
                     BullMQ's prefix followed by ':' (BullMQ's default prefix is \"bull\": \
                     --namespace bull:, the default in this layout; on a Redis Cluster \
                     --namespace '{{bull}}:' for the prefix '{{bull}}')"
                ),
            });
        }
        if layout == crate::redis::layout::LayoutKind::Conveyor && !namespace.ends_with(':') {
            // Conveyor joins its namespace to every key with ':' and never has an empty one
            // (its default is "conv"): another prefix cannot reach a conveyor worker.
            return Err(ConfigError {
                culprit: "--namespace".into(),
                reason: format!(
                    "{namespace:?} cannot match a conveyor worker: with --layout conveyor, give \
                     conveyor's namespace followed by ':' (conveyor's default namespace is \
                     \"conv\": --namespace conv:)"
                ),
            });
        }
        if layout == crate::redis::layout::LayoutKind::Celery
            && redis_url::topology(&redis_url) == Some(crate::redis::connection::Topology::Cluster)
        {
            // kombu's Redis transport talks to one Redis (or a Sentinel-managed primary).
            return Err(ConfigError {
                culprit: "--layout".into(),
                reason: "celery cannot read a Redis Cluster (kombu's Redis transport has no \
                         Cluster support): give the URL of the Redis its workers use"
                    .into(),
            });
        }
        if layout == crate::redis::layout::LayoutKind::Rq
            && redis_url::topology(&redis_url) == Some(crate::redis::connection::Topology::Cluster)
        {
            // RQ has no Cluster support (rq/rq#1048, open): its transactions and scripts name a
            // job's hash, queue and registries, which share no hash tag.
            return Err(ConfigError {
                culprit: "--layout".into(),
                reason: "rq cannot read a Redis Cluster (RQ has no Cluster support): give the \
                         URL of the Redis its workers use"
                    .into(),
            });
        }
        if redis_url::topology(&redis_url) == Some(crate::redis::connection::Topology::Cluster)
            && !redis_url::namespace_is_one_slot(&namespace)
        {
            // A script call touches many keys; a Cluster runs it only if all of them are in
            // one hash slot, which a hash tag in the namespace guarantees.
            return Err(ConfigError {
                culprit: src.origin_of("namespace").to_string(),
                reason: format!(
                    "{namespace:?} cannot keep the relay's keys in one hash slot of a Redis \
                     Cluster: put a hash tag in it, e.g. --namespace '{{jobs}}:' (with --layout \
                     conveyor, conveyor's namespace in braces: --namespace '{{conv}}:')"
                ),
            });
        }
        let batch_size = src
            .parse("batch_size", |s| bounded_int(s, 1, 10_000))?
            .unwrap_or(DEFAULT_BATCH_SIZE);
        let batch_max_bytes = src
            .parse("batch_max_bytes", |s| {
                byte_size_between(s, 64 * 1024, 1 << 30)
            })?
            .unwrap_or(DEFAULT_BATCH_MAX_BYTES);
        let max_job_size = src
            .parse("max_job_size", |s| byte_size_between(s, 1024, 1 << 30))?
            .unwrap_or(DEFAULT_MAX_JOB_SIZE);
        if max_job_size > batch_max_bytes {
            return Err(ConfigError {
                culprit: src.origin_of("max_job_size").to_string(),
                reason: format!(
                    "{max_job_size} bytes is more than the batch byte cap ({batch_max_bytes} bytes, \
                     --batch-max-bytes): a job that large could never be relayed; raise \
                     --batch-max-bytes or lower --max-job-size"
                ),
            });
        }
        let workers = src
            .parse("workers", |s| bounded_int(s, 1, 64))?
            .unwrap_or(DEFAULT_WORKERS);
        // Workers plus the probe, at least; the default adds the listener and the wake-up lock.
        let pg_max_connections = src
            .parse("pg_max_connections", |s| bounded_int(s, 2, 1000))?
            .unwrap_or(workers + 3);
        if pg_max_connections < workers + 1 {
            return Err(ConfigError {
                culprit: src.origin_of("pg_max_connections").to_string(),
                reason: format!(
                    "{pg_max_connections} is fewer than one connection per worker ({workers}, \
                     --workers) plus one for the probe: use at least {} or fewer workers",
                    workers + 1
                ),
            });
        }
        let claim_slots = src
            .parse("claim_slots", |s| bounded_int(s, 1, 64))?
            .unwrap_or(DEFAULT_CLAIM_SLOTS);
        let poll_interval = src
            .parse("poll_interval", |s| {
                duration_at_least(s, Duration::from_millis(10))
            })?
            .unwrap_or(DEFAULT_POLL_INTERVAL);
        let max_attempts = src
            .parse("max_attempts", |s| bounded_int(s, 1, 1_000_000))?
            .unwrap_or(DEFAULT_MAX_ATTEMPTS as usize) as u32;
        let push_timeout = src
            .parse("push_timeout", |s| {
                duration_between(s, Duration::from_millis(100), Duration::from_secs(600))
            })?
            .unwrap_or(DEFAULT_PUSH_TIMEOUT);
        let redis_allow_eviction = src
            .parse("redis_allow_eviction", parse_bool)?
            .unwrap_or(false);
        let redis_wait_replicas = src
            .parse("redis_wait_replicas", |s| bounded_int(s, 0, 100))?
            .map(|n| n as u32)
            .unwrap_or(DEFAULT_REDIS_WAIT_REPLICAS);
        let redis_wait_timeout = src
            .parse("redis_wait_timeout", |s| {
                duration_at_least(s, Duration::from_millis(10))
            })?
            .unwrap_or(DEFAULT_REDIS_WAIT_TIMEOUT);
        if redis_wait_replicas > 0 && redis_wait_timeout >= push_timeout {
            // The connection's every answer is bounded by --push-timeout: a longer WAIT would
            // be cut off as a timeout.
            return Err(ConfigError {
                culprit: src.origin_of("redis_wait_timeout").to_string(),
                reason: format!(
                    "{} is not shorter than --push-timeout ({}): WAIT's answer would be cut off; \
                     lower it or raise --push-timeout",
                    humantime::format_duration(redis_wait_timeout),
                    humantime::format_duration(push_timeout),
                ),
            });
        }
        let dedup_ttl = src
            .parse("dedup_ttl", parse_duration)?
            .unwrap_or(DEFAULT_DEDUP_TTL);
        let http_addr = src
            .parse("http_addr", |s| {
                if s.eq_ignore_ascii_case("off") {
                    Ok(None)
                } else {
                    SocketAddr::from_str(s)
                        .map(Some)
                        .map_err(|_| format!("{s:?} is not `off` or an address like 0.0.0.0:9898"))
                }
            })?
            .unwrap_or_else(|| Some(DEFAULT_HTTP_ADDR.parse().expect("valid default")));
        let shutdown_timeout = src
            .parse("shutdown_timeout", parse_duration)?
            .unwrap_or(DEFAULT_SHUTDOWN_TIMEOUT);
        let log_format = src
            .parse("log_format", |s| match s {
                "text" => Ok(LogFormat::Text),
                "json" => Ok(LogFormat::Json),
                _ => Err(format!("{s:?} is not `text` or `json`")),
            })?
            .unwrap_or_else(LogFormat::detect);
        let older_than = src
            .parse("older_than", parse_duration)?
            .unwrap_or(DEFAULT_OLDER_THAN);

        let config = Config {
            database_url: SecretUrl(database_url),
            listen_url: listen_url.map(|(url, _)| SecretUrl(url)),
            pg_max_connections,
            redis_url: SecretUrl(redis_url),
            redis_ca_file,
            redis_allow_eviction,
            redis_wait_replicas,
            redis_wait_timeout,
            table,
            namespace,
            layout,
            batch_size,
            batch_max_bytes,
            max_job_size,
            workers,
            claim_slots,
            poll_interval,
            max_attempts,
            dedup_ttl,
            http_addr,
            shutdown_timeout,
            push_timeout,
            log_format,
            sweep: flags.sweep,
            older_than,
            config_file: src.file_path().map(PathBuf::from),
        };
        // The dedup window must outlive any transaction a vanished relay can leave open, or a
        // replayed row would become a second job (docs/guarantees.md#the-relay-step).
        let min_ttl = config.idle_in_transaction_timeout() * 2;
        if !config.dedup_ttl.is_zero() && config.dedup_ttl < min_ttl {
            return Err(ConfigError {
                culprit: src.origin_of("dedup_ttl").to_string(),
                reason: format!(
                    "{} is shorter than twice the idle-in-transaction timeout ({}, from --push-timeout): \
                     a replayed row could become a second job; use at least {} or 0",
                    humantime::format_duration(config.dedup_ttl),
                    humantime::format_duration(config.idle_in_transaction_timeout()),
                    humantime::format_duration(min_ttl),
                ),
            });
        }
        Ok(config)
    }

    /// `idle_in_transaction_session_timeout` of the relay's sessions: a relay holds a
    /// transaction open while it pushes (at most `--push-timeout`), never much longer.
    pub fn idle_in_transaction_timeout(&self) -> Duration {
        self.push_timeout + STATEMENT_TIMEOUT
    }

    /// Postgres connection options: the URL plus the relay's connection settings
    /// ([`session_settings`]).
    pub fn pg_options(&self) -> Result<PgConnectOptions, ConfigError> {
        url_options(&self.database_url, "--database-url")
    }

    /// The listener's connection options: `--listen-url`, else `--database-url`.
    pub fn listen_options(&self) -> Result<PgConnectOptions, ConfigError> {
        match &self.listen_url {
            Some(url) => url_options(url, "--listen-url"),
            None => self.pg_options(),
        }
    }

    /// How the relay spends `--pg-max-connections`: a pool for the workers and the probe,
    /// then one connection for the listener, then one for the wake-up lock, as far as they fit.
    pub fn pg_footprint(&self) -> PgFootprint {
        let (n, w) = (self.pg_max_connections, self.workers);
        let listener = n >= w + 2;
        let wakeup_lock = n >= w + 3;
        PgFootprint {
            pool: (n - usize::from(listener) - usize::from(wakeup_lock)) as u32,
            listener,
            wakeup_lock,
        }
    }

    /// How batches are claimed: `--batch-size`, `--batch-max-bytes`, `--max-job-size`,
    /// `--max-attempts`; no claim slot (the sweep's; the daemon adds its slots).
    pub fn batch_settings(&self) -> crate::relay::BatchSettings {
        crate::relay::BatchSettings {
            batch_size: self.batch_size,
            max_batch_bytes: self.batch_max_bytes,
            max_job_bytes: self.max_job_size,
            claim_slots: None,
            max_attempts: self.max_attempts,
            statement_timeout: STATEMENT_TIMEOUT,
            idle_in_transaction_timeout: self.idle_in_transaction_timeout(),
        }
    }

    /// The daemon's relay: [`crate::relay::Assembly::start`] runs it.
    pub fn assembly(&self) -> Result<crate::relay::Assembly, ConfigError> {
        Ok(crate::relay::Assembly {
            settings: crate::relay::RelaySettings {
                table: self.table.clone(),
                batch: crate::relay::BatchSettings {
                    claim_slots: Some(self.claim_slots as u32),
                    ..self.batch_settings()
                },
                poll_interval: self.poll_interval,
            },
            workers: self.workers,
            pool: crate::db::lazy_pool(self.pg_options()?, self.pg_footprint().pool),
            wakeup: crate::relay::Wakeup {
                listen: if self.pg_footprint().listener {
                    Some(self.listen_options()?)
                } else {
                    None
                },
                lock: self.pg_footprint().wakeup_lock,
            },
            redis: self.redis_client()?,
            enqueuer: self.enqueuer(),
            push_timeout: self.push_timeout,
            safety: self.redis_safety(),
        })
    }

    /// What the relay asks of Redis: `--redis-allow-eviction`, `--redis-wait-replicas`,
    /// `--redis-wait-timeout`.
    pub fn redis_safety(&self) -> crate::redis::probe::RedisSafety {
        crate::redis::probe::RedisSafety {
            allow_eviction: self.redis_allow_eviction,
            wait_replicas: self.redis_wait_replicas,
            wait_timeout: self.redis_wait_timeout,
        }
    }

    /// The enqueue algorithm with `--namespace`, `--dedup-ttl`, `--max-job-size` and
    /// `--batch-max-bytes` (the bytes of one script call).
    pub fn enqueuer(&self) -> crate::redis::enqueue::Enqueuer {
        crate::redis::enqueue::Enqueuer::new(self.namespace.clone(), self.dedup_ttl)
            .with_layout(self.layout)
            .with_limits(self.max_job_size, self.batch_max_bytes)
    }

    /// The Redis endpoint `--redis-url` names (one server, the Sentinels' primary, or a
    /// Cluster), trusting `--redis-ca-file` when given.
    pub fn redis_client(&self) -> Result<crate::redis::connection::RedisEndpoint, ConfigError> {
        redis_url::endpoint(
            self.redis_url.expose(),
            self.redis_ca_file.as_ref().map(|ca| ca.pem()),
        )
        .map_err(|e| ConfigError {
            culprit: "--redis-url".into(),
            reason: format!("{}: {}", self.redis_url, redact::scrub(&e)),
        })
    }
}

/// How the relay's Postgres connections are spent ([`Config::pg_footprint`],
/// docs/cli.md#postgres-connections).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PgFootprint {
    /// The pool of the workers (one connection each while a batch runs) and the probe.
    pub pool: u32,
    /// One connection for LISTEN; without it, idle workers poll every `--poll-interval`.
    pub listener: bool,
    /// One connection for the wake-up lock while workers find rows; without it, producers
    /// always NOTIFY.
    pub wakeup_lock: bool,
}

impl PgFootprint {
    /// Connections at most: the pool, the listener, the wake-up lock.
    pub fn total(&self) -> u32 {
        self.pool + u32::from(self.listener) + u32::from(self.wakeup_lock)
    }
}

fn url_options(url: &SecretUrl, flag: &str) -> Result<PgConnectOptions, ConfigError> {
    let opts = PgConnectOptions::from_str(url.expose()).map_err(|_| ConfigError {
        culprit: flag.into(),
        reason: format!("{url} is not a valid Postgres URL"),
    })?;
    Ok(session_settings(opts))
}

/// Adds the relay's connection settings to Postgres connection options: its application name
/// and statement logging, and nothing in the startup packet that PgBouncer refuses by default
/// (`options`, `extra_float_digits`). The relay's timeouts and `synchronous_commit` are set
/// per transaction instead ([`crate::db::begin_statement`]); `options` given in the URL are
/// kept.
pub fn session_settings(opts: PgConnectOptions) -> PgConnectOptions {
    let application_name = opts
        .get_application_name()
        .map(str::to_owned)
        .unwrap_or_else(|| "jobrelay".to_owned());
    // A relay runs a probe query every second: statements belong at TRACE, slow ones at WARN.
    opts.log_statements(log::LevelFilter::Trace)
        .log_slow_statements(log::LevelFilter::Warn, Duration::from_secs(1))
        .application_name(&application_name)
        // Floats the relay reads as text (the probe's backlog age) need no more digits than
        // the server's default gives.
        .extra_float_digits(None)
}

fn check_database_url(url: &str, origin: &Origin) -> Result<(), ConfigError> {
    let bad = |reason: String| ConfigError {
        culprit: origin.to_string(),
        reason,
    };
    let scheme_ok = url.starts_with("postgres://") || url.starts_with("postgresql://");
    if !scheme_ok {
        return Err(bad(format!(
            "{} is not a Postgres URL (postgres://user@host:5432/db)",
            redact::redact_url(url)
        )));
    }
    PgConnectOptions::from_str(url).map(|_| ()).map_err(|e| {
        bad(format!(
            "{}: {}",
            redact::redact_url(url),
            redact::scrub(&e.to_string())
        ))
    })
}

fn check_redis_url(url: &str, origin: &Origin) -> Result<(), ConfigError> {
    redis_url::endpoint(url, None)
        .map(|_| ())
        .map_err(|e| ConfigError {
            culprit: origin.to_string(),
            reason: format!(
                "{} is not a Redis URL (redis://[user:password@]host:6379[/db], rediss://, \
                 redis+sentinel://host:26379[,host...]/<master name>[/db], \
                 redis+cluster://host:port[,host:port...]): {}",
                redact::redact_url(url),
                redact::scrub(&e)
            ),
        })
}

/// Reads and checks `--redis-ca-file`: PEM certificates, for a `rediss://` URL.
fn read_ca_file(path: &str, origin: &Origin, redis_url: &str) -> Result<CaFile, ConfigError> {
    let bad = |reason: String| ConfigError {
        culprit: origin.to_string(),
        reason,
    };
    let pem = std::fs::read(path).map_err(|e| bad(format!("cannot read {path}: {e}")))?;
    if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
        return Err(bad(format!(
            "{path} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
        )));
    }
    if !redis_url::is_tls(redis_url) {
        return Err(bad(format!(
            "a CA file only applies to TLS, but the Redis URL {} is not rediss:// (or \
             rediss+sentinel://, rediss+cluster://)",
            redact::redact_url(redis_url)
        )));
    }
    redis_url::endpoint(redis_url, Some(&pem))
        .map_err(|e| bad(format!("{path}: {}", redact::scrub(&e))))?;
    Ok(CaFile {
        path: PathBuf::from(path),
        pem,
    })
}

/// Parses a humantime duration; a bare `0` is zero.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    if s.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("{s:?} is not a duration like 500ms, 30s, 5m or 1h30m ({e})"))
}

fn duration_at_least(s: &str, min: Duration) -> Result<Duration, String> {
    duration_between(s, min, Duration::MAX)
}

fn duration_between(s: &str, min: Duration, max: Duration) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < min {
        return Err(format!(
            "{s:?} is shorter than {}",
            humantime::format_duration(min)
        ));
    }
    if d > max {
        return Err(format!(
            "{s:?} is longer than {}",
            humantime::format_duration(max)
        ));
    }
    Ok(d)
}

/// Parses a size in bytes: a whole number with an optional unit, case-insensitive: `b`,
/// `k`/`kb`/`kib`, `m`/`mb`/`mib`, `g`/`gb`/`gib`, all powers of 1024 as in Redis's own
/// configuration (`proto-max-bulk-len 1mb` is 1048576 bytes).
pub fn parse_byte_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let bad = || format!("{s:?} is not a size like 16MiB, 512kb or 1048576");
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let unit_bytes: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1024,
        "m" | "mb" | "mib" => 1024 * 1024,
        "g" | "gb" | "gib" => 1024 * 1024 * 1024,
        _ => return Err(bad()),
    };
    n.checked_mul(unit_bytes)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(bad)
}

fn byte_size_between(s: &str, min: usize, max: usize) -> Result<usize, String> {
    let n = parse_byte_size(s)?;
    if n < min || n > max {
        return Err(format!(
            "{s:?} ({n} bytes) is out of range {min}..={max} bytes"
        ));
    }
    Ok(n)
}

/// `true`/`false` (also `1`/`0`, `yes`/`no`, `on`/`off`), any case.
fn parse_bool(s: &str) -> Result<bool, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(format!("{s:?} is not true or false")),
    }
}

fn bounded_int(s: &str, min: usize, max: usize) -> Result<usize, String> {
    let n: usize = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a whole number"))?;
    if n < min || n > max {
        return Err(format!("{n} is out of range {min}..={max}"));
    }
    Ok(n)
}
