//! Faults against the relay binary: process deaths (kill -9, SIGTERM, SIGSTOP), Redis and
//! Postgres outages and stalls (killed servers, proxies that stall or reject, read-only and OOM
//! Redis), and rows that fail (poison, invalid, dead-lettered and replayed).
//!
//! Every test uses only what it starts itself: a fresh database (`#[sqlx::test]`), a private
//! `redis-server` on a free port, a TCP proxy, relay child processes. None touches the shared
//! Redis. Each prints `FIGURES test=<name> relayed=<n> duplicates=<n> lost=<n>` where
//!
//! - `relayed`: distinct uuids the test found in Redis, each checked against the rows inserted;
//! - `duplicates`: job pushes that found their dedup marker already there, summed from the
//!   relays' per-batch debug log line ("batch committed", field `duplicates`). Complete except
//!   where a relay is killed with -9: a batch committed in the instant before the kill may not
//!   have logged, so there the figure is a lower bound, and the test prints how many delivered
//!   rows the logs miss;
//! - `lost`: uuids inserted that are neither pending, dead-lettered, nor in Redis. Always 0.

mod cluster;
mod dead_letters;
mod failover;
mod outages;
mod process;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::common::child::RelayChild;
use crate::common::layouts::{per_layout, TestLayout};
use crate::common::proxy::{Mode, Proxy};
use crate::common::redis_server::RedisServer;
use crate::common::*;
use rand::Rng;
use sqlx::PgPool;

/// A relay daemon child process whose JSON logs (debug for jobrelay) go to a file of [`Logs`].
struct Relay {
    child: RelayChild,
}

/// Where one test's relays write their logs.
struct Logs {
    dir: tempfile::TempDir,
    started: usize,
}

impl Logs {
    fn new() -> Self {
        Logs {
            dir: tempfile::tempdir().unwrap(),
            started: 0,
        }
    }

    /// Every log file written so far.
    fn files(&self) -> Vec<PathBuf> {
        (0..self.started)
            .map(|i| self.dir.path().join(format!("relay-{i}.log")))
            .collect()
    }

    /// Starts `jobrelay` (the daemon, unless `args` name a subcommand) against `db`, `redis`
    /// and `ns`, HTTP off, with its stderr in a new log file.
    fn start(&mut self, db: &str, redis: &str, ns: &Namespace, args: &[&str]) -> Relay {
        let log = self.dir.path().join(format!("relay-{}.log", self.started));
        self.started += 1;
        Relay {
            child: RelayChild::start_logged(
                db,
                redis,
                &ns.prefix,
                args,
                &log,
                "info,jobrelay=debug",
            ),
        }
    }
}

impl Drop for Logs {
    /// A failing test prints the end of each relay's log (CI keeps nothing else of them);
    /// with FAULTS_KEEP_LOGS set, the logs stay on disk for a post-mortem.
    fn drop(&mut self) {
        if std::thread::panicking() {
            for file in self.files() {
                let text = std::fs::read_to_string(&file).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                let tail = &lines[lines.len().saturating_sub(40)..];
                println!("--- the last {} lines of {}:", tail.len(), file.display());
                for line in tail {
                    println!("{line}");
                }
            }
        }
        if std::env::var_os("FAULTS_KEEP_LOGS").is_some() {
            let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap());
            println!("relay logs kept in {}", dir.keep().display());
        }
    }
}

impl Relay {
    /// Whether the process is still running.
    fn running(&mut self) -> bool {
        self.child.child.try_wait().unwrap().is_none()
    }

    /// SIGTERM, then the exit code and how long the exit took.
    async fn terminate(&mut self, deadline: Duration) -> (Option<i32>, Duration) {
        let t = Instant::now();
        self.child.signal("TERM");
        let code = self.child.wait(deadline).await;
        (code, t.elapsed())
    }
}

