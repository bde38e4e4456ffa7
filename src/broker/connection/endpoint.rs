//! Where the relay's Redis is ([`RedisEndpoint`]): one server, the Sentinels' primary, or a
//! Cluster.

use std::sync::Arc;
use std::time::Duration;

use redis::{ConnectionInfo, RedisConnectionInfo, RedisResult};

use super::sentinel::Sentinel;
use super::spec::{host_port, ClusterSpec, SentinelSpec};

/// Where the relay's Redis is: one server, the primary of a group the Sentinels watch, or a
/// Cluster. Cheap to clone; holds no connection ([`connect`](super::connect) makes one).
#[derive(Clone)]
pub struct RedisEndpoint(pub(super) Target);

#[derive(Clone)]
pub(super) enum Target {
    Single(redis::Client),
    Sentinel(Arc<Sentinel>),
    Cluster(Arc<ClusterSpec>),
}

impl std::fmt::Debug for RedisEndpoint {
    /// Addresses only: no credentials.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Target::Single(c) => match host_port(&c.get_connection_info().addr) {
                Some((h, p)) => write!(f, "Single({h}:{p})"),
                None => f.write_str("Single(unix socket)"),
            },
            Target::Sentinel(s) => write!(
                f,
                "Sentinel({:?} at {:?})",
                s.master_name,
                s.infos
                    .iter()
                    .filter_map(|i| host_port(&i.addr))
                    .collect::<Vec<_>>()
            ),
            Target::Cluster(c) => write!(f, "Cluster({:?})", c.seeds),
        }
    }
}

impl From<redis::Client> for RedisEndpoint {
    fn from(client: redis::Client) -> Self {
        RedisEndpoint(Target::Single(client))
    }
}

impl From<&redis::Client> for RedisEndpoint {
    fn from(client: &redis::Client) -> Self {
        RedisEndpoint(Target::Single(client.clone()))
    }
}

impl From<&RedisEndpoint> for RedisEndpoint {
    fn from(endpoint: &RedisEndpoint) -> Self {
        endpoint.clone()
    }
}

/// Which kind of endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// One server (or whatever a virtual IP or DNS name points at).
    Single,
    /// The primary the Sentinels name.
    Sentinel,
    /// A Redis Cluster.
    Cluster,
}

impl RedisEndpoint {
    /// The primary of the group `spec` names, found through its Sentinels.
    pub fn sentinel(spec: SentinelSpec) -> RedisResult<Self> {
        Ok(RedisEndpoint(Target::Sentinel(Arc::new(Sentinel::new(
            spec,
        )?))))
    }

    /// A Redis Cluster, reached through `spec`'s seeds. Nothing is connected yet.
    pub fn cluster(spec: ClusterSpec) -> RedisResult<Self> {
        let endpoint = RedisEndpoint(Target::Cluster(Arc::new(spec)));
        // Checks the seeds and credentials now (no connection is made).
        endpoint.cluster_client(Duration::from_secs(1))?;
        Ok(endpoint)
    }

    /// Which kind of endpoint this is.
    pub fn topology(&self) -> Topology {
        match &self.0 {
            Target::Single(_) => Topology::Single,
            Target::Sentinel(_) => Topology::Sentinel,
            Target::Cluster(_) => Topology::Cluster,
        }
    }

    pub(super) fn cluster_client(
        &self,
        timeout: Duration,
    ) -> RedisResult<redis::cluster::ClusterClient> {
        let Target::Cluster(spec) = &self.0 else {
            unreachable!("only for a cluster");
        };
        let nodes: Vec<ConnectionInfo> = spec
            .seeds
            .iter()
            .map(|(host, port)| ConnectionInfo {
                addr: spec.tls.addr(host, *port),
                redis: RedisConnectionInfo {
                    username: spec.auth.username.clone(),
                    password: spec.auth.password.clone(),
                    ..Default::default()
                },
            })
            .collect();
        let mut b = redis::cluster::ClusterClientBuilder::new(nodes)
            .connection_timeout(timeout)
            .response_timeout(timeout)
            // MOVED, ASK and TRYAGAIN (a slot being migrated) are retried quickly and a few
            // times; the caller's own timeout and backoff take over beyond that.
            .retries(8)
            .min_retry_wait(10)
            .max_retry_wait(500)
            .retry_wait_formula(10, 2);
        if let Some(certs) = spec.tls.certificates() {
            b = b.certs(certs);
        }
        b.build()
    }
}
