//! [`Reason`]: each failure's own name, the one logs, `/readyz`, `jobrelay check` and the
//! failure counter's `reason` label use.

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

    /// This reason's position in [`Reason::ALL`] (and in report arrays).
    pub fn index(self) -> usize {
        self as usize
    }

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
