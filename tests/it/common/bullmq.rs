//! A real, unmodified BullMQ `Worker` as a child process, for the bullmq layout's tests.
//!
//! [`BullmqWorker::start`] writes a small Node program (`worker.js`) into a temporary directory
//! and runs it with `node` against a Redis (a private redis-server): per queue a `QueueEvents`
//! reading the queue's events stream from its start, and a `Worker` (concurrency 4, completed
//! jobs removed: `removeOnComplete: {count: 0}`, the worker's form of `removeOnComplete: true`),
//! a [`Worker`] (killed on drop), ready once it prints `workers ready`. Each run appends one
//! JSON line to a file:
//!
//! ```text
//! {"id": <job id>, "name": <job name>, "queue": <queue>, "data": <JSON.stringify(job.data)>,
//!  "at": <unix time it ran, seconds>, "timestamp": <job.timestamp>, "delay": <job.delay>,
//!  "attempts": <job.opts.attempts>}
//! ```
//!
//! read back by [`BullmqWorker::runs`]; each event seen (`added`, `waiting`, `delayed`,
//! `completed`) one line `{"queue", "event", "jobId"}`, read by [`BullmqWorker::events`].
//! [`BullmqWorker::node`] runs a script with BullMQ importable, e.g. `Queue.add` for a baseline
//! or `Queue.getJobCounts`. BullMQ comes from `script/setup` (`/opt/jobrelay-bullmq/node_modules`,
//! pinned), or from `JOBRELAY_BULLMQ` (a directory holding `node_modules/bullmq`).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use super::whole_lines;
use super::worker::Worker;

/// Where `script/setup` installs BullMQ.
const DEFAULT_BULLMQ: &str = "/opt/jobrelay-bullmq";

/// The worker program.
const WORKER: &str = r#"
const fs = require('fs');
const { Worker, QueueEvents } = require('bullmq');
const { Cluster } = require('ioredis');
const node = { host: '127.0.0.1', port: Number(process.env.JOBRELAY_TEST_PORT) };
// On a Redis Cluster: ioredis's Cluster client, found from one node (BullMQ's prefix then has a
// hash tag).
const connection = process.env.JOBRELAY_TEST_CLUSTER
  ? new Cluster([node], { redisOptions: { maxRetriesPerRequest: null } })
  : node;
const prefix = process.env.JOBRELAY_TEST_PREFIX;
const runs = process.env.JOBRELAY_TEST_RUNS;
const events = process.env.JOBRELAY_TEST_EVENTS;
(async () => {
  for (const queue of process.env.JOBRELAY_TEST_QUEUES.split(',').filter(Boolean)) {
    const qe = new QueueEvents(queue, { connection, prefix, lastEventId: '0-0' });
    for (const event of ['added', 'waiting', 'delayed', 'completed']) {
      qe.on(event, (args) => fs.appendFileSync(events,
        JSON.stringify({ queue, event, jobId: args.jobId }) + '\n'));
    }
    await qe.waitUntilReady();
    const w = new Worker(queue, async (job) => {
      fs.appendFileSync(runs, JSON.stringify({
        id: job.id, name: job.name, queue, data: JSON.stringify(job.data),
        at: Date.now() / 1000, timestamp: job.timestamp, delay: job.delay,
        attempts: job.opts.attempts,
      }) + '\n');
      return 'ok';
    }, { connection, prefix, concurrency: 4, removeOnComplete: { count: 0 } });
    w.on('error', (e) => console.error('worker error', e));
    w.on('failed', (job, e) => console.error('job failed', job && job.id, e));
    await w.waitUntilReady();
  }
  console.log('workers ready');
})().catch((e) => { console.error(e); process.exit(1); });
"#;

/// One recorded run.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Run {
    pub id: String,
    pub name: String,
    pub queue: String,
    /// `JSON.stringify(job.data)`.
    pub data: String,
    /// Unix time (seconds) the job ran, by the worker's clock.
    pub at: f64,
    pub timestamp: f64,
    pub delay: f64,
    pub attempts: i64,
}

/// One event a `QueueEvents` saw.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Event {
    pub queue: String,
    pub event: String,
    #[serde(rename = "jobId")]
    pub job_id: String,
}

