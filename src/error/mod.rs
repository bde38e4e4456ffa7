//! The library's error type, and the one place where failures are classified.
//!
//! Every failure has a [`Reason`] (unreachable, timeout, out of memory, read-only replica,
//! authentication, table missing, ...) and an [`ErrorClass`] (what to do with the rows it
//! concerns). Logs, `/readyz`, `jobrelay check` and the relay's retry decisions all read them
//! from here, so they cannot disagree.

use std::time::Duration;

mod classify;
mod reason;
mod unfit;

pub use self::classify::{postgres_reason, redis_reason};
pub use self::reason::Reason;
pub use self::unfit::Unfit;

/// Everything the jobrelay library can fail with.
///
/// [`Error::class`] tells what a caller should do about it: retry the whole batch later
/// (transient), count an attempt against the one job (per-job), give the job up (permanent),
/// or have an operator change a configuration (config).
/// [`Error::reason`] names the failure for operators.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The job cannot become a valid job: a field is empty, too long, malformed, or out of the
    /// range the wire format carries. Permanent: retrying the same input fails the same way.
    #[error("invalid job: {field}: {reason}")]
    InvalidJob {
        /// The offending field (`queue`, `job_type`, `headers`, `run_at`, ...).
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },

    /// The job could not be marshalled to protobuf. Permanent.
    #[error("cannot marshal job {uuid} to protobuf")]
    Marshal {
        /// The job's uuid.
        uuid: uuid::Uuid,
        /// The encoder's error.
        #[source]
        source: prost::EncodeError,
    },

    /// The job cannot be written in the relay's layout (e.g. a Sidekiq job whose payload is
    /// not a JSON array, a flow row for a runner without flows). Permanent.
    #[error("job {uuid} does not fit the {layout} layout: {reason}")]
    Unfit {
        /// The job's uuid.
        uuid: uuid::Uuid,
        /// The layout's name (`--layout`).
        layout: &'static str,
        /// Why.
        reason: Unfit,
    },

    /// The marshalled job is larger than `--max-job-size`. Permanent.
    #[error("job too large: {size} bytes marshalled, over --max-job-size ({max} bytes)")]
    TooLarge {
        /// The job's uuid.
        uuid: uuid::Uuid,
        /// Its marshalled size in bytes.
        size: usize,
        /// The limit.
        max: usize,
    },

    /// Redis refused this one job: the enqueue script refused it (for example `WRONGTYPE`: a
    /// key it must write holds another type), or Redis closed the connection on the request
    /// that carried it alone (e.g. larger than `proto-max-bulk-len`). Nothing of the job was
    /// written. Per-job: retrying may succeed once an operator fixes the key or the limit.
    #[error("redis refused job {uuid}: {message}")]
    Refused {
        /// The job's uuid.
        uuid: uuid::Uuid,
        /// Redis's or the script's message, e.g. `WRONGTYPE key app:queue:x holds string`.
        message: String,
    },

    /// This job was not sent: an earlier job of its ordering key in the same enqueue was
    /// refused or failed, and a job never overtakes an earlier one of its key
    /// (docs/guarantees.md#per-key-order). Nothing of it was written; its row is handed back
    /// as it was (no attempt counted) and waits behind that earlier row.
    #[error("job {uuid} held: job {behind} of its ordering key {key:?} did not go first")]
    Held {
        /// The job's uuid.
        uuid: uuid::Uuid,
        /// Its ordering key.
        key: String,
        /// The earlier job of the key that did not go.
        behind: uuid::Uuid,
    },

    /// The script call that carried this job failed, or was not made because an earlier call
    /// of the same batch failed. Jobs of earlier calls were acknowledged. Transient: whether
    /// this job landed is unknown (it did not if the reason is an answer such as OOM); a retry
    /// is safe, the dedup marker absorbs what did land.
    #[error("redis did not acknowledge job {uuid}: {reason}: {message}")]
    Unacknowledged {
        /// The job's uuid.
        uuid: uuid::Uuid,
        /// Why the call failed.
        reason: Reason,
        /// The call's error.
        message: String,
    },

    /// Redis could not be reached or failed the whole call (connection refused or reset,
    /// READONLY, LOADING, OOM, ...). Transient: nothing is known to have been written for sure,
    /// so the batch is retried and the dedup marker absorbs what did land. When
    /// [`Error::reason`] is [`Reason::Other`], Redis answered about the request itself, and
    /// the relay pushes its jobs one by one to find the one at fault.
    #[error("redis: {0}")]
    Redis(#[source] redis::RedisError),

    /// Postgres failed (connection lost, timeout, serialization failure, missing table, ...).
    /// Transient for the relay: the transaction rolls back and nothing is lost. Displayed as
    /// `postgres: <what Postgres said>`, without sqlx's own prefix ([`postgres_message`]).
    #[error("postgres: {}", postgres_message(.0))]
    Database(#[source] sqlx::Error),

    /// The relay did not try to connect to Postgres: its last attempt failed, and the next one
    /// is not due yet ([`crate::db::ConnectGate`]: one attempt per step of a backoff while
    /// Postgres refuses connections). Transient; [`Error::reason`] is the last attempt's.
    #[error("postgres: {message} (next connection attempt in {})", humantime::format_duration(Duration::from_millis(retry_in.as_millis() as u64)))]
    ConnectBackoff {
        /// Why the last attempt failed.
        reason: Reason,
        /// What it said, without the `postgres: ` prefix.
        message: String,
        /// How long until the next attempt.
        retry_in: Duration,
    },

    /// `--table` names an existing table of another shape than an outbox's (an application's
    /// own table, say): nothing was changed. A configuration error ([`ErrorClass::Config`]),
    /// not a row's.
    #[error("{0}")]
    NotAnOutbox(UnfitOutbox),

    /// Applying the embedded migrations failed: transient when Postgres failed a statement;
    /// a configuration error ([`ErrorClass::Config`]) when the database's migration history
    /// disagrees with this binary's (a migration applied that this binary does not have, or
    /// has in another version; one left partly applied).
    #[error("migration failed: {0}")]
    Migrate(#[source] sqlx::migrate::MigrateError),

    /// A dependency answers but does not take the relay's writes (a Postgres hot standby or a
    /// read-only session, a Redis whose `ROLE` is not master). Transient.
    #[error("{} does not take writes ({reason}): {detail}", dependency.as_str())]
    NotWritable {
        /// Which one.
        dependency: Dependency,
        /// Why, e.g. [`Reason::ReadOnly`].
        reason: Reason,
        /// What it said.
        detail: String,
    },

    /// Redis's `maxmemory-policy` lets it evict keys: queued jobs and dedup markers could
    /// vanish without a trace. The relay does not push there unless `--redis-allow-eviction`
    /// accepts it. A configuration error ([`ErrorClass::Config`]): the rows are kept, and it
    /// pushes again once the policy is `noeviction`.
    #[error(
        "maxmemory-policy is {policy}: Redis may evict queued jobs and dedup markers; set it to \
         noeviction (CONFIG SET maxmemory-policy noeviction, and in redis.conf or the provider's \
         parameter group), or pass --redis-allow-eviction to accept that"
    )]
    EvictionPolicy {
        /// The policy Redis reported, e.g. `allkeys-lru`.
        policy: String,
    },

    /// `--redis-wait-replicas`: fewer replicas than asked acknowledged the writes within the
    /// wait timeout (`WAIT`). The jobs are on the primary but could be lost with it, so their
    /// rows are kept. Transient.
    #[error(
        "{acknowledged} of {wanted} replicas acknowledged the writes within {} (WAIT, --redis-wait-replicas)",
        humantime::format_duration(*within)
    )]
    ReplicasBehind {
        /// `--redis-wait-replicas`.
        wanted: u32,
        /// How many acknowledged.
        acknowledged: i64,
        /// The wait's timeout.
        within: Duration,
    },

    /// An operation did not finish within its bound. Transient.
    #[error("{what} timed out after {}", humantime::format_duration(*after))]
    Timeout {
        /// Which dependency did not answer in time.
        dependency: Dependency,
        /// What was being waited for (`redis push`, `postgres claim`, ...).
        what: &'static str,
        /// The bound that was exceeded.
        after: Duration,
    },

    /// A component broke its contract: Redis answered a call in a shape the enqueue algorithm
    /// never gets back (an unknown reply, the wrong number of results), or a sink answered the
    /// wrong number of results. Nothing of the batch counts as acknowledged: it rolls back, and
    /// a Redis-side breach has its jobs pushed one by one ([`Reason::Other`]). Transient.
    #[error("{what}: {detail}")]
    Contract {
        /// Whose answer broke it, if a dependency's.
        dependency: Option<Dependency>,
        /// What was wrong.
        what: &'static str,
        /// What came instead.
        detail: String,
    },

    /// Another Postgres session holds a lock on the outbox (or its dead-letter table) in a
    /// mode that blocks the relay's claims, e.g. a migration's `LOCK TABLE pending_jobs IN
    /// ACCESS EXCLUSIVE MODE`. Transient: the claims wait, then go on once it is released.
    #[error("{0}")]
    Locked(LockHolder),
}