/// The JSON log lines of `files`.
fn log_lines(files: &[PathBuf]) -> Vec<serde_json::Value> {
    files
        .iter()
        .flat_map(|f| {
            std::fs::read_to_string(f)
                .unwrap_or_default()
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .collect::<Vec<_>>()
        })
        .collect()
}

fn message(line: &serde_json::Value) -> &str {
    line["message"].as_str().unwrap_or("")
}

/// Prints the health transitions the relays logged (outages, recoveries), for the record.
fn print_health(lines: &[serde_json::Value]) {
    for l in lines.iter().filter(|l| l.get("dependency").is_some()) {
        println!(
            "  {} {}: {}",
            l["timestamp"].as_str().unwrap_or(""),
            message(l),
            l["error"].as_str().unwrap_or("")
        );
    }
}

/// Lines whose message is exactly `msg`.
fn count_message(lines: &[serde_json::Value], msg: &str) -> usize {
    lines.iter().filter(|l| message(l) == msg).count()
}

/// Sums of the relay's "batch committed" debug lines.
#[derive(Debug, Default, Clone, Copy)]
struct Batches {
    batches: u64,
    claimed: u64,
    queued: u64,
    duplicates: u64,
    refused: u64,
    invalid: u64,
    dead_lettered: u64,
}

impl Batches {
    fn of(lines: &[serde_json::Value]) -> Batches {
        let mut b = Batches::default();
        for l in lines.iter().filter(|l| message(l) == "batch committed") {
            let n = |k: &str| l[k].as_u64().unwrap_or_else(|| panic!("{k} in {l}"));
            b.batches += 1;
            b.claimed += n("claimed");
            b.queued += n("queued");
            b.duplicates += n("duplicates");
            b.refused += n("refused");
            b.invalid += n("invalid");
            b.dead_lettered += n("dead_lettered");
        }
        b
    }

    /// Rows these batches deleted because their job is in Redis.
    fn delivered(&self) -> u64 {
        self.queued + self.duplicates
    }
}

fn figures(test: &str, relayed: usize, duplicates: u64, lost: usize) {
    println!("FIGURES test={test} relayed={relayed} duplicates={duplicates} lost={lost}");
}

/// Inserts `n` rows into queue `default`; returns their uuids.
async fn insert_bulk(pool: &PgPool, n: i64) -> HashSet<String> {
    insert_rows(pool, n, "default").await;
    pending_uuids(pool).await
}

