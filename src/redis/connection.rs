//! Redis connections with bounded waits.
//!
//! redis-rs's `ConnectionManager` reconnects by itself, but its defaults wait without bound for
//! a response and retry a failed connect for a long time. The relay has its own backoff and
//! must notice an outage within `--push-timeout`, so its connections bound both. And a
//! request that finds the connection broken is tried once more on a new one
//! ([`RedisConnection`]), so a connection that went stale is not taken for an outage.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, Pipeline, RedisFuture, Value};

use crate::error::{redis_reason, Reason};

/// A self-reconnecting connection whose connect and each response are bounded by `timeout`,
/// and whose own reconnect attempts are few and short (the caller backs off in between).
pub async fn connect(
    client: &redis::Client,
    timeout: Duration,
) -> redis::RedisResult<RedisConnection> {
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(timeout)
        .set_response_timeout(timeout)
        // No retry inside the connect: a refused connection or a wrong password fails at once
        // with its own reason (a retry after a 1 s delay outlived the probe's 1 s bound and
        // was served as `timeout`). The relay backs off between attempts itself.
        .set_number_of_retries(0)
        .set_exponent_base(2)
        .set_factor(100)
        .set_max_delay(1000);
    Ok(ConnectionManager::new_with_config(client.clone(), config)
        .await?
        .into())
}

/// The relay's Redis connection: a `ConnectionManager` whose every request is tried once more
/// when it finds the connection broken ([`is_broken_connection`]). Cheap to clone.
///
/// Only for requests that are safe to send twice, as the relay's are: the enqueue script is
/// atomic and leaves a dedup marker (a second run of a call that landed reports duplicates),
/// and probes only read. Callers bound the whole request, retry included, with their timeout.
#[derive(Clone)]
pub struct RedisConnection(ConnectionManager);

impl From<ConnectionManager> for RedisConnection {
    fn from(con: ConnectionManager) -> Self {
        RedisConnection(con)
    }
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            match self.0.send_packed_command(cmd).await {
                Err(e) if is_broken_connection(&e) => {
                    tracing::debug!(error = %e, "redis connection broken; trying once more on a new one");
                    self.0.send_packed_command(cmd).await
                }
                other => other,
            }
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            match self.0.send_packed_commands(cmd, offset, count).await {
                Err(e) if is_broken_connection(&e) => {
                    tracing::debug!(error = %e, "redis connection broken; trying once more on a new one");
                    self.0.send_packed_commands(cmd, offset, count).await
                }
                other => other,
            }
        })
    }

    fn get_db(&self) -> i64 {
        self.0.get_db()
    }
}

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