/// Who holds a lock that blocks the relay's claims (from `pg_locks` and `pg_stat_activity`).
#[derive(Debug, Clone, PartialEq)]
pub struct LockHolder {
    /// The locked table.
    pub table: String,
    /// The holder's backend pid; `None` for a prepared transaction.
    pub pid: Option<i32>,
    /// The lock mode, e.g. `AccessExclusiveLock`.
    pub mode: String,
    /// How long the holder's transaction has been open, in seconds (when visible to the
    /// relay's role: another role's sessions need `pg_read_all_stats`).
    pub seconds: Option<f64>,
    /// The holder's state (`idle in transaction`, `active`, ...), when visible.
    pub state: Option<String>,
}

impl std::fmt::Display for LockHolder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} locked by ", self.table)?;
        match self.pid {
            Some(pid) => write!(f, "pid {pid}")?,
            None => f.write_str("a prepared transaction")?,
        }
        write!(f, " ({}", self.mode)?;
        if let Some(s) = self.seconds {
            write!(f, ", its transaction open for {s:.0}s")?;
        }
        if let Some(state) = &self.state {
            write!(f, ", {state}")?;
        }
        f.write_str(")")
    }
}

/// How a failure affects the rows it concerns (docs/guarantees.md#failure-classes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// A dependency is unavailable: keep the rows and their `attempts`, back off, retry.
    Transient,
    /// This job was refused: `attempts + 1`, retry later, dead-letter at `--max-attempts`.
    PerJob,
    /// This row can never become a valid job: dead-letter at once.
    Permanent,
    /// A configuration is wrong, jobrelay's or a dependency's, and only an operator's change
    /// fixes it (an existing `--table` of another shape, a Redis that may evict keys). The
    /// rows are kept with their `attempts`, as for a transient failure, and the relay checks
    /// again, so that the fix takes effect without a restart.
    Config,
}

