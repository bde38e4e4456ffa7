//! The reference consumer of docs/consumer.md (`examples/consumer/jobrelay_consumer.py`) as a
//! child process, for the jobrelay layout's consumer tests.
//!
//! [`ConsumerProcess::start`] runs it against a namespace with `--record`: each job it runs
//! appends one JSON line ([`Run`]) to a file. Its Python comes from `script/setup` (a venv at
//! `/opt/jobrelay-consumer` with the pinned redis-py of `examples/consumer/requirements.txt`),
//! or from `JOBRELAY_CONSUMER_PYTHON`. A [`Worker`], killed on drop.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde::Deserialize;

use super::worker::Worker;
use super::{whole_lines, Namespace};

/// Where `script/setup` installs the consumer's Python.
const DEFAULT_PYTHON: &str = "/opt/jobrelay-consumer/bin/python";

/// One job the consumer ran.
#[derive(Debug, Clone, Deserialize)]
pub struct Run {
    pub uuid: String,
    pub queue: String,
    pub job_type: String,
    pub payload: String,
    pub parent_uuid: String,
    pub predecessor_uuid: String,
    /// The job's `run_at`, epoch seconds.
    pub run_at: Option<f64>,
    /// When its handler started and returned, epoch seconds (the consumer's clock).
    pub started: f64,
    pub finished: f64,
}

/// The Python that runs the consumer.
pub fn python() -> PathBuf {
    let p = std::env::var_os("JOBRELAY_CONSUMER_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_PYTHON));
    assert!(
        p.exists(),
        "no Python with redis-py at {} (script/test installs it; or set \
         JOBRELAY_CONSUMER_PYTHON)",
        p.display()
    );
    p
}

/// The script under test.
pub fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/consumer/jobrelay_consumer.py")
}

/// A running consumer.
pub struct ConsumerProcess {
    worker: Worker,
    dir: tempfile::TempDir,
}

impl ConsumerProcess {
    /// Starts the consumer with the id `id` on `queues` of `ns`, plus `args`.
    pub fn start(ns: &Namespace, id: &str, queues: &[&str], args: &[&str]) -> ConsumerProcess {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = Command::new(python());
        cmd.arg(script())
            .args(["--redis-url", &ns.url, "--namespace", &ns.prefix])
            .args(["--consumer-id", id])
            .arg("--record")
            .arg(dir.path().join("runs"))
            .args(args);
        for q in queues {
            cmd.args(["--queue", q]);
        }
        let log = dir.path().join("log");
        ConsumerProcess {
            worker: Worker::spawn("the consumer", cmd, log),
            dir,
        }
    }

    /// What it printed.
    pub fn logs(&self) -> String {
        self.worker.logs()
    }

    /// Every run recorded so far.
    pub fn runs(&self) -> Vec<Run> {
        whole_lines(&self.dir.path().join("runs"))
            .iter()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }

    /// At least `n` runs within `deadline`.
    pub async fn wait_runs(&self, n: usize, deadline: Duration) -> Vec<Run> {
        self.worker.wait_records(n, deadline, || self.runs()).await
    }

    /// SIGTERM, then its exit code within 10 s (it finishes the job in hand).
    pub async fn stop(&mut self) -> i32 {
        self.worker.signal("TERM");
        let status = self.worker.wait_exit(Duration::from_secs(10)).await;
        status.code().unwrap_or(-1)
    }
}
