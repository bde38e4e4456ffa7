//! A private PgBouncer (Debian's `/usr/sbin/pgbouncer`) on a free port of 127.0.0.1, in front of
//! the shared Postgres at 127.0.0.1:5432, with the defaults that matter kept: no
//! `ignore_startup_parameters`, so a client that sends `options` or `extra_float_digits` at
//! connect time is refused, as by a stock PgBouncer. Every database name is served (`*`), so a
//! test's fresh database is reachable through it. Killed (and its directory removed) on drop.
//!
//! PgBouncer refuses to run as root: it runs as the `postgres` OS user (`setpriv`, which execs
//! it, so the child's pid is PgBouncer's own).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How PgBouncer assigns server connections to clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    /// A client keeps its server connection until it disconnects.
    Session,
    /// A client holds a server connection only for the length of a transaction.
    Transaction,
}

impl PoolMode {
    fn as_str(self) -> &'static str {
        match self {
            PoolMode::Session => "session",
            PoolMode::Transaction => "transaction",
        }
    }
}

/// A running PgBouncer.
pub struct PgBouncer {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Child,
}

impl PgBouncer {
    /// Starts PgBouncer in `mode` with `default_pool_size` server connections per database
    /// and user; waits until it accepts connections.
    pub fn start(mode: PoolMode, default_pool_size: u32) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("jobrelay-pgbouncer-")
            .tempdir()
            .unwrap();
        let port = super::free_port();
        let ini = dir.path().join("pgbouncer.ini");
        let userlist = dir.path().join("userlist.txt");
        std::fs::write(&userlist, "\"postgres\" \"\"\n").unwrap();
        std::fs::write(
            &ini,
            format!(
                "[databases]\n\
                 * = host=127.0.0.1 port=5432\n\
                 [pgbouncer]\n\
                 listen_addr = 127.0.0.1\n\
                 listen_port = {port}\n\
                 unix_socket_dir =\n\
                 auth_type = trust\n\
                 auth_file = {userlist}\n\
                 pool_mode = {mode}\n\
                 max_client_conn = 200\n\
                 default_pool_size = {default_pool_size}\n\
                 logfile = {log}\n\
                 pidfile = {pid}\n",
                userlist = userlist.display(),
                mode = mode.as_str(),
                log = dir.path().join("pgbouncer.log").display(),
                pid = dir.path().join("pgbouncer.pid").display(),
            ),
        )
        .unwrap();
        let status = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(status.success(), "chown of the PgBouncer directory");
        let child = Command::new("setpriv")
            .args([
                "--reuid=postgres",
                "--regid=postgres",
                "--clear-groups",
                "/usr/sbin/pgbouncer",
            ])
            .arg(&ini)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("/usr/sbin/pgbouncer starts (apt-get install pgbouncer)");
        let bouncer = PgBouncer { port, dir, child };
        let listens = || std::net::TcpStream::connect(("127.0.0.1", port)).ok();
        let listens =
            super::poll_blocking(Duration::from_secs(10), Duration::from_millis(20), listens);
        assert!(
            listens.is_some(),
            "PgBouncer did not listen within 10 s: {}",
            bouncer.log()
        );
        bouncer
    }

    /// `postgres://postgres@127.0.0.1:<port>/<db>`.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// PgBouncer's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("pgbouncer.log")).unwrap_or_default()
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