impl ErrorClass {
    /// Every class, in the order of the labels' documentation.
    pub const ALL: [ErrorClass; 4] = [
        ErrorClass::Transient,
        ErrorClass::PerJob,
        ErrorClass::Permanent,
        ErrorClass::Config,
    ];

    /// This class's position in [`ErrorClass::ALL`] (and in report arrays).
    pub fn index(self) -> usize {
        self as usize
    }

    /// The label used in `jobrelay_job_failures_total{kind}`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Transient => "transient",
            ErrorClass::PerJob => "per_job",
            ErrorClass::Permanent => "permanent",
            ErrorClass::Config => "config",
        }
    }

    /// Whether the rows a failure of this class concerns are kept as they were (`attempts`
    /// unchanged): transient and configuration errors.
    pub fn keeps_rows(self) -> bool {
        matches!(self, ErrorClass::Transient | ErrorClass::Config)
    }
}

/// A dependency of the relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dependency {
    /// The outbox database.
    Postgres,
    /// The job store.
    Redis,
}

impl Dependency {
    /// The label used in logs and `jobrelay_up{dependency}`.
    pub fn as_str(self) -> &'static str {
        match self {
            Dependency::Postgres => "postgres",
            Dependency::Redis => "redis",
        }
    }
}

impl Error {
    /// The class of this error; see [`ErrorClass`].
    pub fn class(&self) -> ErrorClass {
        match self {
            Error::InvalidJob { .. }
            | Error::Marshal { .. }
            | Error::Unfit { .. }
            | Error::TooLarge { .. } => ErrorClass::Permanent,
            Error::Refused { .. } => ErrorClass::PerJob,
            Error::NotAnOutbox(_) | Error::EvictionPolicy { .. } => ErrorClass::Config,
            Error::Migrate(e) => match e {
                sqlx::migrate::MigrateError::Execute(_)
                | sqlx::migrate::MigrateError::ExecuteMigration(..) => ErrorClass::Transient,
                _ => ErrorClass::Config,
            },
            Error::Unacknowledged { .. }
            | Error::Held { .. }
            | Error::Redis(_)
            | Error::Database(_)
            | Error::ConnectBackoff { .. }
            | Error::NotWritable { .. }
            | Error::ReplicasBehind { .. }
            | Error::Timeout { .. }
            | Error::Contract { .. }
            | Error::Locked(_) => ErrorClass::Transient,
        }
    }

    /// Why it failed; [`Reason::Other`] for errors about a job rather than a dependency.
    pub fn reason(&self) -> Reason {
        match self {
            Error::Redis(e) => redis_reason(e),
            Error::Database(e) => postgres_reason(e),
            Error::Migrate(sqlx::migrate::MigrateError::Execute(e)) => postgres_reason(e),
            Error::Timeout { .. } => Reason::Timeout,
            Error::Locked(_) => Reason::LockWait,
            Error::Unacknowledged { reason, .. }
            | Error::NotWritable { reason, .. }
            | Error::ConnectBackoff { reason, .. } => *reason,
            Error::EvictionPolicy { .. } => Reason::EvictionPolicy,
            Error::ReplicasBehind { .. } => Reason::ReplicasBehind,
            _ => Reason::Other,
        }
    }

