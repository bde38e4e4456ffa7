//! The whole, validated configuration, and the relay's parts it sets up.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;

use super::error::ConfigError;
use super::postgres::{url_options, PgFootprint};
use super::redis_endpoint::CaFile;
use super::secret_url::SecretUrl;
use crate::broker::url as redis_url;
use crate::defaults::STATEMENT_TIMEOUT;
use crate::table::TableName;
use crate::telemetry::logging::LogFormat;
use crate::telemetry::redact;

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
    /// `--prepared-statements`.
    pub prepared_statements: crate::relay::PreparedStatements,
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
    pub layout: crate::broker::layout::LayoutKind,
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
    /// `--consumer-window` (`None`: off).
    pub consumer_window: Option<Duration>,
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
    /// `idle_in_transaction_session_timeout` of the relay's sessions: a relay holds a
    /// transaction open while it pushes (at most `--push-timeout`), never much longer.
    pub fn idle_in_transaction_timeout(&self) -> Duration {
        self.push_timeout + STATEMENT_TIMEOUT
    }

    /// Postgres connection options: the URL plus the relay's connection settings
    /// ([`session_settings`](super::session_settings)).
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
            prepared_statements: self.prepared_statements,
            max_attempts: self.max_attempts,
            statement_timeout: STATEMENT_TIMEOUT,
            idle_in_transaction_timeout: self.idle_in_transaction_timeout(),
        }
    }

    /// The daemon's relay: [`crate::assembly::Assembly::start`] runs it.
    pub fn assembly(&self) -> Result<crate::assembly::Assembly, ConfigError> {
        Ok(crate::assembly::Assembly {
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
            consumer_window: self.consumer_window,
        })
    }

    /// What the relay asks of Redis: `--redis-allow-eviction`, `--redis-wait-replicas`,
    /// `--redis-wait-timeout`.
    pub fn redis_safety(&self) -> crate::broker::safety::RedisSafety {
        crate::broker::safety::RedisSafety {
            allow_eviction: self.redis_allow_eviction,
            wait_replicas: self.redis_wait_replicas,
            wait_timeout: self.redis_wait_timeout,
        }
    }

    /// The enqueue algorithm with `--namespace`, `--dedup-ttl`, `--max-job-size` and
    /// `--batch-max-bytes` (the bytes of one script call).
    pub fn enqueuer(&self) -> crate::broker::enqueue::Enqueuer {
        crate::broker::enqueue::Enqueuer::new(self.namespace.clone(), self.dedup_ttl)
            .with_layout(self.layout)
            .with_limits(self.max_job_size, self.batch_max_bytes)
    }

    /// The Redis endpoint `--redis-url` names (one server, the Sentinels' primary, or a
    /// Cluster), trusting `--redis-ca-file` when given.
    pub fn redis_client(&self) -> Result<crate::broker::connection::RedisEndpoint, ConfigError> {
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
