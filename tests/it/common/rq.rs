//! A real, unmodified RQ worker as a child process, for the rq layout's tests.
//!
//! [`RqWorker::start`] writes a small module of task functions (`jobs.py`, and `app/tasks.py`
//! for the docs' example) into a temporary directory and runs `rq worker --serializer json
//! --url <redis> <queues>` (with `--burst`, or `--with-scheduler` to run delayed jobs too), a
//! [`Worker`] (killed on drop; no readiness signal is waited for: the runs are). Each task
//! records what ran by appending one line to a file (a task that fails or sleeps records
//! first):
//!
//! ```text
//! <job id>\t<args as JSON>\t<kwargs as JSON>\t<meta as JSON>\t<unix time it ran>\t<func_name>
//! ```
//!
//! read back by [`RqApp::runs`]. [`RqApp::python`] runs a script with RQ's interpreter (RQ's own
//! client, for a baseline, or its API). RQ comes from `script/setup` (a venv at `/opt/jobrelay-rq`,
//! pinned), or from `JOBRELAY_RQ` (the path of an `rq` program whose directory also holds its
//! `python`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::worker::Worker;
use super::{wait_for_records, whole_lines};

/// Where `script/setup` installs RQ.
const DEFAULT_RQ: &str = "/opt/jobrelay-rq/bin/rq";

/// The task module: `jobs.record` takes any arguments and records them; `jobs.nap(seconds,
/// ...)` records, then sleeps that long; `jobs.span(seconds, ...)` records with the keyword
/// `phase` `start`, sleeps that long, and records again with `end`; `jobs.fail` records, then
/// raises.
const JOBS: &str = r#"
import json, os, time
from rq import get_current_job


def record(*args, **kwargs):
    job = get_current_job()
    line = "\t".join([
        job.id,
        json.dumps(list(args)),
        json.dumps(kwargs),
        json.dumps(job.meta),
        repr(time.time()),
        job.func_name,
    ])
    # One write of one line in append mode: whole lines even from several workers.
    fd = os.open(os.environ["JOBRELAY_TEST_RUNS"], os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def nap(seconds, *args, **kwargs):
    record(seconds, *args, **kwargs)
    time.sleep(seconds)


def span(seconds, *args, **kwargs):
    record(seconds, *args, phase="start", **kwargs)
    time.sleep(seconds)
    record(seconds, *args, phase="end", **kwargs)


def fail(*args, **kwargs):
    record(*args, **kwargs)
    raise RuntimeError("fails on purpose")
"#;

/// The docs' example task, `app.tasks.send_welcome`.
const APP_TASKS: &str = r#"
from jobs import record


def send_welcome(*args, **kwargs):
    return record(*args, **kwargs)
"#;

/// One recorded run.
#[derive(Debug, Clone)]
pub struct Run {
    pub id: String,
    pub args: serde_json::Value,
    pub kwargs: serde_json::Value,
    /// The job's `meta` (the row's headers).
    pub meta: serde_json::Value,
    /// Unix time (seconds) the job ran, by the worker's clock.
    pub at: f64,
    pub func: String,
}

/// The `rq` program.
pub fn rq_bin() -> PathBuf {
    let p = std::env::var_os("JOBRELAY_RQ")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_RQ));
    assert!(
        p.exists(),
        "rq not found at {} (script/test installs it; or set JOBRELAY_RQ)",
        p.display()
    );
    p
}

/// The directory of the task modules and the runs file, shared by the workers of a test.
pub struct RqApp {
    dir: tempfile::TempDir,
    runs: PathBuf,
    url: String,
}

impl RqApp {
    /// Task modules and an empty runs file, for workers on `url` (a `redis://` URL).
    pub fn new(url: &str) -> RqApp {
        let dir = tempfile::Builder::new()
            .prefix("jobrelay-rq-")
            .tempdir()
            .unwrap();
        std::fs::write(dir.path().join("jobs.py"), JOBS).unwrap();
        std::fs::create_dir(dir.path().join("app")).unwrap();
        std::fs::write(dir.path().join("app/__init__.py"), "").unwrap();
        std::fs::write(dir.path().join("app/tasks.py"), APP_TASKS).unwrap();
        let runs = dir.path().join("runs.tsv");
        std::fs::write(&runs, "").unwrap();
        RqApp {
            dir,
            runs,
            url: url.to_owned(),
        }
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("JOBRELAY_TEST_RUNS", self.runs.display().to_string()),
            ("JOBRELAY_TEST_REDIS", self.url.clone()),
            ("PYTHONPATH", self.dir.path().display().to_string()),
            ("PYTHONDONTWRITEBYTECODE", "1".to_owned()),
        ]
    }

    /// Starts `rq worker` on `queues` with the JSON serializer and `flags` (e.g. `--burst`,
    /// `--with-scheduler`); `name` names its log.
    pub fn worker(&self, name: &str, queues: &[&str], flags: &[&str]) -> RqWorker {
        let log = self.dir.path().join(format!("{name}.log"));
        let mut cmd = Command::new(rq_bin());
        cmd.arg("worker")
            .args(["--serializer", "json", "--url", &self.url])
            .args([
                "--name",
                &format!("jobrelay-test-{}-{name}", std::process::id()),
            ])
            .args(flags)
            .args(queues)
            .current_dir(self.dir.path())
            .envs(self.env());
        Worker::spawn("rq worker", cmd, log)
    }

    /// Every run recorded so far, in the order they were recorded.
    pub fn runs(&self) -> Vec<Run> {
        whole_lines(&self.runs)
            .iter()
            .map(|l| {
                let f: Vec<&str> = l.split('\t').collect();
                assert_eq!(f.len(), 6, "a run line: {l:?}");
                Run {
                    id: f[0].to_owned(),
                    args: serde_json::from_str(f[1]).unwrap(),
                    kwargs: serde_json::from_str(f[2]).unwrap(),
                    meta: serde_json::from_str(f[3]).unwrap(),
                    at: f[4].parse().unwrap(),
                    func: f[5].to_owned(),
                }
            })
            .collect()
    }

    /// Waits until at least `n` runs are recorded, at most `deadline`; `logs` tells what the
    /// workers said if not.
    pub async fn wait_runs(
        &self,
        n: usize,
        deadline: Duration,
        logs: impl Fn() -> String,
    ) -> Vec<Run> {
        wait_for_records("runs", n, deadline, || self.runs(), logs).await
    }

    /// Runs `script` (Python) with RQ's interpreter in the app's directory (`jobs` importable,
    /// `JOBRELAY_TEST_REDIS` the Redis URL); returns its standard output. Bounded by 30 s.
    pub fn python(&self, script: &str) -> String {
        run_python(self.dir.path(), &self.env(), script)
    }
}

/// A running `rq worker`.
pub type RqWorker = Worker;

/// Runs `script` with the python beside `rq`, in `dir`, with `env`.
fn run_python(dir: &Path, env: &[(&'static str, String)], script: &str) -> String {
    let python = rq_bin().parent().unwrap().join("python");
    super::scripts::run(&python, dir, env, "script.py", script)
}
