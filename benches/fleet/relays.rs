//! The relay processes of a run: the real binary, started with the defaults (`--http-addr off
//! --log-format json --workers W`, `RUST_LOG=info,jobrelay=debug`), each logging to a file of
//! its own; ready when its log says it reached Postgres and Redis; stopped with SIGTERM and
//! required to exit 0.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

use super::outbox::RELAY_APP;
use super::support::procfs;
use super::support::sandbox::Sandbox;
use super::{Args, BoxError, Shape};

/// How long a relay may take to exit after SIGTERM (its `--shutdown-timeout` is 25 s).
const EXIT_DEADLINE: Duration = Duration::from_secs(40);

/// Where the relays of the sandbox log: `<tmp>/<database>`.
pub fn log_dir(sb: &Sandbox) -> PathBuf {
    std::env::temp_dir().join(sb.db_name())
}

/// One relay process.
pub struct Relay {
    child: Child,
    pid: u32,
    pub log: PathBuf,
}

/// Time given to the relays' workers to start after their logs say they are connected.
const SETTLE: Duration = Duration::from_millis(300);

/// The relay processes of one run. Dropped without [`Fleet::stop`] (a failed run), it kills
/// them.
pub struct Fleet {
    pub relays: Vec<Relay>,
    registry: Arc<Mutex<HashSet<u32>>>,
}

impl Fleet {
    /// Starts `shape.processes` relays of `shape.workers` workers, logging to
    /// `<log_dir>/<name>-p<i>.log`.
    pub fn start(sb: &Sandbox, args: &Args, shape: Shape, name: &str) -> Result<Fleet, BoxError> {
        let mut fleet = Fleet {
            relays: Vec::with_capacity(shape.processes),
            registry: sb.scratch.children.clone(),
        };
        for i in 0..shape.processes {
            let log = log_dir(sb).join(format!("{name}-p{i}.log"));
            let mut cmd = Command::new(&args.relay_bin);
            // The relays run with the defaults, whatever this shell exports.
            for (k, _) in std::env::vars_os() {
                if k.to_string_lossy().starts_with("JOBRELAY_") {
                    cmd.env_remove(k);
                }
            }
            cmd.args(["--http-addr", "off", "--log-format", "json", "--workers"])
                .arg(shape.workers.to_string())
                .arg("--namespace")
                .arg(sb.namespace())
                .env("DATABASE_URL", sb.url(Some(RELAY_APP)))
                .env("REDIS_URL", &args.redis_url)
                .env("RUST_LOG", "info,jobrelay=debug")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::from(std::fs::File::create(&log)?))
                .kill_on_drop(true);
            let child = cmd
                .spawn()
                .map_err(|e| format!("starting {}: {e}", args.relay_bin.display()))?;
            let pid = child.id().ok_or("a relay exited at once")?;
            fleet.registry.lock().unwrap().insert(pid);
            fleet.relays.push(Relay { child, pid, log });
        }
        Ok(fleet)
    }

    /// Waits until every relay has reached Postgres and Redis (its log says both
    /// "connected"), then [`SETTLE`] for its workers to start.
    pub async fn wait_ready(&mut self) -> Result<(), BoxError> {
        let t0 = Instant::now();
        loop {
            self.check_alive()?;
            let ready = self.relays.iter().all(|r| {
                let text = std::fs::read_to_string(&r.log).unwrap_or_default();
                text.contains("\"postgres connected\"") && text.contains("\"redis connected\"")
            });
            if ready {
                tokio::time::sleep(SETTLE).await;
                return Ok(());
            }
            if t0.elapsed() > Duration::from_secs(60) {
                return Err("relays not connected after 60 s".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// An error if a relay exited (none should before SIGTERM).
    pub fn check_alive(&mut self) -> Result<(), BoxError> {
        for r in &mut self.relays {
            if let Some(status) = r.child.try_wait()? {
                self.registry.lock().unwrap().remove(&r.pid);
                return Err(format!(
                    "relay {} exited early ({status}); its log ends with:\n{}",
                    r.pid,
                    log_tail(&r.log)
                )
                .into());
            }
        }
        Ok(())
    }

    /// CPU seconds of the relay processes so far.
    pub fn cpu_seconds(&self) -> f64 {
        self.relays
            .iter()
            .filter_map(|r| procfs::process_cpu_seconds(r.pid))
            .sum()
    }

    /// CPU counters of each relay process now (for [`procfs::ProcessCpu::since`]).
    pub fn cpu(&self) -> Vec<procfs::ProcessCpu> {
        self.relays
            .iter()
            .map(|r| procfs::process_cpu(r.pid))
            .collect()
    }

    /// SIGTERM to every relay, then waits for each to exit 0.
    pub async fn stop(&mut self) -> Result<(), BoxError> {
        for r in &self.relays {
            let status = std::process::Command::new("kill")
                .arg("-TERM")
                .arg(r.pid.to_string())
                .status()?;
            if !status.success() {
                return Err(format!("kill -TERM {} failed", r.pid).into());
            }
        }
        for r in &mut self.relays {
            let status = tokio::time::timeout(EXIT_DEADLINE, r.child.wait())
                .await
                .map_err(|_| {
                    format!(
                        "relay {} still running {EXIT_DEADLINE:?} after SIGTERM",
                        r.pid
                    )
                })??;
            self.registry.lock().unwrap().remove(&r.pid);
            if status.code() != Some(0) {
                return Err(format!(
                    "relay {} exited with {status} after SIGTERM (expected 0); its log ends \
                     with:\n{}",
                    r.pid,
                    log_tail(&r.log)
                )
                .into());
            }
        }
        Ok(())
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        let mut registry = self.registry.lock().unwrap();
        for r in &mut self.relays {
            if registry.remove(&r.pid) {
                let _ = r.child.start_kill();
            }
        }
    }
}

/// The last lines of a log file.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(8)..].join("\n")
}
