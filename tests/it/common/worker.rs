//! One harness for a real runner's worker as a child process: the Sidekiq, Celery, RQ and
//! BullMQ workers and the reference consumer (`sidekiq.rs`, `celery.rs`, `rq.rs`, `bullmq.rs`,
//! `consumer.rs` say only what is their own: the command line, the readiness signal, how runs
//! are recorded).
//!
//! A [`Worker`] owns the child, which writes its standard output and error to a log file;
//! [`Worker::wait_ready`] waits for a runner's readiness signal within a deadline (and fails at
//! once, with the log, if the worker exits first); [`Worker::wait_records`] waits for the runs a
//! worker recorded in a file of its own; the worker is killed (SIGKILL) and reaped on drop.

use std::future::Future;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use super::{last_lines, poll, wait_for_records};

/// How often a worker's readiness and exit are looked at.
const EVERY: Duration = Duration::from_millis(50);

/// A running worker, killed on drop.
pub struct Worker {
    /// What it is, for failure messages ("sidekiq", "celery worker", ...).
    what: String,
    child: Mutex<Child>,
    log: PathBuf,
}

impl Worker {
    /// Spawns `cmd`, stdin closed, stdout and stderr appended to the file `log` (created).
    pub fn spawn(what: &str, mut cmd: Command, log: PathBuf) -> Worker {
        let out = std::fs::File::create(&log).expect("the worker's log file");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::from(out.try_clone().unwrap()))
            .stderr(Stdio::from(out))
            .spawn()
            .unwrap_or_else(|e| panic!("{what} starts: {e}"));
        Worker {
            what: what.to_owned(),
            child: Mutex::new(child),
            log,
        }
    }

    /// What the worker printed so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last `n` lines of what it printed (for a failure message).
    pub fn last_lines(&self, n: usize) -> String {
        last_lines(&self.logs(), n)
    }

    /// Its exit status, if it exited.
    fn exited(&self) -> Option<ExitStatus> {
        self.child.lock().unwrap().try_wait().expect("try_wait")
    }

    /// Waits until `ready()` holds (the runner's readiness signal, named `signal` in the
    /// failure message), at most `deadline`. Panics, with the log, if the worker exits first or
    /// the deadline passes.
    pub async fn wait_ready<F, Fut>(&self, signal: &str, deadline: Duration, mut ready: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let seen = poll(deadline, EVERY, || {
            let ready = ready();
            async move {
                if ready.await {
                    Some(Ok(()))
                } else {
                    self.exited().map(Err)
                }
            }
        })
        .await;
        match seen {
            Some(Ok(())) => {}
            Some(Err(status)) => panic!(
                "{} exited ({status}) before it was ready ({signal}); its log:\n{}",
                self.what,
                self.logs()
            ),
            None => panic!(
                "{} not ready ({signal}) after {deadline:?}; its log:\n{}",
                self.what,
                self.logs()
            ),
        }
    }

    /// Waits until its log contains `text` (the runner's readiness line), at most `deadline`.
    pub async fn wait_logged(&self, text: &str, deadline: Duration) {
        let signal = format!("its log says {text:?}");
        let logged = || async { self.logs().contains(text) };
        self.wait_ready(&signal, deadline, logged).await;
    }

    /// Reads `records` (the runs it recorded) until there are at least `n`, at most
    /// `deadline`; then returns them. On the deadline, panics with the last 40 lines of the log.
    pub async fn wait_records<T>(
        &self,
        n: usize,
        deadline: Duration,
        records: impl Fn() -> Vec<T>,
    ) -> Vec<T> {
        wait_for_records("runs", n, deadline, records, || self.last_lines(40)).await
    }

    /// Sends the signal `sig` (`"TERM"`, ...) with kill(1).
    pub fn signal(&self, sig: &str) {
        let pid = self.child.lock().unwrap().id();
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(pid.to_string())
            .status()
            .expect("kill runs")
            .success();
        assert!(ok, "kill -{sig} {pid}");
    }

    /// Waits until it exits, at most `deadline`; its exit status. Panics, with the log, if it
    /// is still running then.
    pub async fn wait_exit(&self, deadline: Duration) -> ExitStatus {
        poll(deadline, EVERY, || async { self.exited() })
            .await
            .unwrap_or_else(|| {
                panic!(
                    "{} still running after {deadline:?}; its log:\n{}",
                    self.what,
                    self.logs()
                )
            })
    }

    /// Kills it (SIGKILL: what it had not finished is lost) and reaps it.
    pub fn kill(&self) {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.kill();
    }
}
