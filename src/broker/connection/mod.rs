//! Redis connections with bounded waits, to one server, to the primary the Sentinels name, or
//! to a Cluster ([`RedisEndpoint`]).
//!
//! redis-rs's `ConnectionManager` reconnects by itself, but its defaults wait without bound for
//! a response and retry a failed connect for a long time. The relay has its own backoff and
//! must notice an outage within `--push-timeout`, so its connections bound both. And a
//! request that finds the connection broken is tried once more on a new one
//! ([`RedisConnection`]), so a connection that went stale is not taken for an outage.
//!
//! A connection also follows the primary when it moves:
//!
//! - One server (`redis://`, `rediss://`): an answer that says the server is a replica
//!   (`READONLY`, `MASTERDOWN`) drops the connection, and the next request connects anew, so
//!   a virtual IP or a DNS name that moves to the new primary after a failover is followed.
//! - Sentinel (`redis+sentinel://`): the primary is the one the Sentinels name (asked in turn,
//!   each bounded, and checked with `ROLE`). About once a second, while requests flow, one
//!   Sentinel is asked again which address it names (`SENTINEL GET-MASTER-ADDR-BY-NAME`); a
//!   new address, or a request refused as a replica's, unreachable, timed out, `NOREPLICAS` or
//!   `LOADING`, makes the next request connect to the primary the Sentinels name then.
//! - Cluster (`redis+cluster://`): redis-rs's cluster connection routes each call to the
//!   owner of its keys' slot and follows `MOVED`, `ASK` and `TRYAGAIN` itself.

mod answer;
mod direct;
mod endpoint;
mod sentinel;
mod spec;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

pub use self::answer::is_broken_connection;
pub use self::endpoint::{RedisEndpoint, Topology};
pub use self::sentinel::SENTINEL_CHECK_INTERVAL;
pub use self::spec::{Auth, ClusterSpec, SentinelSpec, Tls};

use self::answer::{server_error, timed_out};
use self::direct::{Current, Direct, Source};
use self::endpoint::Target;

/// A self-reconnecting connection to `endpoint` whose connect and each response are bounded
/// by `timeout`, and whose own reconnect attempts are few and short (the caller backs off in
/// between). `endpoint` is a [`RedisEndpoint`] or a `redis::Client` (one server).
pub async fn connect<E>(endpoint: &E, timeout: Duration) -> RedisResult<RedisConnection>
where
    for<'e> &'e E: Into<RedisEndpoint>,
{
    let endpoint: RedisEndpoint = endpoint.into();
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
    let source = match &endpoint.0 {
        Target::Single(client) => Source::Single(client.clone()),
        Target::Sentinel(s) => Source::Sentinel(s.clone()),
        Target::Cluster(_) => {
            let client = endpoint.cluster_client(timeout)?;
            let con = tokio::time::timeout(timeout, client.get_async_connection())
                .await
                .map_err(|_| timed_out("connecting to the cluster"))??;
            return Ok(RedisConnection(Inner::Cluster(con)));
        }
    };
    let direct = Direct {
        source,
        config,
        timeout,
        current: Mutex::new(Current::default()),
        reconnecting: tokio::sync::Mutex::new(()),
    };
    // The first connection is made now, so that an outage at start shows as an error here.
    direct.manager().await?;
    Ok(RedisConnection(Inner::Direct(Arc::new(direct))))
}

/// The relay's Redis connection: to one server or the Sentinels' primary, a
/// `ConnectionManager` whose every request is tried once more when it finds the connection
/// broken ([`is_broken_connection`]) or the server a replica, and which moves to the new
/// primary after a failover (see the module); to a Cluster, redis-rs's cluster connection.
/// Cheap to clone: the clones share the connection.
///
/// Only for requests that are safe to send twice, as the relay's are: the enqueue script is
/// atomic and leaves a dedup marker (a second run of a call that landed reports duplicates),
/// and probes only read. Callers bound the whole request, retry included, with their timeout.
#[derive(Clone)]
pub struct RedisConnection(Inner);

#[derive(Clone)]
enum Inner {
    Direct(Arc<Direct>),
    Cluster(ClusterConnection),
}

impl RedisConnection {
    /// Which kind of endpoint this connection is to.
    pub fn topology(&self) -> Topology {
        match &self.0 {
            Inner::Direct(d) => match d.source {
                Source::Single(_) | Source::Given(_) => Topology::Single,
                Source::Sentinel(_) => Topology::Sentinel,
            },
            Inner::Cluster(_) => Topology::Cluster,
        }
    }

    /// Makes the next request connect anew (to whatever the Sentinels name as the primary, or
    /// wherever the URL's name points now): for a caller that learnt from an answer that this
    /// connection reaches a replica. Nothing for a Cluster, which follows its slots itself.
    pub fn reconnect(&self) {
        if let Inner::Direct(d) = &self.0 {
            let generation = d.current.lock().expect("not poisoned").generation;
            d.invalidate(generation);
        }
    }
}

impl From<ConnectionManager> for RedisConnection {
    /// A connection made elsewhere, used as it is: tried once more when it finds itself
    /// broken, but never replaced by one to another server.
    fn from(con: ConnectionManager) -> Self {
        RedisConnection(Inner::Direct(Arc::new(Direct {
            source: Source::Given(con.clone()),
            config: ConnectionManagerConfig::new(),
            timeout: Duration::from_secs(5),
            current: Mutex::new(Current {
                con: Some(con),
                addr: None,
                generation: 0,
            }),
            reconnecting: tokio::sync::Mutex::new(()),
        })))
    }
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match &mut self.0 {
            Inner::Cluster(c) => c.req_packed_command(cmd),
            Inner::Direct(d) => {
                let d = d.clone();
                Box::pin(async move {
                    d.request(
                        |mut con| async move { con.send_packed_command(cmd).await },
                        server_error,
                    )
                    .await
                })
            }
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match &mut self.0 {
            Inner::Cluster(c) => c.req_packed_commands(cmd, offset, count),
            Inner::Direct(d) => {
                let d = d.clone();
                Box::pin(async move {
                    d.request(
                        |mut con| async move { con.send_packed_commands(cmd, offset, count).await },
                        |answers: &Vec<Value>| answers.iter().find_map(server_error),
                    )
                    .await
                })
            }
        }
    }

    fn get_db(&self) -> i64 {
        match &self.0 {
            Inner::Cluster(_) => 0,
            Inner::Direct(d) => match &d.source {
                Source::Single(c) => c.get_connection_info().redis.db,
                Source::Sentinel(s) => s.db,
                Source::Given(c) => c.get_db(),
            },
        }
    }
}
