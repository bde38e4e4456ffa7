//! A Redis connection for the fast path, from a URL: the application never builds one with a
//! `redis` crate of its own, whose version would have to match the library's.

use redis::{ErrorKind, RedisError};

use crate::broker::connection::{connect, RedisConnection};
use crate::defaults::DEFAULT_PUSH_TIMEOUT;
use crate::error::Result;

/// Connects to the Redis that `url` names, in any form the relay's `--redis-url` takes
/// (`redis://[user:password@]host:port[/db]`, `rediss://` for TLS against the bundled web PKI
/// roots, `redis+sentinel://`, `redis+cluster://`; docs/redis.md#redis-urls), for
/// [`PendingJobs::push_and_delete`](super::PendingJobs::push_and_delete) and
/// [`PendingJobs::push`](super::PendingJobs::push).
///
/// The connection is the relay's own: it reconnects by itself (also to a new primary after a
/// failover), and its connect and each answer are bounded by the relay's default push timeout
/// (5 s). Cheap to clone; the clones share it. It fails when Redis cannot be reached now, or
/// when the URL is not a Redis URL; the error never holds the URL's password.
///
/// ```no_run
/// # async fn demo() -> Result<(), jobrelay::Error> {
/// let mut redis = jobrelay::producer::connect_redis("redis://127.0.0.1:6379").await?;
/// # Ok(())
/// # }
/// ```
pub async fn connect_redis(url: &str) -> Result<RedisConnection> {
    let endpoint = crate::broker::url::endpoint(url, None).map_err(|why| {
        RedisError::from((ErrorKind::InvalidClientConfig, "invalid redis URL", why))
    })?;
    Ok(connect(&endpoint, DEFAULT_PUSH_TIMEOUT).await?)
}
