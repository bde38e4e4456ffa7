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

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, Pipeline, RedisConnectionInfo, RedisError,
    RedisFuture, RedisResult, TlsCertificates, TlsMode, Value,
};

use crate::error::{redis_reason, Reason};

/// How often, at most, a Sentinel is asked which address it names as the primary.
pub const SENTINEL_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// Where the relay's Redis is: one server, the primary of a group the Sentinels watch, or a
/// Cluster. Cheap to clone; holds no connection ([`connect`] makes one).
#[derive(Clone)]
pub struct RedisEndpoint(Target);

#[derive(Clone)]
enum Target {
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

/// TLS for the Redis servers (and Sentinels): off, or on with the bundled web PKI roots, or
/// with the given CA certificates (PEM).
#[derive(Clone, Debug, Default)]
pub enum Tls {
    /// Plain TCP.
    #[default]
    Off,
    /// TLS, verified against the bundled roots.
    On,
    /// TLS, verified against these PEM certificates (`--redis-ca-file`).
    WithCa(Vec<u8>),
}

impl Tls {
    fn is_on(&self) -> bool {
        !matches!(self, Tls::Off)
    }

    fn certificates(&self) -> Option<TlsCertificates> {
        match self {
            Tls::WithCa(pem) => Some(TlsCertificates {
                client_tls: None,
                root_cert: Some(pem.clone()),
            }),
            _ => None,
        }
    }

