//! Naming a Redis or Postgres failure: the [`Reason`] its error carries.

use super::Reason;

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
