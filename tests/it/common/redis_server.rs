//! A private `redis-server` on a free port, for fault tests: stop it, restart it on the same
//! port, kill it. Never touches the shared Redis.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::pg_server::Certs;

/// How a start of the server ended.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Started {
    Up,
    /// Its process exited (its port taken, most likely).
    Exited,
    /// Neither, within the deadline.
    Silent,
}

/// A redis-server child process owned by one test.
pub struct RedisServer {
    /// The port it listens on: plain TCP, or TLS for a server started with [`Self::start_tls`].
    pub port: u16,
    child: Option<Child>,
    extra: Vec<String>,
    /// For a server that speaks only TLS: the CA (PEM) its certificate is checked against.
    tls_ca: Option<Vec<u8>>,
    pub dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts a server on a free port (no persistence), waiting until it answers PING.
    pub fn start() -> Self {
        RedisServer::start_with(&[])
    }

    /// Starts a server with extra command-line options (e.g. TLS settings).
    pub fn start_with(extra: &[&str]) -> Self {
        RedisServer::spawn(extra.iter().map(|s| s.to_string()).collect(), None)
    }

    /// Starts a server that speaks only TLS (`--port 0`; [`Self::port`] is its `--tls-port`)
    /// with `certs`' certificate, not asking clients for one; a replica of it (`--replicaof`
    /// in `extra`) replicates over TLS (`--tls-replication yes`: a primary without a plain
    /// port cannot be reached otherwise).
    pub fn start_tls(certs: &Certs, extra: &[&str]) -> Self {
        let path = |p: &std::path::Path| p.to_str().expect("a UTF-8 path").to_owned();
        let mut args: Vec<String> = vec![
            "--tls-cert-file".into(),
            path(&certs.cert),
            "--tls-key-file".into(),
            path(&certs.key),
            "--tls-ca-cert-file".into(),
            path(&certs.ca),
            "--tls-auth-clients".into(),
            "no".into(),
            "--tls-replication".into(),
            "yes".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let ca = std::fs::read(&certs.ca).expect("the CA certificate");
        RedisServer::spawn(args, Some(ca))
    }

    fn spawn(extra: Vec<String>, tls_ca: Option<Vec<u8>>) -> Self {
        RedisServer::spawn_on(super::free_port(), extra, tls_ca)
    }

    fn spawn_on(port: u16, extra: Vec<String>, tls_ca: Option<Vec<u8>>) -> Self {
        let mut s = RedisServer {
            port,
            child: None,
            extra,
            tls_ca,
            dir: tempfile::tempdir().unwrap(),
        };
        // A free port can be taken between our look and the server's bind (another test's
        // server, a cluster node's bus port at port + 10000): a server that exits at once is
        // started again on another port.
        for _ in 0..4 {
            s.launch();
            match s.started(Duration::from_secs(10)) {
                Started::Up => return s,
                Started::Exited => {
                    s.child = None;
                    s.port = super::free_port();
                }
                Started::Silent => break,
            }
        }
        panic!("{}", s.not_up());
    }

    /// `redis://127.0.0.1:<port>`, or `rediss://` for a server that speaks only TLS.
    pub fn url(&self) -> String {
        let scheme = if self.tls_ca.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// The CA (PEM) of a server that speaks only TLS.
    pub fn tls_ca(&self) -> Option<&[u8]> {
        self.tls_ca.as_deref()
    }

    /// A client for [`Self::url`] (trusting the CA of a server that speaks only TLS).
    pub fn client(&self) -> redis::Client {
        super::redis_client(&self.url(), self.tls_ca()).unwrap()
    }

    /// Starts the server again on the same port (after `kill`), waiting until it answers.
    pub fn restart(&mut self) {
        self.launch();
        if self.started(Duration::from_secs(10)) != Started::Up {
            panic!("{}", self.not_up());
        }
    }

    /// Why the server is not up: its port and the end of its log.
    fn not_up(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(5).collect();
        format!(
            "redis-server on 127.0.0.1:{} did not come up; its log ends:\n{}",
            self.port,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        )
    }

    /// Starts the server process on [`Self::port`].
    fn launch(&mut self) {
        assert!(self.child.is_none(), "already running");
        let port = self.port.to_string();
        let mut cmd = Command::new("redis-server");
        match self.tls_ca {
            None => cmd.args(["--port", &port]),
            // No plain port at all: whatever reaches this server speaks TLS.
            Some(_) => cmd.args(["--port", "0", "--tls-port", &port]),
        };
        let child = cmd
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(["--logfile", "redis.log"])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        self.child = Some(child);
    }

    /// Waits until the server answers PING, or its process exits, or `deadline` passes.
    fn started(&mut self, deadline: Duration) -> Started {
        let step = || {
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if exited.is_some() {
                return Some(Started::Exited);
            }
            self.answers().then_some(Started::Up)
        };
        super::poll_blocking(deadline, Duration::from_millis(20), step).unwrap_or(Started::Silent)
    }

    /// Whether the server answers PING (a TLS-only one: over TLS, or by listening).
    fn answers(&self) -> bool {
        let addr = format!("127.0.0.1:{}", self.port);
        if self.tls_ca.is_some() {
            if self.answers_ping_over_tls() {
                return true;
            }
        } else if let Ok(mut s) = std::net::TcpStream::connect(&addr) {
            use std::io::{Read, Write};
            let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
            if s.write_all(b"PING\r\n").is_ok() {
                let mut buf = [0u8; 7];
                // A server that requires a password answers `-NOAUTH ...`: it is up too.
                if s.read_exact(&mut buf).is_ok()
                    && (&buf == b"+PONG\r\n" || buf.starts_with(b"-NOAUTH"))
                {
                    return true;
                }
            }
        }
        // A TLS-only server will not answer plain PING; a listening port is enough.
        let tls_only = self.extra.iter().any(|a| a == "--tls-port");
        tls_only && std::net::TcpStream::connect(&addr).is_ok()
    }

    /// Whether the server answers PING over TLS (`NOAUTH`, from a server that requires a
    /// password, counts as an answer).
    fn answers_ping_over_tls(&self) -> bool {
        let Ok(mut con) = self
            .client()
            .get_connection_with_timeout(Duration::from_millis(500))
        else {
            return false;
        };
        let pong: redis::RedisResult<String> = redis::cmd("PING").query(&mut con);
        pong.is_ok() || pong.is_err_and(|e| e.code() == Some("NOAUTH"))
    }

    /// kill -9 the server (its data is gone: no persistence).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Sends `sig` (`STOP`, `CONT`, ...) to the server process.
    pub fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("running").id();
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(pid.to_string())
            .status()
            .expect("kill runs")
            .success();
        assert!(ok, "kill -{sig} {pid}");
    }

    /// A synchronous connection to the server (as its default user).
    pub fn con(&self) -> redis::Connection {
        self.client().get_connection().unwrap()
    }

    /// A multiplexed connection to the server (as its default user).
    pub async fn async_con(&self) -> redis::aio::MultiplexedConnection {
        self.client()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    /// Whether the server process is running.
    #[allow(dead_code)] // the helper's API; no test needs it today
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(child) = &self.child {
            // A server a test stopped (SIGSTOP) is continued first, so it dies for sure.
            let _ = Command::new("kill")
                .arg("-CONT")
                .arg(child.id().to_string())
                .status();
        }
        self.kill();
    }
}

#[test]
fn a_server_whose_port_is_taken_starts_on_another() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let s = RedisServer::spawn_on(port, Vec::new(), None);
    assert_ne!(s.port, port);
    assert!(s.answers());
}
