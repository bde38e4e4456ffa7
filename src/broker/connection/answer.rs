//! What an error or an answer says about the connection: broken, a replica's, timed out.

use redis::{ErrorKind, RedisError, Value};

use crate::error::{redis_reason, Reason};

/// Whether `e` says the connection itself broke (reset, refused, closed, or a reconnect begun
/// earlier that failed), as opposed to a timeout or an answer from Redis: its
/// [`crate::error::redis_reason`] is [`Reason::Unreachable`] or [`Reason::Refused`].
///
/// After such an error `ConnectionManager` starts a new connection; but a reconnect begun
/// during an outage that failed is handed, as this error, to the first request made after
/// Redis came back. One more try tells that stale connection from an outage that goes on.
pub fn is_broken_connection(e: &redis::RedisError) -> bool {
    matches!(redis_reason(e), Reason::Unreachable | Reason::Refused)
}

/// The error an answer is, if it is one.
pub(super) fn server_error(v: &Value) -> Option<RedisError> {
    match v {
        Value::ServerError(e) => Some(e.clone().into()),
        _ => None,
    }
}

/// Whether `e` is an answer that only a replica gives (`READONLY`, `MASTERDOWN`): the request
/// was refused before anything was written.
pub(super) fn is_replica_answer(e: &RedisError) -> bool {
    matches!(e.code(), Some("READONLY" | "MASTERDOWN"))
        || matches!(e.kind(), ErrorKind::ReadOnly | ErrorKind::MasterDown)
}

/// An I/O error that says `what` got no answer in time.
pub(super) fn timed_out(what: &str) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("{what}: no answer in time"),
    ))
}