async fn pending_uuids(pool: &PgPool) -> HashSet<String> {
    sqlx::query_scalar("SELECT uuid::text FROM pending_jobs")
        .fetch_all(pool)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

async fn dead_count(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM pending_jobs_dead")
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn max_attempts_pending(pool: &PgPool) -> i32 {
    sqlx::query_scalar("SELECT COALESCE(max(attempts), 0) FROM pending_jobs")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The uuids of the jobs in list `key` of the jobrelay layout (read straight from the server,
/// in chunks).
async fn list_uuids(ns: &Namespace, key: &str) -> Vec<String> {
    read_uuids(ns, &ns.key(key), |b| decode(b).uuid).await
}

/// The uuids of the jobs in `queue`, as `layout` wrote them.
async fn queue_uuids(ns: &Namespace, layout: TestLayout, queue: &str) -> Vec<String> {
    read_uuids(ns, &layout.queue_key(ns, queue), |b| layout.uuid_of(b)).await
}

async fn read_uuids(ns: &Namespace, key: &str, uuid_of: impl Fn(&[u8]) -> String) -> Vec<String> {
    let mut con = ns.con().await;
    let mut out = Vec::new();
    let step = 20_000isize;
    let mut start = 0isize;
    loop {
        let raw: Vec<Vec<u8>> = redis::cmd("LRANGE")
            .arg(key)
            .arg(start)
            .arg(start + step - 1)
            .query_async(&mut con)
            .await
            .unwrap();
        let n = raw.len();
        out.extend(raw.iter().map(|b| uuid_of(b)));
        if (n as isize) < step {
            return out;
        }
        start += step;
    }
}

/// Keys on the (private) Redis, leaving out the daemon's probe key `<ns>jobrelay:probe`.
async fn dbsize(ns: &Namespace) -> i64 {
    let mut con = ns.con().await;
    let all: i64 = redis::cmd("DBSIZE").query_async(&mut con).await.unwrap();
    let probe: i64 = redis::cmd("EXISTS")
        .arg(ns.key("jobrelay:probe"))
        .query_async(&mut con)
        .await
        .unwrap();
    all - probe
}

/// Runs one Redis command (`args[0]` and its arguments) on the server at `url`, ignoring the
/// answer.
async fn redis_cmd(url: &str, args: &[&str]) {
    let mut con = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    let _: redis::Value = cmd.query_async(&mut con).await.unwrap();
}

/// What the test found: uuids in Redis (how often each), and the check that nothing was lost.
struct Tally {
    /// Distinct uuids in the queue.
    relayed: usize,
    /// Uuids inserted that are neither pending nor in Redis.
    lost: Vec<String>,
    /// Uuids in Redis more than once.
    twice: Vec<String>,
    /// Uuids in Redis that were never inserted.
    strangers: Vec<String>,
    /// Uuids both pending and in Redis (pushed by a batch that did not commit).
    pending_and_pushed: usize,
}

fn tally(inserted: &HashSet<String>, in_redis: &[String], pending: &HashSet<String>) -> Tally {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for u in in_redis {
        *seen.entry(u.as_str()).or_default() += 1;
    }
    Tally {
        relayed: seen.len(),
        lost: inserted
            .iter()
            .filter(|u| !pending.contains(*u) && !seen.contains_key(u.as_str()))
            .cloned()
            .collect(),
        twice: seen
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(u, _)| u.to_string())
            .collect(),
        strangers: seen
            .keys()
            .filter(|u| !inserted.contains(**u))
            .map(|u| u.to_string())
            .collect(),
        pending_and_pushed: pending
            .iter()
            .filter(|u| seen.contains_key(u.as_str()))
            .count(),
    }
}

impl Tally {
    /// Nothing lost, nothing twice, nothing unknown.
    fn assert_exactly_once(&self) {
        assert!(
            self.lost.is_empty(),
            "{} lost, e.g. {:?}",
            self.lost.len(),
            &self.lost[..1]
        );
        assert!(
            self.twice.is_empty(),
            "{} uuids twice in redis, e.g. {:?}",
            self.twice.len(),
            &self.twice[..1]
        );
        assert!(
            self.strangers.is_empty(),
            "unknown uuids in redis: {:?}",
            &self.strangers[..1]
        );
    }
}

/// Deadline for draining `rows` in a debug build on a busy 2-core machine.
fn drain_deadline(rows: u64) -> Duration {
    Duration::from_secs(60 + rows / 500)
}

async fn wait_pending_at_most(pool: &PgPool, n: i64, deadline: Duration) {
    let p = pool;
    wait_until(
        &format!("at most {n} rows pending"),
        deadline,
        || async move { pending_count(p).await <= n },
    )
    .await;
}

/// Polls `pending` until it is at most `n`.
async fn wait_drained_to(pool: &PgPool, n: i64) {
    wait_pending_at_most(pool, n, drain_deadline(200_000)).await;
}

fn upstream(port: u16) -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], port))
}

/// The relay's sessions in this test's database that are inside a transaction, and the age of
/// the oldest such transaction in seconds.
async fn relay_transactions(pool: &PgPool) -> (i64, f64) {
    sqlx::query_as(
        "SELECT count(*), COALESCE(max(EXTRACT(EPOCH FROM now() - xact_start)), 0)::float8
         FROM pg_stat_activity
         WHERE datname = current_database() AND application_name = 'jobrelay'
           AND xact_start IS NOT NULL AND pid <> pg_backend_pid()",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}
