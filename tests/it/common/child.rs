//! The relay daemon as a child process: start, signal, kill -9, wait with a deadline.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

/// A running relay daemon.
pub struct RelayChild {
    pub child: Child,
}

fn command(database_url: &str, redis_url: &str, namespace: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(super::relay_bin());
    cmd.args(args)
        .env("DATABASE_URL", database_url)
        .env("REDIS_URL", redis_url)
        .env("JOBRELAY_NAMESPACE", namespace)
        .env("JOBRELAY_HTTP_ADDR", "off")
        .env("JOBRELAY_LOG_FORMAT", "json")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true);
    cmd
}

impl RelayChild {
    /// Starts `jobrelay` with `args`, against `database_url`, `redis_url` and `namespace`,
    /// HTTP off unless `args` say otherwise, logs to a piped stderr (dropped) unless
    /// JOBRELAY_TEST_LOGS is set.
    pub fn start(database_url: &str, redis_url: &str, namespace: &str, args: &[&str]) -> Self {
        let mut cmd = command(database_url, redis_url, namespace, args);
        if std::env::var_os("JOBRELAY_TEST_LOGS").is_none() {
            cmd.stderr(Stdio::null());
        }
        RelayChild::spawn(cmd)
    }

    /// Like [`RelayChild::start`], with the JSON logs written to the file `log` at the level
    /// `rust_log` (a `RUST_LOG` value), for tests that read what the relay said.
    pub fn start_logged(
        database_url: &str,
        redis_url: &str,
        namespace: &str,
        args: &[&str],
        log: &Path,
        rust_log: &str,
    ) -> Self {
        let mut cmd = command(database_url, redis_url, namespace, args);
        cmd.env("RUST_LOG", rust_log)
            .stderr(Stdio::from(std::fs::File::create(log).expect("log file")));
        RelayChild::spawn(cmd)
    }

    fn spawn(mut cmd: Command) -> Self {
        RelayChild {
            child: cmd.spawn().expect("relay binary starts"),
        }
    }

    /// The child's pid.
    pub fn pid(&self) -> i32 {
        self.child.id().expect("running") as i32
    }

    /// Sends a signal (`"TERM"`, `"KILL"`, `"INT"`) with kill(1).
    pub fn signal(&self, sig: &str) {
        let status = std::process::Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid().to_string())
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{sig} failed");
    }

    /// Waits for exit within `deadline`; returns the exit code (None if killed by a signal).
    pub async fn wait(&mut self, deadline: Duration) -> Option<i32> {
        tokio::time::timeout(deadline, self.child.wait())
            .await
            .expect("relay exited before the deadline")
            .expect("wait works")
            .code()
    }

    /// kill -9, then reap.
    pub async fn kill9(&mut self) {
        self.signal("KILL");
        let _ = self.wait(Duration::from_secs(10)).await;
    }
}
