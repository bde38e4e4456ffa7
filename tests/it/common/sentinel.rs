//! A private Sentinel group for failover tests: a primary, a replica and three
//! `redis-sentinel`s on free ports, each in a temporary directory; all five are killed and
//! their directories removed on drop. Optionally behind passwords, or speaking only TLS
//! ([`Setup`]). Never touches the shared Redis.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::pg_server::Certs;
use super::redis_server::RedisServer;
use super::{redis_client, wait_until};

/// The group's name in the Sentinels' configuration.
pub const MASTER_NAME: &str = "relaymaster";

/// A primary, a replica, three Sentinels.
pub struct SentinelGroup {
    /// The two servers; which one is the primary changes with failovers ([`Self::primary`]).
    pub servers: [RedisServer; 2],
    sentinels: Vec<SentinelProcess>,
    /// The Sentinels' own password (`requirepass` in their configuration), if any.
    sentinel_password: Option<String>,
    /// The CA (PEM) of a group that speaks only TLS.
    tls_ca: Option<Vec<u8>>,
    /// This group's turn: one group at a time in the test process ([`ONE_GROUP`]).
    _turn: tokio::sync::MutexGuard<'static, ()>,
}

/// Held by the one group running. A group's timing is its test's subject (a primary is down
/// after 1 s of silence, failovers are timed), and two groups failing over beside each other
/// and the rest of the suite starve each other's Sentinels of CPU.
static ONE_GROUP: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How a group is set up, beyond the defaults (no password, plain TCP).
#[derive(Clone, Copy, Default)]
pub struct Setup<'a> {
    /// `(server password, sentinel password)`: the servers require the first (the replica
    /// and the Sentinels authenticate with it), the Sentinels the second (they authenticate
    /// to each other with it).
    pub auth: Option<(&'a str, &'a str)>,
    /// TLS only, with these certificates: servers and Sentinels have no plain port
    /// (`port 0`); the replica replicates and the Sentinels talk to the servers and to each
    /// other over TLS (`tls-replication yes`); no client certificate is asked for.
    pub tls: Option<&'a Certs>,
}

struct SentinelProcess {
    port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for SentinelProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl SentinelGroup {
    /// Starts the servers (each with `server_args` too, e.g. `min-replicas-to-write`), the
    /// replica replicating, and three Sentinels (quorum 2, a primary is down after 1 s of
    /// silence); returns once the Sentinels know the replica and each other.
    pub async fn start(server_args: &[&str]) -> Self {
        SentinelGroup::start_with(server_args, Setup::default()).await
    }

    /// As [`Self::start`], with `auth = (server password, sentinel password)` ([`Setup::auth`]).
    pub async fn start_with_auth(server_args: &[&str], auth: Option<(&str, &str)>) -> Self {
        SentinelGroup::start_with(
            server_args,
            Setup {
                auth,
                ..Setup::default()
            },
        )
        .await
    }

    /// As [`Self::start`], speaking only TLS with `certs` ([`Setup::tls`]).
    pub async fn start_tls(server_args: &[&str], certs: &Certs) -> Self {
        SentinelGroup::start_with(
            server_args,
            Setup {
                tls: Some(certs),
                ..Setup::default()
            },
        )
        .await
    }

    /// As [`Self::start`], set up as `setup` says.
    pub async fn start_with(server_args: &[&str], setup: Setup<'_>) -> Self {
        let turn = ONE_GROUP.lock().await;
        let Setup { auth, tls } = setup;
        let mut server_args: Vec<&str> = server_args.to_vec();
        if let Some((pw, _)) = auth {
            server_args.extend(["--requirepass", pw, "--masterauth", pw]);
        }
        let server = |args: &[&str]| match tls {
            Some(certs) => RedisServer::start_tls(certs, args),
            None => RedisServer::start_with(args),
        };
        let primary = server(&server_args);
        let primary_port = primary.port.to_string();
        let mut replica_args: Vec<&str> = server_args.clone();
        replica_args.extend(["--replicaof", "127.0.0.1", &primary_port]);
        let replica = server(&replica_args);
        let mut sentinels = Vec::new();
        for _ in 0..3 {
            let dir = tempfile::tempdir().unwrap();
            let port = super::free_port();
            let conf = dir.path().join("sentinel.conf");
            // With TLS, a Sentinel listens on `tls-port` only, and `tls-replication yes`
            // makes it reach the servers and the other Sentinels over TLS, and announce its
            // TLS port to them.
            let listen = match tls {
                None => format!("port {port}\n"),
                Some(c) => format!(
                    "port 0\ntls-port {port}\ntls-cert-file {cert}\ntls-key-file {key}\n\
                     tls-ca-cert-file {ca}\ntls-auth-clients no\ntls-replication yes\n",
                    cert = c.cert.display(),
                    key = c.key.display(),
                    ca = c.ca.display(),
                ),
            };
            std::fs::write(
                &conf,
                format!(
                    "{listen}bind 127.0.0.1\ndaemonize no\ndir {dir}\n\
                     sentinel monitor {MASTER_NAME} 127.0.0.1 {primary_port} 2\n\
                     sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
                     sentinel failover-timeout {MASTER_NAME} 10000\n\
                     sentinel parallel-syncs {MASTER_NAME} 1\n{auth}",
                    dir = dir.path().display(),
                    auth = match auth {
                        Some((pw, spw)) => format!(
                            "sentinel auth-pass {MASTER_NAME} {pw}\nrequirepass {spw}\n\
                             sentinel sentinel-pass {spw}\n"
                        ),
                        None => String::new(),
                    }
                ),
            )
            .unwrap();
            let child = Command::new("redis-server")
                .arg(&conf)
                .arg("--sentinel")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server --sentinel starts");
            sentinels.push(SentinelProcess {
                port,
                child,
                _dir: dir,
            });
        }
        let group = SentinelGroup {
            servers: [primary, replica],
            sentinels,
            sentinel_password: auth.map(|(_, spw)| spw.to_owned()),
            tls_ca: tls.map(|c| std::fs::read(&c.ca).expect("the CA certificate")),
            _turn: turn,
        };
        group.wait_settled().await;
        group
    }

    /// `redis+sentinel://127.0.0.1:<p1>,127.0.0.1:<p2>,127.0.0.1:<p3>/relaymaster`
    /// (`rediss+sentinel://` with TLS).
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        format!(
            "{}+sentinel://{}/{MASTER_NAME}",
            self.scheme(),
            hosts.join(",")
        )
    }