    /// The dependency this error came from, if any.
    pub fn dependency(&self) -> Option<Dependency> {
        match self {
            Error::Database(_)
            | Error::ConnectBackoff { .. }
            | Error::Migrate(_)
            | Error::Locked(_) => Some(Dependency::Postgres),
            Error::Redis(_)
            | Error::Refused { .. }
            | Error::Unacknowledged { .. }
            | Error::EvictionPolicy { .. }
            | Error::ReplicasBehind { .. } => Some(Dependency::Redis),
            Error::NotWritable { dependency, .. } => Some(*dependency),
            Error::Timeout { dependency, .. } => Some(*dependency),
            Error::Contract { dependency, .. } => *dependency,
            _ => None,
        }
    }

    pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidJob {
            field,
            reason: reason.into(),
        }
    }
}

impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Self {
        Error::Database(e)
    }
}

impl From<redis::RedisError> for Error {
    fn from(e: redis::RedisError) -> Self {
        Error::Redis(e)
    }
}

impl From<sqlx::migrate::MigrateError> for Error {
    fn from(e: sqlx::migrate::MigrateError) -> Self {
        Error::Migrate(e)
    }
}

/// `fut`, bounded by `after`: its own error, or [`Error::Timeout`] naming `dependency` and
/// `what` when it does not finish in time.
pub(crate) async fn within<T, E: Into<Error>>(
    dependency: Dependency,
    what: &'static str,
    after: std::time::Duration,
    fut: impl std::future::Future<Output = std::result::Result<T, E>>,
) -> Result<T> {
    match tokio::time::timeout(after, fut).await {
        Ok(r) => r.map_err(Into::into),
        Err(_) => Err(Error::Timeout {
            dependency,
            what,
            after,
        }),
    }
}

/// What Postgres (or the connection to it) said, without sqlx's wrapping: a server's error is
/// its message (`sorry, too many clients already`, not `error returned from database: sorry,
/// ...`). A connection closed before the server answered the TLS request (a proxy whose
/// server went away, a server going down) says so in words: sqlx reads no byte there and
/// reports the zero it did not read (`unexpected response from SSLRequest: 0x00`).
pub fn postgres_message(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Database(db) => db.message().to_owned(),
        sqlx::Error::Protocol(p) if p.starts_with("unexpected response from SSLRequest: 0x00") => {
            "the connection was closed before the server answered (a proxy with no server \
             behind it, or a server going down)"
                .to_owned()
        }
        sqlx::Error::Protocol(p) if p.starts_with("unexpected response from SSLRequest") => {
            format!("the server's answer to the TLS request is not Postgres's ({p})")
        }
        other => other.to_string(),
    }
}

/// `message` without a leading dependency name (`postgres: `, `redis: `, and `postgres ` of a
/// timeout's `postgres probe timed out ...`): a line that names the dependency and the reason
/// first (`postgres: too many connections: ...`) says it once.
pub fn without_dependency(message: &str) -> String {
    let mut m = message;
    while let Some(rest) = ["postgres: ", "redis: ", "postgres ", "redis "]
        .iter()
        .find_map(|p| m.strip_prefix(p))
    {
        m = rest;
    }
    m.to_owned()
}

/// `Result` with the library's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An existing table that cannot serve as the outbox (or its dead-letter table) it is named
/// for: [`crate::db::unfit_outbox`]'s finding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnfitOutbox {
    /// The outbox as named by `--table` (`orders`, `billing.jobs`).
    pub outbox: String,
    /// The table that does not fit: the outbox itself or its `_dead` table.
    pub table: String,
    /// What is wrong with it, e.g. `missing columns uuid uuid, queue text`,
    /// `payload is text, not bytea`, `it is a view, not a table`.
    pub problems: Vec<String>,
}

/// One line: `--table orders: orders exists and is not a jobrelay outbox (docs/schema.md): missing
/// columns uuid uuid, ...`.
impl std::fmt::Display for UnfitOutbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let role = if self.table == self.outbox {
            "a jobrelay outbox"
        } else {
            "a jobrelay dead-letter table"
        };
        write!(
            f,
            "--table {}: {} exists and is not {role} (docs/schema.md): {}",
            self.outbox,
            self.table,
            self.problems.join("; ")
        )
    }
}

#[cfg(test)]
mod tests;
