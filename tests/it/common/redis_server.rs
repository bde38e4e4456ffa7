//! A private `redis-server` on a free port, for fault tests: stop it, restart it on the same
//! port, kill it. Never touches the shared Redis.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A redis-server child process owned by one test.
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    extra: Vec<String>,
    pub dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts a server on a free port (no persistence), waiting until it answers PING.
    pub fn start() -> Self {
        RedisServer::start_with(&[])
    }

    /// Starts a server with extra command-line options (e.g. TLS settings).
    pub fn start_with(extra: &[&str]) -> Self {
        let mut s = RedisServer {
            port: super::free_port(),
            child: None,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            dir: tempfile::tempdir().unwrap(),
        };
        s.restart();
        s
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts the server again on the same port (after `kill`), waiting until it answers.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "already running");
        let child = Command::new("redis-server")
            .arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        self.child = Some(child);
        self.wait_ready(Duration::from_secs(10));
    }

    fn wait_ready(&self, deadline: Duration) {
        let start = Instant::now();
        let addr = format!("127.0.0.1:{}", self.port);
        loop {
            if let Ok(mut s) = std::net::TcpStream::connect(&addr) {
                use std::io::{Read, Write};
                let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
                if s.write_all(b"PING\r\n").is_ok() {
                    let mut buf = [0u8; 7];
                    // A server that requires a password answers `-NOAUTH ...`: it is up too.
                    if s.read_exact(&mut buf).is_ok()
                        && (&buf == b"+PONG\r\n" || buf.starts_with(b"-NOAUTH"))
                    {
                        return;
                    }
                }
            }
            if self.extra.iter().any(|a| a == "--tls-port") {
                // A TLS-only server will not answer plain PING; a listening port is enough.
                if std::net::TcpStream::connect(&addr).is_ok() {
                    return;
                }
            }
            assert!(
                start.elapsed() < deadline,
                "redis-server on {addr} did not come up"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
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
        redis::Client::open(self.url())
            .unwrap()
            .get_connection()
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
