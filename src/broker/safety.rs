//! Whether Redis takes writes as the relay needs it to: as a master, without evicting keys,
//! with the replicas `--redis-wait-replicas` asks for (docs/guarantees.md#redis).
//!
//! Every check that needs a command a managed Redis or an ACL may deny (`ROLE`, `CONFIG GET`,
//! `INFO` are all in `@dangerous`) treats the denial as "cannot tell", never as "not ready":
//! the usual ACL `~ns:* +@all -@dangerous` relays fine, so it must be ready too.

use std::time::Duration;

use redis::aio::ConnectionLike;

use crate::error::{redis_reason, Error, Reason, Result};

/// Lifetime of the probe's key.
pub(crate) const PROBE_KEY_TTL_MS: u64 = 10_000;

/// What the relay asks of Redis beyond taking writes: `--redis-allow-eviction`,
/// `--redis-wait-replicas`, `--redis-wait-timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedisSafety {
    /// Push even when `maxmemory-policy` lets Redis evict keys (`--redis-allow-eviction`).
    pub allow_eviction: bool,
    /// Replicas that must acknowledge a push's writes (`WAIT`) before its rows are deleted;
    /// 0: none.
    pub wait_replicas: u32,
    /// How long `WAIT` waits for them.
    pub wait_timeout: Duration,
}

impl Default for RedisSafety {
    /// The daemon's defaults: eviction refused, no replicas waited for, 1 s.
    fn default() -> Self {
        RedisSafety {
            allow_eviction: false,
            wait_replicas: 0,
            wait_timeout: crate::defaults::DEFAULT_REDIS_WAIT_TIMEOUT,
        }
    }
}

/// What Redis says of its `maxmemory-policy`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Eviction {
    /// `noeviction`: at `maxmemory` Redis refuses writes (`OOM`) instead of dropping keys.
    Never,
    /// Another policy (`allkeys-lru`, `volatile-ttl`, ...): keys may be evicted.
    Evicts(String),
    /// Neither `CONFIG GET` nor `INFO` is allowed (managed Redis, ACLs): why not.
    CannotTell(String),
}

impl Eviction {
    /// How `jobrelay check` and the logs describe it.
    pub fn describe(&self) -> String {
        match self {
            Eviction::Never => "maxmemory-policy noeviction".to_owned(),
            Eviction::Evicts(p) => format!("maxmemory-policy {p}"),
            Eviction::CannotTell(why) => {
                format!("cannot tell the maxmemory-policy ({why}): make sure it is noeviction")
            }
        }
    }

    /// `Err` when the policy evicts and `allow` does not accept it.
    pub fn refused(&self, allow: bool) -> Result<()> {
        match self {
            Eviction::Evicts(policy) if !allow => Err(Error::EvictionPolicy {
                policy: policy.clone(),
            }),
            _ => Ok(()),
        }
    }
}

/// Logs once per process what the relay found of the policy when it is not plain
/// `noeviction`: that it cannot tell, or that an evicting policy is accepted because `allow`
/// (`--redis-allow-eviction`) says so. An evicting policy that is not allowed is refused, not
/// noted here: the refusal is logged as a Redis episode (reason `eviction policy`).
pub(crate) fn note_once(eviction: &Eviction, allow: bool) {
    use std::sync::atomic::{AtomicBool, Ordering};
    static CANNOT_TELL: AtomicBool = AtomicBool::new(false);
    static ACCEPTED: AtomicBool = AtomicBool::new(false);
    match eviction {
        Eviction::Never => {}
        Eviction::CannotTell(why) => {
            if !CANNOT_TELL.swap(true, Ordering::AcqRel) {
                tracing::warn!(why = %why,
                    "cannot tell redis's maxmemory-policy; relaying as if it were noeviction (make sure it is)");
            }
        }
        Eviction::Evicts(_) if !allow => {}
        Eviction::Evicts(policy) => {
            if !ACCEPTED.swap(true, Ordering::AcqRel) {
                tracing::warn!(policy = %policy,
                    "redis may evict queued jobs and dedup markers (maxmemory-policy {policy}); relaying anyway, as --redis-allow-eviction asks");
            }
        }
    }
}

/// Whether a Redis answer to a query the relay can do without is a denial ("cannot tell"):
/// an ACL's `NOPERM`, a renamed or unknown command, a proxy's refusal.
fn denied(e: &redis::RedisError) -> bool {
    matches!(
        redis_reason(e),
        Reason::PermissionDenied | Reason::UnknownCommand | Reason::Other
    )
}