    fn scheme(&self) -> &'static str {
        if self.tls_ca.is_some() {
            "rediss"
        } else {
            "redis"
        }
    }

    /// A client for a Sentinel itself, with its password (and the CA, with TLS).
    fn sentinel_client(&self, port: u16) -> redis::Client {
        let userinfo = match &self.sentinel_password {
            Some(spw) => format!(":{spw}@"),
            None => String::new(),
        };
        let url = format!("{}://{userinfo}127.0.0.1:{port}", self.scheme());
        redis_client(&url, self.tls_ca.as_deref()).unwrap()
    }

    /// A connection to the Sentinel at `port`, if it answers within 2 s.
    async fn sentinel_con(&self, port: u16) -> Option<redis::aio::MultiplexedConnection> {
        let client = self.sentinel_client(port);
        tokio::time::timeout(
            Duration::from_secs(2),
            client.get_multiplexed_async_connection(),
        )
        .await
        .ok()?
        .ok()
    }

    /// Asks the first Sentinel that answers.
    pub async fn ask(&self, args: &[&str]) -> redis::RedisResult<redis::Value> {
        let mut last = None;
        for s in &self.sentinels {
            let Some(mut con) = self.sentinel_con(s.port).await else {
                continue;
            };
            let mut cmd = redis::cmd(args[0]);
            for a in &args[1..] {
                cmd.arg(*a);
            }
            match cmd.query_async(&mut con).await {
                Ok(v) => return Ok(v),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            redis::RedisError::from((redis::ErrorKind::IoError, "no sentinel answers"))
        }))
    }

    /// The port the Sentinels name as the primary's.
    pub async fn named_primary(&self) -> Option<u16> {
        let v = self
            .ask(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME])
            .await
            .ok()?;
        let (_, port): (String, u16) = redis::from_redis_value(&v).ok()?;
        Some(port)
    }

    /// Whether every Sentinel names `port` as the primary's. A Sentinel that has not yet heard
    /// of a failover still takes the old primary for the primary: a server restarted empty
    /// at the old address then looks sane to it, and it makes the promoted replica follow
    /// that server, whose empty dataset replaces the replica's (`+convert-to-slave`; the likely
    /// cause of 800 jobs lost once in CI, whose server logs were not kept).
    pub async fn all_name(&self, port: u16) -> bool {
        for s in &self.sentinels {
            let Some(mut con) = self.sentinel_con(s.port).await else {
                return false;
            };
            let named: redis::RedisResult<(String, u16)> = redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(MASTER_NAME)
                .query_async(&mut con)
                .await;
            if !matches!(named, Ok((_, p)) if p == port) {
                return false;
            }
        }
        true
    }

    /// Index into [`Self::servers`] of the server with `port`.
    pub fn index_of(&self, port: u16) -> usize {
        self.servers
            .iter()
            .position(|s| s.port == port)
            .expect("one of the group's servers")
    }

    /// Waits until every Sentinel knows the replica and the two other Sentinels, and the
    /// replica's link to the primary is up: a failover can then be asked for.
    pub async fn wait_settled(&self) {
        let this = self;
        wait_until(
            "the sentinels know the replica and each other, and the replica is in sync",
            Duration::from_secs(60),
            || async move { this.settled().await },
        )
        .await;
    }

    async fn settled(&self) -> bool {
        for s in &self.sentinels {
            let client = self.sentinel_client(s.port);
            let Ok(mut con) = client.get_multiplexed_async_connection().await else {
                return false;
            };
            let replicas: redis::RedisResult<Vec<std::collections::HashMap<String, String>>> =
                redis::cmd("SENTINEL")
                    .arg("REPLICAS")
                    .arg(MASTER_NAME)
                    .query_async(&mut con)
                    .await;
            let ok_replicas = replicas.is_ok_and(|r| {
                r.iter().any(|m| {
                    m.get("flags").is_some_and(|f| f == "slave")
                        && m.get("master-link-status").is_some_and(|l| l == "ok")
                })
            });
            let others: redis::RedisResult<Vec<redis::Value>> = redis::cmd("SENTINEL")
                .arg("SENTINELS")
                .arg(MASTER_NAME)
                .query_async(&mut con)
                .await;
            if !ok_replicas || others.map(|o| o.len()).unwrap_or(0) < 2 {
                return false;
            }
        }
        true
    }
}
