//! The relay's Postgres connections: their settings, and how `--pg-max-connections` is spent.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use sqlx::ConnectOptions;

use super::error::ConfigError;
use super::secret_url::SecretUrl;
use super::source::Origin;
use crate::telemetry::redact;

/// How the relay's Postgres connections are spent ([`Config::pg_footprint`](super::Config::pg_footprint),
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

pub(super) fn url_options(url: &SecretUrl, flag: &str) -> Result<PgConnectOptions, ConfigError> {
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

pub(super) fn check_database_url(url: &str, origin: &Origin) -> Result<(), ConfigError> {
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
