//! Redis connections with bounded waits.
//!
//! redis-rs's `ConnectionManager` reconnects by itself, but its defaults wait without bound for
//! a response and retry a failed connect for a long time. The relay has its own backoff and
//! must notice an outage within `--push-timeout`, so its connections bound both.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

/// A self-reconnecting connection whose connect and each response are bounded by `timeout`,
/// and whose own reconnect attempts are few and short (the caller backs off in between).
pub async fn connect(
    client: &redis::Client,
    timeout: Duration,
) -> redis::RedisResult<ConnectionManager> {
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(timeout)
        .set_response_timeout(timeout)
        .set_number_of_retries(1)
        .set_exponent_base(2)
        .set_factor(100)
        .set_max_delay(1000);
    ConnectionManager::new_with_config(client.clone(), config).await
}

/// Whether `e` says the connection itself broke (reset, refused, closed, or a reconnect begun
/// earlier that failed), as opposed to a timeout or an answer from Redis.
///
/// After such an error `ConnectionManager` starts a new connection; but a reconnect begun
/// during an outage that failed is handed, as this error, to the first request made after
/// Redis came back. One more try tells that stale connection from an outage that goes on.
pub fn is_broken_connection(e: &redis::RedisError) -> bool {
    e.is_connection_dropped() || e.is_connection_refusal() || (e.is_io_error() && !e.is_timeout())
}

#[cfg(test)]
mod tests {
    use super::is_broken_connection;
    use std::io::{Error, ErrorKind};

    #[test]
    fn broken_connections_are_told_from_timeouts_and_answers() {
        for kind in [
            ErrorKind::BrokenPipe,
            ErrorKind::ConnectionReset,
            ErrorKind::ConnectionRefused,
            ErrorKind::UnexpectedEof,
            ErrorKind::NotConnected,
        ] {
            let e = redis::RedisError::from(Error::from(kind));
            assert!(is_broken_connection(&e), "{kind:?}");
        }
        let timeout = redis::RedisError::from(Error::from(ErrorKind::TimedOut));
        assert!(!is_broken_connection(&timeout));
        let answer = redis::RedisError::from((
            redis::ErrorKind::TypeError,
            "WRONGTYPE",
            "Operation against a key holding the wrong kind of value".to_owned(),
        ));
        assert!(!is_broken_connection(&answer));
    }
}
