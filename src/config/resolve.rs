//! Resolving the configuration: each option from its sources, parsed, defaulted, and checked
//! against the others.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use super::cli::Flags;
use super::error::ConfigError;
use super::postgres::check_database_url;
use super::redis_endpoint::{check_redis_url, read_ca_file};
use super::secret_url::SecretUrl;
use super::settings::Config;
use super::source::Sources;
use super::values::{
    bounded_int, byte_size_between, duration_at_least, duration_between, parse_bool, parse_duration,
};
use crate::broker::layout::LayoutKind;
use crate::broker::url as redis_url;
use crate::defaults::*;
use crate::relay::PreparedStatements;
use crate::table::TableName;
use crate::telemetry::logging::LogFormat;

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
            .parse("layout", |s| s.parse::<LayoutKind>())?
            .unwrap_or_default();
        // The layout's own rules: its runner's default prefix, the prefixes its workers can
        // never read, whether they read a Cluster at all.
        let runner = layout.layout();
        let namespace = if src.get("namespace").is_none() {
            runner.default_namespace().to_owned()
        } else {
            namespace
        };
        runner
            .check_namespace(&namespace)
            .map_err(|reason| ConfigError {
                culprit: "--namespace".into(),
                reason,
            })?;
        if let Some(why) = runner.refuses_cluster().filter(|_| {
            redis_url::topology(&redis_url) == Some(crate::broker::connection::Topology::Cluster)
        }) {
            return Err(ConfigError {
                culprit: "--layout".into(),
                reason: why.into(),
            });
        }
        if redis_url::topology(&redis_url) == Some(crate::broker::connection::Topology::Cluster)
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
        let prepared_statements = src
            .parse("prepared_statements", |s| s.parse::<PreparedStatements>())?
            .unwrap_or_default();
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
        let consumer_window = src
            .parse("consumer_window", |s| {
                if s.eq_ignore_ascii_case("off") {
                    Ok(None)
                } else {
                    duration_at_least(s, Duration::from_secs(1)).map(Some)
                }
            })?
            .unwrap_or(Some(DEFAULT_CONSUMER_WINDOW));
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
            prepared_statements,
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
            consumer_window,
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
}
