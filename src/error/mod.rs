//! The library's error type, and the one place where failures are classified.
//!
//! Every failure has a [`Reason`] (unreachable, timeout, out of memory, read-only replica,
//! authentication, table missing, ...) and an [`ErrorClass`] (what to do with the rows it
//! concerns). Logs, `/readyz`, `jobrelay check` and the relay's retry decisions all read them
//! from here, so they cannot disagree.

use std::time::Duration;

/// Everything the jobrelay library can fail with.
///
/// [`Error::class`] tells what a caller should do about it: retry the whole batch later
/// (transient), count an attempt against the one job (per-job), or give the job up (permanent).
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
        /// The layout (`--layout`).
        layout: crate::job::layout::LayoutKind,
        /// Why.
        reason: crate::job::layout::Unfit,
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
    /// Transient for the relay: the transaction rolls back and nothing is lost.
    #[error("postgres: {0}")]
    Database(#[source] sqlx::Error),

    /// `--table` names an existing table of another shape than an outbox's (an application's
    /// own table, say): nothing was changed. A configuration error, not a row's.
    #[error("{0}")]
    NotAnOutbox(UnfitOutbox),

    /// Applying the embedded migrations failed.
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
    /// accepts it. Transient: it pushes again once the policy is `noeviction`.
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
        /// What was being waited for (`redis push`, `postgres claim`, ...).
        what: &'static str,
        /// The bound that was exceeded.
        after: Duration,
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
}

impl ErrorClass {
    /// The label used in `jobrelay_job_failures_total{kind}`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Transient => "transient",
            ErrorClass::PerJob => "per_job",
            ErrorClass::Permanent => "permanent",
        }
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

/// Why a dependency failed, named for operators (logs, `/readyz`, `jobrelay check`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The connection was reset or closed; the host is down or unreachable.
    Unreachable,
    /// The connection was refused: nothing listens at that address and port.
    Refused,
    /// No answer within the bound (a hung or overloaded server, a network partition).
    Timeout,
    /// The server refuses writes for lack of memory (Redis `OOM` at `maxmemory`, Postgres
    /// `out_of_memory`).
    OutOfMemory,
    /// Postgres cannot write for lack of disk space (`disk_full`, `53100`: "could not extend
    /// file ...: No space left on device"). A read, or a small write that fits a page with
    /// room left, still succeeds: only the relay's own writes tell when it ends.
    DiskFull,
    /// Another session holds a lock on the outbox that the relay's claims wait for (a
    /// migration's `LOCK TABLE`, `ALTER TABLE`, a `VACUUM FULL`), or a statement gave up
    /// waiting for one (`lock_not_available`, `55P03`).
    LockWait,
    /// A read-only replica (Redis `READONLY`/`MASTERDOWN`, Postgres hot standby).
    ReadOnly,
    /// The credentials were refused.
    Authentication,
    /// The user lacks a permission (Redis `NOPERM`, Postgres `insufficient_privilege`).
    PermissionDenied,
    /// The outbox table, its schema or the database does not exist: run `jobrelay migrate`.
    TableMissing,
    /// The server is starting (Redis `LOADING`, Postgres `cannot_connect_now`).
    Loading,
    /// The server refuses new connections: Postgres `too_many_connections` (53300:
    /// `max_connections`, or a role's or database's `CONNECTION LIMIT`), PgBouncer's
    /// `max_client_conn`.
    TooManyConnections,
    /// A Redis Cluster node answered about slots (`MOVED`, `ASK`, `CROSSSLOT`, a script's
    /// "non local key", `TRYAGAIN`, `CLUSTERDOWN`): the URL points at one node of a cluster, or
    /// the cluster is resharding or down.
    Cluster,
    /// Redis does not know a command the relay needs (`unknown command`): the URL points at a
    /// sentinel, a proxy without scripts, or the command was renamed.
    UnknownCommand,
    /// Redis forgot the enqueue script right after loading it (`NOSCRIPT` again): a proxy that
    /// spreads requests over several servers, or scripts flushed in a loop.
    ScriptMissing,
    /// Too few replicas took the writes: Redis `NOREPLICAS` (`min-replicas-to-write`), or
    /// `WAIT` fell short of `--redis-wait-replicas`.
    ReplicasBehind,
    /// Redis's `maxmemory-policy` evicts keys (queued jobs, dedup markers): refused unless
    /// `--redis-allow-eviction`.
    EvictionPolicy,
    /// The server is busy or cannot take writes for another reason of its own (Redis `BUSY`,
    /// `MISCONF`, `max number of clients reached`).
    Unavailable,
    /// Anything else: an answer about the request itself, not about the server's state.
    Other,
}