/// Redis's `maxmemory-policy`: from `CONFIG GET`, or where that is denied from `INFO memory`
/// (managed Redis usually allows the one or the other). `Err` only when Redis could not be
/// asked at all (connection, timeout).
pub async fn eviction_policy<C: ConnectionLike + Send>(con: &mut C) -> Result<Eviction> {
    let config: redis::RedisResult<std::collections::HashMap<String, String>> =
        redis::cmd("CONFIG")
            .arg("GET")
            .arg("maxmemory-policy")
            .query_async(con)
            .await;
    let config_denied = match config {
        Ok(found) => match found.get("maxmemory-policy") {
            Some(policy) => return Ok(of_policy(policy)),
            None => "CONFIG GET maxmemory-policy answered nothing".to_owned(),
        },
        Err(e) if denied(&e) => format!("CONFIG GET: {}", first_words(&e)),
        Err(e) => return Err(Error::Redis(e)),
    };
    let info: redis::RedisResult<String> = redis::cmd("INFO").arg("memory").query_async(con).await;
    match info {
        Ok(text) => Ok(text
            .lines()
            .find_map(|l| l.trim().strip_prefix("maxmemory_policy:"))
            .map(of_policy)
            .unwrap_or_else(|| {
                Eviction::CannotTell(format!(
                    "{config_denied}; INFO memory has no maxmemory_policy"
                ))
            })),
        Err(e) if denied(&e) => Ok(Eviction::CannotTell(format!(
            "{config_denied}; INFO: {}",
            first_words(&e)
        ))),
        Err(e) => Err(Error::Redis(e)),
    }
}

fn of_policy(policy: &str) -> Eviction {
    let policy = policy.trim();
    if policy.eq_ignore_ascii_case("noeviction") {
        Eviction::Never
    } else {
        Eviction::Evicts(policy.to_owned())
    }
}

/// A denial's gist, e.g. `NOPERM this user has no permissions to run the 'info' command`.
fn first_words(e: &redis::RedisError) -> String {
    let text = e.to_string();
    text.chars().take(120).collect()
}

/// `SET key <pid> PX 10000` then `WAIT wanted timeout`, in one round trip: `Err`
/// ([`Error::ReplicasBehind`]) when fewer replicas acknowledged within `timeout`.
///
/// `WAIT` waits for the replication offset of this connection's last write. The `SET` makes
/// that offset now, so the wait covers every write Redis made before, whichever connection
/// made it: a push's script calls even if the connection was replaced halfway, and the markers
/// another relay wrote for the jobs this push found duplicate.
pub(crate) async fn touch_and_wait<C: ConnectionLike + Send>(
    con: &mut C,
    key: &str,
    wanted: u32,
    timeout: Duration,
) -> Result<()> {
    // WAIT 0 would wait forever.
    let ms = timeout.as_millis().max(1) as u64;
    let ((), acknowledged): ((), i64) = redis::pipe()
        .cmd("SET")
        .arg(key)
        .arg(std::process::id())
        .arg("PX")
        .arg(PROBE_KEY_TTL_MS)
        .cmd("WAIT")
        .arg(wanted)
        .arg(ms)
        .query_async(con)
        .await?;
    if acknowledged < i64::from(wanted) {
        return Err(Error::ReplicasBehind {
            wanted,
            acknowledged,
            within: timeout,
        });
    }
    Ok(())
}

/// A small write: `SET key <pid> PX 10000`.
async fn touch<C: ConnectionLike + Send>(con: &mut C, key: &str) -> Result<()> {
    let () = redis::cmd("SET")
        .arg(key)
        .arg(std::process::id())
        .arg("PX")
        .arg(PROBE_KEY_TTL_MS)
        .query_async(con)
        .await?;
    Ok(())
}

/// Whether Redis takes the relay's writes: a `SET` with a short TTL succeeds (refused with
/// `OOM` at `maxmemory`, `READONLY` on a replica, `LOADING`, `MASTERDOWN`, `NOPERM`, ...);
/// with `--redis-wait-replicas`, enough replicas acknowledge it; `ROLE` says master (a replica
/// with `replica-read-only no` takes writes it will lose; a denied `ROLE` cannot tell); and
/// the `maxmemory-policy` does not evict, unless allowed. What it found of the policy.
pub(crate) async fn writable<C: ConnectionLike + Send>(
    con: &mut C,
    key: &str,
    safety: &RedisSafety,
) -> Result<Eviction> {
    if safety.wait_replicas > 0 {
        touch_and_wait(con, key, safety.wait_replicas, safety.wait_timeout).await?;
    } else {
        touch(con, key).await?;
    }
    let role: redis::RedisResult<Vec<redis::Value>> = redis::cmd("ROLE").query_async(con).await;
    match role {
        Ok(role) => {
            let role = role
                .first()
                .and_then(|v| redis::from_redis_value::<String>(v).ok());
            if role.as_deref() != Some("master") {
                return Err(Error::Redis(redis::RedisError::from((
                    redis::ErrorKind::ReadOnly,
                    "not a master: writes are refused",
                    format!("ROLE answered {role:?}"),
                ))));
            }
        }
        // Cannot tell: the SET above would have met READONLY on a read-only replica.
        Err(e) if denied(&e) => {}
        Err(e) => return Err(Error::Redis(e)),
    }
    let eviction = eviction_policy(con).await?;
    eviction.refused(safety.allow_eviction)?;
    note_once(&eviction, safety.allow_eviction);
    Ok(eviction)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_noeviction_never_evicts() {
        assert_eq!(of_policy("noeviction"), Eviction::Never);
        assert_eq!(
            of_policy("allkeys-lru "),
            Eviction::Evicts("allkeys-lru".into())
        );
        let e = of_policy("volatile-lru").refused(false).unwrap_err();
        assert_eq!(e.reason(), Reason::EvictionPolicy);
        assert!(e.to_string().contains("volatile-lru"), "{e}");
        assert!(of_policy("volatile-lru").refused(true).is_ok());
        assert!(Eviction::CannotTell("denied".into()).refused(false).is_ok());
    }
}
