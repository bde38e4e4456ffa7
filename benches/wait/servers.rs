//! A private Redis primary and its replica (`redis-server`, no persistence, free ports, a
//! temporary directory), killed on drop and by the signal handler.

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::support::redis_info;
use super::BoxError;

/// The servers started; killed when the last clone is dropped, or by [`Servers::kill`].
#[derive(Clone, Default)]
pub struct Servers(Arc<Mutex<Vec<Child>>>);

/// A primary and a replica in sync, and the directory they run in.
pub struct Pair {
    pub servers: Servers,
    pub primary: redis::Client,
    _dir: tempfile::TempDir,
}

impl Servers {
    fn start(&self, port: u16, dir: &std::path::Path, extra: &[String]) -> Result<(), BoxError> {
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(dir)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        self.0.lock().unwrap().push(child);
        Ok(())
    }

    pub fn kill(&self) {
        for mut c in self.0.lock().unwrap().drain(..) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        if Arc::strong_count(&self.0) == 1 {
            self.kill();
        }
    }
}

fn free_port() -> Result<u16, BoxError> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Pair {
    /// Starts the primary and the replica into `servers` and waits (at most 20 s) until the
    /// replica is in sync.
    pub async fn start(servers: Servers) -> Result<Pair, BoxError> {
        let dir = tempfile::tempdir()?;
        let (p, r) = (free_port()?, free_port()?);
        let (pdir, rdir) = (dir.path().join("p"), dir.path().join("r"));
        std::fs::create_dir_all(&pdir)?;
        std::fs::create_dir_all(&rdir)?;
        servers.start(p, &pdir, &[])?;
        servers.start(
            r,
            &rdir,
            &["--replicaof".into(), "127.0.0.1".into(), p.to_string()],
        )?;
        let primary = redis::Client::open(format!("redis://127.0.0.1:{p}"))?;
        let replica = redis::Client::open(format!("redis://127.0.0.1:{r}"))?;
        let started = Instant::now();
        loop {
            let ok = match (
                redis_info::info(&primary, "replication").await,
                redis_info::info(&replica, "replication").await,
            ) {
                (Some(a), Some(b)) => {
                    a.contains("connected_slaves:1") && b.contains("master_link_status:up")
                }
                _ => false,
            };
            if ok {
                break;
            }
            if started.elapsed() > Duration::from_secs(20) {
                return Err("the replica did not sync within 20 s".into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(Pair {
            servers,
            primary,
            _dir: dir,
        })
    }
}
