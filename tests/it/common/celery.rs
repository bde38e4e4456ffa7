//! A real, unmodified Celery worker as a child process, for the celery layout's tests.
//!
//! [`CeleryWorker::start`] writes a small app module (`app.py`) into a temporary directory and
//! runs `celery -A app worker -Q <queues> --pool threads -c 4 --without-gossip --without-mingle
//! --without-heartbeat` against a broker URL (a private redis-server), a [`Worker`] (killed on
//! drop), ready once it says ` ready.` ([`CeleryWorker::start_with`]: another pool, concurrency,
//! results kept). Each task
//! of the app records what ran by appending one line to a file:
//!
//! ```text
//! <task id>\t<args as JSON>\t<kwargs as JSON>\t<traceparent or empty>\t<unix time it ran>\t<task name>
//! ```
//!
//! read back by [`CeleryWorker::runs`]. [`CeleryWorker::send`] sends tasks with celery's own
//! client (`apply_async`), e.g. for a baseline. Celery comes from `script/setup` (a venv at
//! `/opt/jobrelay-celery`, pinned), or from `JOBRELAY_CELERY` (the path of a `celery` program
//! whose directory also holds its `python`).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use super::whole_lines;
use super::worker::Worker;

/// Where `script/setup` installs celery.
const DEFAULT_CELERY: &str = "/opt/jobrelay-celery/bin/celery";

/// The app module. Its tasks take any arguments and record them.
const APP: &str = r#"
import json, os, threading, time
from celery import Celery

app = Celery("app", broker=os.environ["JOBRELAY_TEST_BROKER"])
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    broker_connection_retry_on_startup=True,
)
if os.environ.get("JOBRELAY_TEST_RESULTS"):
    # Results kept with the request's details (retries), in the broker's Redis.
    app.conf.update(
        result_backend=os.environ["JOBRELAY_TEST_BROKER"], result_extended=True
    )
prefix = os.environ.get("JOBRELAY_TEST_KEYPREFIX", "")
if prefix:
    app.conf.broker_transport_options = {"global_keyprefix": prefix}

_RUNS = os.environ["JOBRELAY_TEST_RUNS"]
_lock = threading.Lock()


def _record(self, *args, **kwargs):
    line = "\t".join([
        self.request.id,
        json.dumps(list(args)),
        json.dumps(kwargs),
        getattr(self.request, "traceparent", None) or "",
        repr(time.time()),
        self.name,
    ])
    with _lock:
        with open(_RUNS, "a") as f:
            f.write(line + "\n")


for _name in os.environ["JOBRELAY_TEST_TASKS"].split(","):
    app.task(name=_name, bind=True)(_record)


@app.task(name=SLEEP_TASK, bind=True)
def _sleep(self, seconds, *args, **kwargs):
    _record(self, seconds, *args, **kwargs)
    time.sleep(seconds)
"#;

/// A task of every worker's app that records its run, then sleeps its first argument's seconds.
pub const SLEEP_TASK: &str = "jobs.sleep";

/// How a worker runs its tasks.
#[derive(Debug, Clone)]
pub struct Setup {
    /// `--pool`: `threads` (starts fast), `prefork` (enforces time limits).
    pub pool: &'static str,
    /// `-c`: how many tasks run at once.
    pub concurrency: u32,
    /// Whether tasks store their results (`result_extended`) in the broker's Redis, under
    /// celery's `celery-task-meta-<id>`.
    pub results: bool,
}

impl Default for Setup {
    /// `--pool threads -c 4`, no results.
    fn default() -> Setup {
        Setup {
            pool: "threads",
            concurrency: 4,
            results: false,
        }
    }
}

/// One recorded run.
#[derive(Debug, Clone)]
pub struct Run {
    pub id: String,
    pub args: serde_json::Value,
    pub kwargs: serde_json::Value,
    pub traceparent: String,
    /// Unix time (seconds) the task ran, by the worker's clock.
    pub at: f64,
    pub task: String,
}

/// A running celery worker.
pub struct CeleryWorker {
    worker: Worker,
    dir: tempfile::TempDir,
    runs: PathBuf,
    celery: PathBuf,
    env: Vec<(&'static str, String)>,
}

/// The `celery` program.
pub fn celery_bin() -> PathBuf {
    let p = std::env::var_os("JOBRELAY_CELERY")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CELERY));
    assert!(
        p.exists(),
        "celery not found at {} (script/test installs it; or set JOBRELAY_CELERY)",
        p.display()
    );
    p
}

