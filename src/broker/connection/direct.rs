//! A connection to one server (named by the URL or by the Sentinels) that is replaced when it
//! reaches a replica or the primary moves.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{RedisError, RedisResult};

use super::answer::{is_broken_connection, is_replica_answer};
use super::sentinel::Sentinel;
use super::spec::host_port;
use crate::error::{redis_reason, Reason};

/// A connection to one server, found through the URL or through the Sentinels, replaced by a
/// new one when it turns out to reach a replica (or, with Sentinels, another address than the
/// one they name).
pub(super) struct Direct {
    pub(super) source: Source,
    pub(super) config: ConnectionManagerConfig,
    pub(super) timeout: Duration,
    pub(super) current: Mutex<Current>,
    /// Held while a new connection is made, so that concurrent requests make one.
    pub(super) reconnecting: tokio::sync::Mutex<()>,
}

pub(super) enum Source {
    Single(redis::Client),
    Sentinel(Arc<Sentinel>),
    /// A connection made elsewhere: kept, never replaced.
    Given(ConnectionManager),
}

#[derive(Default)]
pub(super) struct Current {
    pub(super) con: Option<ConnectionManager>,
    /// Where `con` goes.
    pub(super) addr: Option<(String, u16)>,
    /// Bumped at each new connection.
    pub(super) generation: u64,
}

impl Direct {
    /// Runs `send` on the current connection (a new one if it was dropped), once more when it
    /// finds the connection broken, or, having reached a replica, on a new connection.
    ///
    /// Redis's answers that are errors come back as `Ok` values holding a
    /// `Value::ServerError` (redis-rs turns them into `Err` later): `errors` finds them in
    /// an answer.
    pub(super) async fn request<T, F, Fut>(
        &self,
        send: F,
        errors: impl Fn(&T) -> Option<RedisError>,
    ) -> RedisResult<T>
    where
        F: Fn(ConnectionManager) -> Fut,
        Fut: std::future::Future<Output = RedisResult<T>>,
    {
        let (con, generation) = self.manager().await?;
        let result = match send(con.clone()).await {
            Err(e) if is_broken_connection(&e) => {
                tracing::debug!(error = %e, "redis connection broken; trying once more on a new one");
                send(con).await
            }
            other => other,
        };
        // (whether the answer is a replica's, whether the primary may have moved)
        let verdict = |r: &RedisResult<T>| {
            let judge = |e: &RedisError| (is_replica_answer(e), self.loses_primary(e));
            match r {
                Err(e) => judge(e),
                Ok(answer) => errors(answer).map(|e| judge(&e)).unwrap_or_default(),
            }
        };
        match verdict(&result) {
            (true, _) => {
                // A replica refuses before it writes anything: the same request goes to
                // whatever is the primary now, on a new connection.
                tracing::debug!("redis answered as a replica; reconnecting");
                self.invalidate(generation);
                let (con, generation) = self.manager().await?;
                let again = send(con).await;
                if verdict(&again).1 {
                    self.invalidate(generation);
                }
                again
            }
            (false, true) => {
                self.invalidate(generation);
                result
            }
            (false, false) => result,
        }
    }

    /// Whether, after `e`, the next request should connect anew: with Sentinels, whenever
    /// the primary may have moved; with one server, when it answered as a replica.
    fn loses_primary(&self, e: &RedisError) -> bool {
        if is_replica_answer(e) {
            return true;
        }
        match self.source {
            Source::Single(_) | Source::Given(_) => false,
            Source::Sentinel(_) => {
                matches!(e.code(), Some("NOREPLICAS" | "LOADING"))
                    || matches!(
                        redis_reason(e),
                        Reason::Unreachable | Reason::Timeout | Reason::Loading
                    )
            }
        }
    }

    /// Drops the connection of `generation` (if it is still the current one).
    pub(super) fn invalidate(&self, generation: u64) {
        let mut cur = self.current.lock().expect("not poisoned");
        if cur.generation == generation {
            cur.con = None;
        }
    }

    /// The current connection, if there is one and (with Sentinels) it still goes where the
    /// Sentinels last named.
    fn fresh(&self) -> Option<(ConnectionManager, u64)> {
        let cur = self.current.lock().expect("not poisoned");
        let con = cur.con.clone()?;
        if let Source::Sentinel(s) = &self.source {
            if let Some(named) = s.named() {
                if Some(&named) != cur.addr.as_ref() {
                    return None;
                }
            }
        }
        Some((con, cur.generation))
    }

    /// The current connection, or a new one.
    pub(super) async fn manager(&self) -> RedisResult<(ConnectionManager, u64)> {
        if let Source::Sentinel(s) = &self.source {
            s.check_soon(self.timeout);
        }
        if let Some(found) = self.fresh() {
            return Ok(found);
        }
        let _one = self.reconnecting.lock().await;
        if let Some(found) = self.fresh() {
            return Ok(found);
        }
        let client = match &self.source {
            Source::Single(client) => client.clone(),
            Source::Sentinel(s) => s.primary(self.timeout).await?,
            Source::Given(con) => {
                let mut cur = self.current.lock().expect("not poisoned");
                cur.con = Some(con.clone());
                return Ok((con.clone(), cur.generation));
            }
        };
        let addr = host_port(&client.get_connection_info().addr);
        let con = ConnectionManager::new_with_config(client, self.config.clone()).await?;
        let mut cur = self.current.lock().expect("not poisoned");
        if let Source::Sentinel(s) = &self.source {
            if cur.addr.is_some() && cur.addr != addr {
                if let Some((host, port)) = &addr {
                    tracing::warn!(
                        master = %s.master_name,
                        primary = %format!("{host}:{port}"),
                        "redis primary moved (named by the sentinels); writing to the new one"
                    );
                }
            }
        }
        cur.con = Some(con.clone());
        cur.addr = addr;
        cur.generation += 1;
        Ok((con, cur.generation))
    }
}
