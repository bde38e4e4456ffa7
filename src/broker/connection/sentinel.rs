//! The Sentinels of one group: which server they name as its primary.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{ConnectionInfo, ErrorKind, RedisConnectionInfo, RedisError, RedisResult, TlsMode};

use super::answer::timed_out;
use super::spec::{host_port, SentinelSpec, Tls};

/// How often, at most, a Sentinel is asked which address it names as the primary.
pub const SENTINEL_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// The Sentinels of one group, and what they last named as its primary.
pub(super) struct Sentinel {
    pub(super) master_name: String,
    pub(super) db: i64,
    tls: Tls,
    /// One redis-rs `SentinelClient` per Sentinel.
    clients: Vec<tokio::sync::Mutex<SentinelClient>>,
    /// How to reach each Sentinel, for the regular check.
    pub(super) infos: Vec<ConnectionInfo>,
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
    /// The Sentinels `spec` names, one redis-rs client each (nothing is connected yet).
    pub(super) fn new(spec: SentinelSpec) -> RedisResult<Self> {
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
        Ok(Sentinel {
            master_name: spec.master_name,
            db: spec.db,
            tls: spec.tls,
            clients,
            infos,
            first: AtomicUsize::new(0),
            named: Mutex::new(Named::default()),
            watch: tokio::sync::Mutex::new(None),
        })
    }

    /// The address the Sentinels last named as the primary, if any was learnt yet.
    pub(super) fn named(&self) -> Option<(String, u16)> {
        self.named.lock().expect("not poisoned").addr.clone()
    }

    /// Asks a Sentinel in the background which address it names as the primary, unless that
    /// was asked less than [`SENTINEL_CHECK_INTERVAL`] ago.
    pub(super) fn check_soon(self: &Arc<Self>, timeout: Duration) {
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
    pub(super) async fn primary(&self, timeout: Duration) -> RedisResult<redis::Client> {
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