impl Reason {
    /// Every reason: the closed set of names a `reason` (log field, `/readyz`, `jobrelay
    /// check`, the `reason` label of `jobrelay_job_failures_total`) can take.
    pub const ALL: [Reason; 19] = [
        Reason::Unreachable,
        Reason::Refused,
        Reason::Timeout,
        Reason::OutOfMemory,
        Reason::DiskFull,
        Reason::LockWait,
        Reason::ReadOnly,
        Reason::Authentication,
        Reason::PermissionDenied,
        Reason::TableMissing,
        Reason::Loading,
        Reason::TooManyConnections,
        Reason::Cluster,
        Reason::UnknownCommand,
        Reason::ScriptMissing,
        Reason::ReplicasBehind,
        Reason::EvictionPolicy,
        Reason::Unavailable,
        Reason::Other,
    ];

    /// The name used in logs (`reason` field), `/readyz` and `jobrelay check`.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Unreachable => "unreachable",
            Reason::Refused => "refused",
            Reason::Timeout => "timeout",
            Reason::OutOfMemory => "out of memory",
            Reason::DiskFull => "disk full",
            Reason::LockWait => "lock wait",
            Reason::ReadOnly => "read-only replica",
            Reason::Authentication => "authentication failed",
            Reason::PermissionDenied => "permission denied",
            Reason::TableMissing => "table or schema missing",
            Reason::Loading => "loading",
            Reason::TooManyConnections => "too many connections",
            Reason::Cluster => "cluster",
            Reason::UnknownCommand => "unknown command",
            Reason::ScriptMissing => "script missing",
            Reason::ReplicasBehind => "replicas behind",
            Reason::EvictionPolicy => "eviction policy",
            Reason::Unavailable => "unavailable",
            Reason::Other => "error",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
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
            Error::Unacknowledged { .. }
            | Error::Redis(_)
            | Error::Database(_)
            | Error::Migrate(_)
            | Error::NotAnOutbox(_)
            | Error::NotWritable { .. }
            | Error::EvictionPolicy { .. }
            | Error::ReplicasBehind { .. }
            | Error::Timeout { .. }
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
            Error::Unacknowledged { reason, .. } | Error::NotWritable { reason, .. } => *reason,
            Error::EvictionPolicy { .. } => Reason::EvictionPolicy,
            Error::ReplicasBehind { .. } => Reason::ReplicasBehind,
            _ => Reason::Other,
        }
    }

    /// The dependency this error came from, if any.
    pub fn dependency(&self) -> Option<Dependency> {
        match self {
            Error::Database(_) | Error::Migrate(_) | Error::Locked(_) => Some(Dependency::Postgres),
            Error::Redis(_)
            | Error::Refused { .. }
            | Error::Unacknowledged { .. }
            | Error::EvictionPolicy { .. }
            | Error::ReplicasBehind { .. } => Some(Dependency::Redis),
            Error::NotWritable { dependency, .. } => Some(*dependency),
            Error::Timeout { what, .. } if what.starts_with("postgres") => {
                Some(Dependency::Postgres)
            }
            Error::Timeout { what, .. } if what.starts_with("redis") => Some(Dependency::Redis),
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

/// Why a Redis request failed. [`Reason::Other`] means Redis answered about the request
/// itself (e.g. `WRONGTYPE`, a script error), not about its own state or the endpoint.
///
/// Errors raised inside the enqueue script keep their code (`OOM ... script: <sha>, on
/// @user_script:1.`), except a few that Redis reports as `ERR` with a message: an ACL denial
/// ("The user executing the script can't run this command"), a cluster node's "non local
/// key", an unknown command. Those are told by their text, so that no endpoint failure is
/// ever taken for the job's.
pub fn redis_reason(e: &redis::RedisError) -> Reason {
    use redis::ErrorKind as K;
    if e.is_timeout() {
        return Reason::Timeout;
    }
    if e.is_connection_refusal() {
        return Reason::Refused;
    }
    if e.is_connection_dropped() || e.is_io_error() {
        return Reason::Unreachable;
    }
    match e.code() {
        Some("OOM") => return Reason::OutOfMemory,
        Some("READONLY" | "MASTERDOWN") => return Reason::ReadOnly,
        Some("NOAUTH" | "WRONGPASS") => return Reason::Authentication,
        Some("NOPERM") => return Reason::PermissionDenied,
        Some("LOADING") => return Reason::Loading,
        Some("NOREPLICAS") => return Reason::ReplicasBehind,
        Some("MOVED" | "ASK" | "CROSSSLOT" | "TRYAGAIN" | "CLUSTERDOWN") => return Reason::Cluster,
        Some("NOSCRIPT") => return Reason::ScriptMissing,
        Some("BUSY" | "MISCONF") => return Reason::Unavailable,
        _ => {}
    }
    match e.kind() {
        K::ReadOnly | K::MasterDown => return Reason::ReadOnly,
        K::BusyLoadingError => return Reason::Loading,
        K::AuthenticationFailed => return Reason::Authentication,
        K::Moved
        | K::Ask
        | K::CrossSlot
        | K::TryAgain
        | K::ClusterDown
        | K::ClusterConnectionNotFound => return Reason::Cluster,
        K::NoScriptError => return Reason::ScriptMissing,
        // The sentinels could not name a primary: none reachable, or none for that name.
        K::IoError
        | K::MasterNameNotFoundBySentinel
        | K::NoValidReplicasFoundBySentinel
        | K::EmptySentinelList => return Reason::Unreachable,
        _ => {}
    }
    reason_in_message(&e.to_string())
}

/// The endpoint failures Redis reports as a plain `ERR` (also from inside a script), by their
/// text; [`Reason::Other`] for the rest.
fn reason_in_message(message: &str) -> Reason {
    let m = message.to_ascii_lowercase();
    let has = |needles: &[&str]| needles.iter().any(|n| m.contains(n));
    if has(&[
        "can't run this command",
        "no permissions to",
        "acl failure",
        "noperm",
    ]) {
        Reason::PermissionDenied
    } else if has(&[
        "non local key",
        "hash to the same slot",
        "cluster support disabled",
        "clusterdown",
    ]) {
        Reason::Cluster
    } else if has(&["unknown command", "unknown redis command"]) {
        Reason::UnknownCommand
    } else if has(&[
        "without any password configured",
        "no password is set",
        "invalid password",
        "wrongpass",
        "noauth",
    ]) {
        Reason::Authentication
    } else if has(&["max number of clients reached"]) {
        Reason::Unavailable
    } else {
        Reason::Other
    }
}

/// Why a Postgres request failed, from its SQLSTATE or the kind of client error.
pub fn postgres_reason(e: &sqlx::Error) -> Reason {
    match e {
        sqlx::Error::Database(db) => match db.code().as_deref() {
            Some("28P01" | "28000") => Reason::Authentication,
            Some("42501") => Reason::PermissionDenied,
            // undefined_table, invalid_schema_name, invalid_catalog_name (no such database)
            Some("42P01" | "3F000" | "3D000") => Reason::TableMissing,
            Some("25006") => Reason::ReadOnly,
            Some("53200") => Reason::OutOfMemory,
            Some("53100") => Reason::DiskFull,
            // lock_not_available: a lock_timeout (or NOWAIT) gave up on a held lock
            Some("55P03") => Reason::LockWait,
            // query_canceled: statement_timeout
            Some("57014") => Reason::Timeout,
            Some("57P03") => Reason::Loading,
            Some("53300") => Reason::TooManyConnections,
            // PgBouncer's own refusal (max_client_conn) comes as a protocol violation.
            Some("08P01") if db.message().starts_with("no more connections allowed") => {
                Reason::TooManyConnections
            }
            Some(c) if c.starts_with("08") || c.starts_with("57P") => Reason::Unreachable,
            Some(c) if c.starts_with("53") => Reason::Unavailable,
            _ => Reason::Other,
        },
        sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => Reason::Timeout,
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => Reason::Unreachable,
        sqlx::Error::PoolTimedOut => Reason::Timeout,
        _ => Reason::Other,
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
