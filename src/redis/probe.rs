//! Whether Redis takes writes, as the relay needs it to.

use crate::redis::connection::RedisConnection;

/// Lifetime of the probe's key.
pub(crate) const PROBE_KEY_TTL_MS: u64 = 10_000;

/// Whether Redis takes the relay's writes: a `SET` with a short TTL succeeds (refused with
/// `OOM` at `maxmemory`, `READONLY` on a replica, `LOADING`, `MASTERDOWN`, `NOPERM`, ...)
/// and `ROLE` says master (a replica with `replica-read-only no` takes writes it will lose).
pub(crate) async fn writable(con: &mut RedisConnection, key: &str) -> redis::RedisResult<()> {
    let ((), role): ((), Vec<redis::Value>) = redis::pipe()
        .cmd("SET")
        .arg(key)
        .arg(std::process::id())
        .arg("PX")
        .arg(PROBE_KEY_TTL_MS)
        .cmd("ROLE")
        .query_async(con)
        .await?;
    let role = role
        .first()
        .and_then(|v| redis::from_redis_value::<String>(v).ok());
    match role.as_deref() {
        Some("master") => Ok(()),
        other => Err(redis::RedisError::from((
            redis::ErrorKind::ReadOnly,
            "not a master: writes are refused",
            format!("ROLE answered {other:?}"),
        ))),
    }
}