impl CeleryWorker {
    /// Starts a worker consuming `queues` from `broker` (a `redis://` URL) with kombu's
    /// `global_keyprefix` `prefix` (the relay's `--namespace`), with tasks named `tasks`; waits
    /// until it says it is ready (at most 30 s).
    pub async fn start(
        broker: &str,
        prefix: &str,
        queues: &[&str],
        tasks: &[&str],
    ) -> CeleryWorker {
        CeleryWorker::start_with(broker, prefix, queues, tasks, &Setup::default()).await
    }

    /// [`CeleryWorker::start`] with another [`Setup`].
    pub async fn start_with(
        broker: &str,
        prefix: &str,
        queues: &[&str],
        tasks: &[&str],
        setup: &Setup,
    ) -> CeleryWorker {
        let celery = celery_bin();
        let dir = tempfile::Builder::new()
            .prefix("jobrelay-celery-")
            .tempdir()
            .unwrap();
        let app = format!("SLEEP_TASK = {SLEEP_TASK:?}\n{APP}");
        std::fs::write(dir.path().join("app.py"), app).unwrap();
        let log = dir.path().join("worker.log");
        let runs = dir.path().join("runs.tsv");
        std::fs::write(&runs, "").unwrap();
        let mut env = vec![
            ("JOBRELAY_TEST_BROKER", broker.to_owned()),
            ("JOBRELAY_TEST_KEYPREFIX", prefix.to_owned()),
            ("JOBRELAY_TEST_RUNS", runs.display().to_string()),
            ("JOBRELAY_TEST_TASKS", tasks.join(",")),
            ("PYTHONPATH", dir.path().display().to_string()),
            ("PYTHONDONTWRITEBYTECODE", "1".to_owned()),
        ];
        if setup.results {
            env.push(("JOBRELAY_TEST_RESULTS", "1".to_owned()));
        }
        let mut cmd = Command::new(&celery);
        cmd.args(["-A", "app", "worker", "-Q", &queues.join(",")])
            .args(["--pool", setup.pool, "-c", &setup.concurrency.to_string()])
            .args([
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ])
            .args(["-l", "info", "-n"])
            .arg(format!("jobrelay-test-{}@%h", std::process::id()))
            .current_dir(dir.path())
            .envs(env.iter().map(|(k, v)| (k, v)));
        let worker = Worker::spawn("celery worker", cmd, log);
        worker.wait_logged(" ready.", Duration::from_secs(30)).await;
        CeleryWorker {
            worker,
            dir,
            runs,
            celery,
            env,
        }
    }

    /// What the worker printed.
    pub fn logs(&self) -> String {
        self.worker.logs()
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
                    traceparent: f[3].to_owned(),
                    at: f[4].parse().unwrap(),
                    task: f[5].to_owned(),
                }
            })
            .collect()
    }

    /// Waits until at least `n` runs are recorded, at most `deadline`.
    pub async fn wait_runs(&self, n: usize, deadline: Duration) -> Vec<Run> {
        self.worker.wait_records(n, deadline, || self.runs()).await
    }

    /// Stops the worker as an operator would (`TERM`: a warm shutdown, its pool's processes
    /// with it), at most 30 s.
    pub async fn stop(self) {
        self.worker.signal("TERM");
        self.worker.wait_exit(Duration::from_secs(30)).await;
    }

    /// Sends the signal `sig` (`"STOP"`, ...) to the worker's main process.
    pub fn signal(&self, sig: &str) {
        self.worker.signal(sig);
    }

    /// Kills the worker's main process (SIGKILL) and reaps it.
    pub fn kill(&self) {
        self.worker.kill();
    }

    /// The last `n` lines of what it printed (for a failure message).
    pub fn last_lines(&self, n: usize) -> String {
        self.worker.last_lines(n)
    }

    /// Runs `script` (Python) with celery's interpreter, the app importable as `app` (its tasks
    /// as `app.app.tasks[name]`), e.g. to send tasks with celery's own client; returns its
    /// standard output. Bounded by 30 s.
    pub fn python(&self, script: &str) -> String {
        run_python(&self.celery, self.dir.path(), &self.env, script)
    }
}

/// Runs `script` (Python) with celery's interpreter, celery importable, no worker; returns its
/// standard output. Bounded by 30 s.
pub fn python(script: &str) -> String {
    let dir = tempfile::Builder::new()
        .prefix("jobrelay-celery-")
        .tempdir()
        .unwrap();
    run_python(&celery_bin(), dir.path(), &[], script)
}

/// Runs `script` with the python beside `celery`, in `dir`, with `env`.
fn run_python(
    celery: &std::path::Path,
    dir: &std::path::Path,
    env: &[(&'static str, String)],
    script: &str,
) -> String {
    let python = celery.parent().unwrap().join("python");
    super::scripts::run(&python, dir, env, "script.py", script)
}