    fn addr(&self, host: &str, port: u16) -> ConnectionAddr {
        if self.is_on() {
            ConnectionAddr::TcpTls {
                host: host.to_owned(),
                port,
                insecure: false,
                tls_params: None,
            }
        } else {
            ConnectionAddr::Tcp(host.to_owned(), port)
        }
    }
}

/// Credentials: `AUTH [username] password`.
#[derive(Clone, Debug, Default)]
pub struct Auth {
    /// ACL user (`None`: `default`).
    pub username: Option<String>,
    /// Password (`None`: no `AUTH`).
    pub password: Option<String>,
}

/// A group of servers watched by Sentinels: where the Sentinels are and how to talk to them
/// and to the servers.
#[derive(Clone, Debug)]
pub struct SentinelSpec {
    /// The Sentinels, `(host, port)`, in the order to ask them.
    pub sentinels: Vec<(String, u16)>,
    /// The group's name in the Sentinels' configuration (`sentinel monitor <name> ...`).
    pub master_name: String,
    /// Credentials for the Redis servers.
    pub auth: Auth,
    /// Credentials for the Sentinels.
    pub sentinel_auth: Auth,
    /// The database number on the servers.
    pub db: i64,
    /// TLS, for the Sentinels and the servers alike.
    pub tls: Tls,
}

/// A Redis Cluster: seed nodes to learn the slot map from, and how to talk to the nodes.
#[derive(Clone, Debug)]
pub struct ClusterSpec {
    /// Seed nodes, `(host, port)`; any one that answers is enough.
    pub seeds: Vec<(String, u16)>,
    /// Credentials, the same on every node.
    pub auth: Auth,
    /// TLS on every node.
    pub tls: Tls,
}

impl RedisEndpoint {
    /// The primary of the group `spec` names, found through its Sentinels.
    pub fn sentinel(spec: SentinelSpec) -> RedisResult<Self> {
        if spec.sentinels.is_empty() {
            return Err(RedisError::from((
                ErrorKind::EmptySentinelList,
                "no sentinel address",
            )));
        }
        let mut clients = Vec::with_capacity(spec.sentinels.len());
        let mut infos = Vec::with_capacity(spec.sentinels.len());
        for (host, port) in &spec.sentinels {
            // One client per Sentinel, so that each is asked with its own bound: a Sentinel
            // that never answers cannot hold up the others.
            let mut b = SentinelClientBuilder::new(
                [spec.tls.addr(host, *port)],
                spec.master_name.clone(),
                SentinelServerType::Master,
            )?
            .set_client_to_redis_db(spec.db);
            if let Some(u) = &spec.auth.username {
                b = b.set_client_to_redis_username(u.clone());
            }
            if let Some(p) = &spec.auth.password {
                b = b.set_client_to_redis_password(p.clone());
            }
            if let Some(u) = &spec.sentinel_auth.username {
                b = b.set_client_to_sentinel_username(u.clone());
            }
            if let Some(p) = &spec.sentinel_auth.password {
                b = b.set_client_to_sentinel_password(p.clone());
            }
            if spec.tls.is_on() {
                // Without the first, the servers the Sentinels name would be reached over
                // plain TCP. The Sentinels' addresses are TLS already (`spec.tls.addr` above):
                // the second only restates that (sentinels_over_tls_are_followed passes
                // without it, and fails without the Sentinels' certificates below).
                b = b
                    .set_client_to_redis_tls_mode(TlsMode::Secure)
                    .set_client_to_sentinel_tls_mode(TlsMode::Secure);
            }
            if let Some(certs) = spec.tls.certificates() {
                b = b
                    .set_client_to_redis_certificates(certs.clone())
                    .set_client_to_sentinel_certificates(certs);
            }
            clients.push(tokio::sync::Mutex::new(b.build()?));
            infos.push(ConnectionInfo {
                addr: spec.tls.addr(host, *port),
                redis: RedisConnectionInfo {
                    username: spec.sentinel_auth.username.clone(),
                    password: spec.sentinel_auth.password.clone(),
                    ..Default::default()
                },
            });
        }
        Ok(RedisEndpoint(Target::Sentinel(Arc::new(Sentinel {
            master_name: spec.master_name,
            db: spec.db,
            tls: spec.tls,
            clients,
            infos,
            first: AtomicUsize::new(0),
            named: Mutex::new(Named::default()),
            watch: tokio::sync::Mutex::new(None),
        }))))
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

    fn cluster_client(&self, timeout: Duration) -> RedisResult<redis::cluster::ClusterClient> {
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
fn server_error(v: &Value) -> Option<RedisError> {
    match v {
        Value::ServerError(e) => Some(e.clone().into()),
        _ => None,
    }
}

/// Whether `e` is an answer that only a replica gives (`READONLY`, `MASTERDOWN`): the request
/// was refused before anything was written.
fn is_replica_answer(e: &RedisError) -> bool {
    matches!(e.code(), Some("READONLY" | "MASTERDOWN"))
        || matches!(e.kind(), ErrorKind::ReadOnly | ErrorKind::MasterDown)
}

fn timed_out(what: &str) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("{what}: no answer in time"),
    ))
}

/// A connection to one server, found through the URL or through the Sentinels, replaced by a
/// new one when it turns out to reach a replica (or, with Sentinels, another address than the
/// one they name).
struct Direct {
    source: Source,
    config: ConnectionManagerConfig,
    timeout: Duration,
    current: Mutex<Current>,
    /// Held while a new connection is made, so that concurrent requests make one.
    reconnecting: tokio::sync::Mutex<()>,
}

enum Source {
    Single(redis::Client),
    Sentinel(Arc<Sentinel>),
    /// A connection made elsewhere: kept, never replaced.
    Given(ConnectionManager),
}

#[derive(Default)]
struct Current {
    con: Option<ConnectionManager>,
    /// Where `con` goes.
    addr: Option<(String, u16)>,
    /// Bumped at each new connection.
    generation: u64,
}

impl Direct {
    /// Runs `send` on the current connection (a new one if it was dropped), once more when it
    /// finds the connection broken, or, having reached a replica, on a new connection.
    ///
    /// Redis's answers that are errors come back as `Ok` values holding a
    /// `Value::ServerError` (redis-rs turns them into `Err` later): `errors` finds them in
    /// an answer.
    async fn request<T, F, Fut>(
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
    fn invalidate(&self, generation: u64) {
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
    async fn manager(&self) -> RedisResult<(ConnectionManager, u64)> {
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

fn host_port(addr: &ConnectionAddr) -> Option<(String, u16)> {
    match addr {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            Some((host.clone(), *port))
        }
        _ => None,
    }
}

/// The Sentinels of one group, and what they last named as its primary.
struct Sentinel {
    master_name: String,
    db: i64,
    tls: Tls,
    /// One redis-rs `SentinelClient` per Sentinel.
    clients: Vec<tokio::sync::Mutex<SentinelClient>>,
    /// How to reach each Sentinel, for the regular check.
    infos: Vec<ConnectionInfo>,
    /// The Sentinel that answered last: asked first next time.
    first: AtomicUsize,
    named: Mutex<Named>,
    /// The connection the regular check asks on, and to which Sentinel.
    watch: tokio::sync::Mutex<Option<(usize, redis::aio::MultiplexedConnection)>>,
}

#[derive(Default)]
struct Named {
    /// The primary's address, as last named by a Sentinel.
    addr: Option<(String, u16)>,
    /// When a check was last begun.
    checked: Option<Instant>,
}

impl Sentinel {
    /// The address the Sentinels last named as the primary, if any was learnt yet.
    fn named(&self) -> Option<(String, u16)> {
        self.named.lock().expect("not poisoned").addr.clone()
    }

    /// Asks a Sentinel in the background which address it names as the primary, unless that
    /// was asked less than [`SENTINEL_CHECK_INTERVAL`] ago.
    fn check_soon(self: &Arc<Self>, timeout: Duration) {
        {
            let mut named = self.named.lock().expect("not poisoned");
            if named
                .checked
                .is_some_and(|t| t.elapsed() < SENTINEL_CHECK_INTERVAL)
            {
                return;
            }
            named.checked = Some(Instant::now());
        }
        let this = self.clone();
        tokio::spawn(async move {
            if let Err(e) = this.check(timeout).await {
                tracing::debug!(error = %e, "no sentinel said which address is the primary");
            }
        });
    }

    /// One check: the Sentinels in turn, from the one that answered last, until one names
    /// an address (`SENTINEL GET-MASTER-ADDR-BY-NAME`).
    async fn check(&self, timeout: Duration) -> RedisResult<()> {
        let mut watch = self.watch.lock().await;
        let n = self.infos.len();
        let start = watch
            .as_ref()
            .map(|(i, _)| *i)
            .unwrap_or_else(|| self.first.load(Ordering::Relaxed));
        let per = per_sentinel(timeout, n);
        let mut last = None;
        for k in 0..n {
            let i = (start + k) % n;
            if watch.as_ref().is_none_or(|(at, _)| *at != i) {
                *watch = None;
                let client = match self.tls.certificates() {
                    Some(certs) => redis::Client::build_with_tls(self.infos[i].clone(), certs)?,
                    None => redis::Client::open(self.infos[i].clone())?,
                };
                let config = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(per)
                    .set_response_timeout(per);
                match tokio::time::timeout(
                    per,
                    client.get_multiplexed_async_connection_with_config(&config),
                )
                .await
                {
                    Ok(Ok(con)) => *watch = Some((i, con)),
                    Ok(Err(e)) => {
                        last = Some(e);
                        continue;
                    }
                    Err(_) => {
                        last = Some(timed_out("connecting to a sentinel"));
                        continue;
                    }
                }
            }
            let (_, con) = watch.as_mut().expect("connected above");
            let mut cmd = redis::cmd("SENTINEL");
            cmd.arg("GET-MASTER-ADDR-BY-NAME").arg(&self.master_name);
            let asked = cmd.query_async::<Option<(String, u16)>>(con);
            match tokio::time::timeout(per, asked).await {
                Ok(Ok(Some(addr))) => {
                    self.named.lock().expect("not poisoned").addr = Some(addr);
                    return Ok(());
                }
                Ok(Ok(None)) => {
                    last = Some(RedisError::from((
                        ErrorKind::MasterNameNotFoundBySentinel,
                        "this sentinel watches no such master",
                    )));
                }
                Ok(Err(e)) => last = Some(e),
                Err(_) => last = Some(timed_out("asking a sentinel")),
            }
            *watch = None;
        }
        Err(last.unwrap_or_else(|| timed_out("asking the sentinels")))
    }

    /// A client for the primary: the Sentinels in turn, from the one that answered last,
    /// each bounded, until one names a primary that says it is one (`ROLE`).
    async fn primary(&self, timeout: Duration) -> RedisResult<redis::Client> {
        let n = self.clients.len();
        let start = self.first.load(Ordering::Relaxed);
        let per = per_sentinel(timeout, n);
        let mut last = None;
        for k in 0..n {
            let i = (start + k) % n;
            let mut client = self.clients[i].lock().await;
            match tokio::time::timeout(per, client.async_get_client()).await {
                Ok(Ok(primary)) => {
                    self.first.store(i, Ordering::Relaxed);
                    if let Some(addr) = host_port(&primary.get_connection_info().addr) {
                        self.named.lock().expect("not poisoned").addr = Some(addr);
                    }
                    return Ok(primary);
                }
                Ok(Err(e)) => last = Some(e),
                Err(_) => last = Some(timed_out("asking a sentinel for the primary")),
            }
        }
        let e = last.unwrap_or_else(|| timed_out("asking the sentinels"));
        if e.kind() == redis::ErrorKind::AuthenticationFailed {
            // A wrong password (the Sentinels' or the servers'): named for what it is.
            return Err(RedisError::from((
                redis::ErrorKind::AuthenticationFailed,
                "no sentinel named a reachable primary",
                format!("{:?}: {e}", self.master_name),
            )));
        }
        // Whatever else went wrong, the primary cannot be reached now: an outage of the
        // endpoint (reason "unreachable"), never a fault of the request that needed it.
        Err(RedisError::from(std::io::Error::new(
            std::io::ErrorKind::NotConnected,
            format!(
                "no sentinel named a reachable primary for {:?}: {e}",
                self.master_name
            ),
        )))
    }
}

/// The bound on asking one Sentinel, so that all of them fit in `timeout`.
fn per_sentinel(timeout: Duration, n: usize) -> Duration {
    (timeout / n.max(1) as u32).max(Duration::from_millis(200))
}