/// A running worker program.
pub struct BullmqWorker {
    worker: Worker,
    dir: tempfile::TempDir,
    runs: PathBuf,
    events: PathBuf,
    env: Vec<(&'static str, String)>,
}

/// The directory holding `node_modules/bullmq`.
pub fn bullmq_dir() -> PathBuf {
    let p = std::env::var_os("JOBRELAY_BULLMQ")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_BULLMQ));
    assert!(
        p.join("node_modules/bullmq").exists(),
        "bullmq not found in {}/node_modules (script/test installs it; or set \
         JOBRELAY_BULLMQ)",
        p.display()
    );
    p
}

impl BullmqWorker {
    /// Starts workers for `queues` on the Redis at 127.0.0.1:`port` with BullMQ's `prefix`
    /// (the relay's `--namespace` without its last ':'); waits until they are ready (30 s).
    pub async fn start(port: u16, prefix: &str, queues: &[&str]) -> BullmqWorker {
        BullmqWorker::start_with(port, prefix, queues, false).await
    }

    /// As [`BullmqWorker::start`], on the Redis Cluster that the node at `port` belongs to,
    /// through ioredis's `Cluster` client.
    pub async fn start_on_cluster(port: u16, prefix: &str, queues: &[&str]) -> BullmqWorker {
        BullmqWorker::start_with(port, prefix, queues, true).await
    }

    async fn start_with(port: u16, prefix: &str, queues: &[&str], cluster: bool) -> BullmqWorker {
        let dir = tempfile::Builder::new()
            .prefix("jobrelay-bullmq-")
            .tempdir()
            .unwrap();
        std::fs::write(dir.path().join("worker.js"), WORKER).unwrap();
        let log = dir.path().join("worker.log");
        let runs = dir.path().join("runs.jsonl");
        let events = dir.path().join("events.jsonl");
        std::fs::write(&runs, "").unwrap();
        std::fs::write(&events, "").unwrap();
        let mut env = vec![
            ("JOBRELAY_TEST_PORT", port.to_string()),
            ("JOBRELAY_TEST_PREFIX", prefix.to_owned()),
            ("JOBRELAY_TEST_QUEUES", queues.join(",")),
            ("JOBRELAY_TEST_RUNS", runs.display().to_string()),
            ("JOBRELAY_TEST_EVENTS", events.display().to_string()),
            (
                "NODE_PATH",
                bullmq_dir().join("node_modules").display().to_string(),
            ),
        ];
        if cluster {
            env.push(("JOBRELAY_TEST_CLUSTER", "1".to_owned()));
        }
        let mut cmd = Command::new("node");
        cmd.arg(dir.path().join("worker.js"))
            .current_dir(dir.path())
            .envs(env.iter().map(|(k, v)| (k, v)));
        let worker = Worker::spawn("bullmq worker", cmd, log);
        worker
            .wait_logged("workers ready", Duration::from_secs(30))
            .await;
        BullmqWorker {
            worker,
            dir,
            runs,
            events,
            env,
        }
    }

    /// Kills the worker program (SIGKILL: its connections are closed by the kernel, not by
    /// BullMQ) and reaps it.
    pub fn kill(&self) {
        self.worker.kill();
    }

    /// What the worker printed.
    pub fn logs(&self) -> String {
        self.worker.logs()
    }

    /// Every run recorded so far, in the order they were recorded.
    pub fn runs(&self) -> Vec<Run> {
        whole_lines(&self.runs)
            .iter()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("a run line {l:?}: {e}")))
            .collect()
    }

    /// Every event seen so far.
    pub fn events(&self) -> Vec<Event> {
        whole_lines(&self.events)
            .iter()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("an event line {l:?}: {e}")))
            .collect()
    }

    /// Waits until at least `n` runs are recorded, at most `deadline`.
    pub async fn wait_runs(&self, n: usize, deadline: Duration) -> Vec<Run> {
        self.worker.wait_records(n, deadline, || self.runs()).await
    }

    /// Runs `script` (JavaScript) with node, BullMQ importable and the worker's environment
    /// (`JOBRELAY_TEST_PORT`, `JOBRELAY_TEST_PREFIX`); returns its standard output. Bounded by
    /// 30 s.
    pub fn node(&self, script: &str) -> String {
        let node = std::path::Path::new("node");
        super::scripts::run(node, self.dir.path(), &self.env, "script.js", script)
    }
}
