//! The "failures" issue: fault tests against the relay binary.
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

mod common;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::child::RelayChild;
use common::proxy::{Mode, Proxy};
use common::redis_server::RedisServer;
use common::*;
use rand::Rng;
use sqlx::PgPool;

// ---------------------------------------------------------------------------------------------
// Support: relays whose logs go to files, log totals, Redis and table contents.
// ---------------------------------------------------------------------------------------------

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
    /// With FAULTS_KEEP_LOGS set, the relays' logs stay on disk for a post-mortem.
    fn drop(&mut self) {
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

/// The uuids of the jobs in list `key` (read straight from the server, in chunks).
async fn list_uuids(ns: &Namespace, key: &str) -> Vec<String> {
    let mut con = ns.con().await;
    let mut out = Vec::new();
    let step = 20_000isize;
    let mut start = 0isize;
    loop {
        let raw: Vec<Vec<u8>> = redis::cmd("LRANGE")
            .arg(ns.key(key))
            .arg(start)
            .arg(start + step - 1)
            .query_async(&mut con)
            .await
            .unwrap();
        let n = raw.len();
        out.extend(raw.iter().map(|b| decode(b).uuid));
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

// ---------------------------------------------------------------------------------------------
// 1. kill -9 at five random moments of a 50,000-row drain.
// ---------------------------------------------------------------------------------------------

#[sqlx::test]
async fn kill_9_five_times_during_a_drain_loses_and_doubles_nothing(pool: PgPool) {
    const ROWS: i64 = 50_000;
    let redis = RedisServer::start();
    let ns = Namespace::on(&redis.url());
    let db = database_url_of(&pool).await;
    let inserted = insert_bulk(&pool, ROWS).await;
    let mut logs = Logs::new();
    let mut rng = rand::rng();

    // Five moments, one drawn at random in each fifth of the first 45,000 rows, then a random
    // few milliseconds more so that the kill lands anywhere in a batch's claim-push-commit.
    for k in 0..5 {
        let drained = rng.random_range(k * 9_000 + 500..(k + 1) * 9_000);
        let mut relay = logs.start(&db, &redis.url(), &ns, &[]);
        wait_drained_to(&pool, ROWS - drained).await;
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..80))).await;
        assert!(relay.running(), "relay {k} exited on its own");
        relay.child.kill9().await;
        let pending = pending_count(&pool).await;
        println!("kill {k}: after {drained}+ rows drained, {pending} pending");
        assert!(pending > 0, "kill {k} came after the drain ended");
    }
    let mut relay = logs.start(&db, &redis.url(), &ns, &[]);
    wait_drained_to(&pool, 0).await;
    let (code, _) = relay.terminate(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0));

    let in_redis = list_uuids(&ns, "queue:default").await;
    let t = tally(&inserted, &in_redis, &HashSet::new());
    t.assert_exactly_once();
    assert_eq!(in_redis.len(), ROWS as usize);
    assert_eq!(dead_count(&pool).await, 0);
    // One marker per job and the queue: nothing else was written.
    assert_eq!(dbsize(&ns).await, ROWS + 1);
    let b = Batches::of(&log_lines(&logs.files()));
    assert_eq!(b.refused + b.invalid + b.dead_lettered, 0, "{b:?}");
    // A killed relay may have committed a batch without logging it, never the reverse.
    assert!(b.delivered() <= ROWS as u64, "{b:?}");
    let duplicates = b.duplicates;
    println!(
        "kill-9: duplicates by relay logs {} (rows of batches committed \
         but not logged before a kill: {}); {b:?}",
        b.duplicates,
        ROWS as u64 - b.delivered()
    );
    figures("kill_9", t.relayed, duplicates, t.lost.len());
}

// ---------------------------------------------------------------------------------------------
// 2. Redis killed mid-drain, back on the same port 5 s later (with its append-only file).
// ---------------------------------------------------------------------------------------------

#[sqlx::test]
async fn redis_killed_mid_drain_and_restarted_everything_arrives_once(pool: PgPool) {
    const ROWS: i64 = 50_000;
    // appendfsync always: every write Redis acknowledged is on disk before the reply, so what
    // the relay saw acknowledged survives kill -9, and "every uuid exactly once" is checkable.
    let mut redis = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let ns = Namespace::on(&redis.url());
    let db = database_url_of(&pool).await;
    let inserted = insert_bulk(&pool, ROWS).await;
    let mut logs = Logs::new();
    let mut relay = logs.start(&db, &redis.url(), &ns, &["--push-timeout", "2s"]);

    wait_drained_to(&pool, ROWS - 10_000).await;
    redis.kill();
    let killed = Instant::now();
    // The batch in flight settles within --push-timeout (2 s): it rolls back, or commits the
    // script calls Redis acknowledged before it died and keeps the rest.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let pending_early = pending_count(&pool).await;
    assert!(pending_early > 0);
    // Redis stays down 5 s: nothing more may be deleted, and no row may count an attempt.
    while killed.elapsed() < Duration::from_secs(5) {
        assert_eq!(
            max_attempts_pending(&pool).await,
            0,
            "an outage counted an attempt"
        );
        assert_eq!(dead_count(&pool).await, 0);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        pending_count(&pool).await,
        pending_early,
        "rows deleted while Redis was down"
    );
    assert!(relay.running());
    redis.restart();

    wait_drained_to(&pool, 0).await;
    let (code, _) = relay.terminate(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0));

    let in_redis = list_uuids(&ns, "queue:default").await;
    let t = tally(&inserted, &in_redis, &HashSet::new());
    t.assert_exactly_once();
    assert_eq!(in_redis.len(), ROWS as usize);
    assert_eq!(dead_count(&pool).await, 0);
    let lines = log_lines(&logs.files());
    let b = Batches::of(&lines);
    // The relay was never killed: its log accounts for every row.
    assert_eq!(b.delivered(), ROWS as u64, "{b:?}");
    assert_eq!(b.refused + b.dead_lettered, 0, "{b:?}");
    // The outage is logged once, and so is the recovery.
    print_health(&lines);
    assert_eq!(
        count_message(&lines, "redis unavailable; retrying with backoff"),
        1
    );
    assert_eq!(count_message(&lines, "redis recovered"), 1);
    // Redis restarted, so its command counters did too: the relay's log (complete, since the
    // relay ran throughout) gives the duplicates.
    println!(
        "redis-restart: duplicates by relay logs {}; {b:?}",
        b.duplicates
    );
    figures("redis_restart", t.relayed, b.duplicates, t.lost.len());
}

// ---------------------------------------------------------------------------------------------
// 3. Redis traffic stalled 10 s by a proxy: push timeout, rollback, resume.
// ---------------------------------------------------------------------------------------------

#[sqlx::test]
async fn stalled_redis_times_out_rolls_back_and_resumes(pool: PgPool) {
    const ROWS: i64 = 30_000;
    let redis = RedisServer::start();
    let proxy = Proxy::start(upstream(redis.port));
    let ns = Namespace::on(&redis.url());
    let db = database_url_of(&pool).await;
    let inserted = insert_bulk(&pool, ROWS).await;
    let mut logs = Logs::new();
    let mut relay = logs.start(&db, &proxy.redis_url(), &ns, &["--push-timeout", "1s"]);

    wait_drained_to(&pool, ROWS - 5_000).await;
    let accepted_before = proxy.accepted();
    proxy.stall();
    let stalled = Instant::now();
    let mut longest_tx = 0f64;
    let mut pending_settled = None;
    while stalled.elapsed() < Duration::from_secs(10) {
        let (_, age) = relay_transactions(&pool).await;
        longest_tx = longest_tx.max(age);
        assert_eq!(
            max_attempts_pending(&pool).await,
            0,
            "a stall counted an attempt"
        );
        assert_eq!(dead_count(&pool).await, 0);
        // By now the batch in flight when the stall began has timed out (1 s) and rolled back.
        if pending_settled.is_none() && stalled.elapsed() > Duration::from_millis(2500) {
            pending_settled = Some(pending_count(&pool).await);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pending_stalled = pending_count(&pool).await;
    assert_eq!(
        Some(pending_stalled),
        pending_settled,
        "rows deleted while Redis hung"
    );
    assert!(pending_stalled > 0);
    // --push-timeout 1s bounds how long a hung Redis holds the rows' locks; without it the
    // transaction would stay open for the whole 10 s stall.
    assert!(
        longest_tx < 5.0,
        "a transaction stayed open {longest_tx:.1}s during the stall"
    );
    let new_connections = proxy.accepted() - accepted_before;
    assert!(
        new_connections <= 10,
        "{new_connections} connections opened during the stall"
    );
    println!(
        "stall: longest relay transaction {longest_tx:.2}s, {new_connections} new connections"
    );
    proxy.heal();

    wait_drained_to(&pool, 0).await;
    assert!(relay.running());
    let (code, _) = relay.terminate(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0));

    let in_redis = list_uuids(&ns, "queue:default").await;
    let t = tally(&inserted, &in_redis, &HashSet::new());
    t.assert_exactly_once();
    assert_eq!(dead_count(&pool).await, 0);
    let lines = log_lines(&logs.files());
    let b = Batches::of(&lines);
    assert_eq!(b.delivered(), ROWS as u64, "{b:?}");
    assert_eq!(
        count_message(&lines, "redis unavailable; retrying with backoff"),
        1
    );
    assert_eq!(count_message(&lines, "redis recovered"), 1);
    let duplicates = b.duplicates;
    println!("stall: duplicates by relay logs {}; {b:?}", b.duplicates);
    figures("redis_stall", t.relayed, duplicates, t.lost.len());
}

// ---------------------------------------------------------------------------------------------
// 4. The relay's Postgres sessions terminated mid-batch, again and again.
// ---------------------------------------------------------------------------------------------

#[sqlx::test]
async fn postgres_sessions_cut_mid_batch_lose_nothing(pool: PgPool) {
    const ROWS: i64 = 50_000;
    let redis = RedisServer::start();
    let ns = Namespace::on(&redis.url());
    let db = database_url_of(&pool).await;
    let inserted = insert_bulk(&pool, ROWS).await;
    let mut logs = Logs::new();
    let mut relay = logs.start(&db, &redis.url(), &ns, &[]);
    let mut rng = rand::rng();

    // Twelve cuts, each of every relay session that is inside a transaction (a batch between
    // its claim and its commit) the moment one is seen; every third cut takes all of the
    // relay's sessions (the notification listener and idle ones too).
    let (mut cuts, mut in_tx) = (0, 0i64);
    let started = Instant::now();
    while cuts < 12 && pending_count(&pool).await > 0 {
        assert!(started.elapsed() < drain_deadline(ROWS as u64), "too slow");
        let all = cuts % 3 == 2;
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM (
                 SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                 WHERE datname = current_database() AND application_name = 'jobrelay'
                   AND pid <> pg_backend_pid() AND ($1 OR xact_start IS NOT NULL)) t",
        )
        .bind(all)
        .fetch_one(&pool)
        .await
        .unwrap();
        if n == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        }
        if !all {
            in_tx += n;
        }
        cuts += 1;
        assert_eq!(
            max_attempts_pending(&pool).await,
            0,
            "a cut counted an attempt"
        );
        tokio::time::sleep(Duration::from_millis(rng.random_range(50..250))).await;
    }
    println!("cut {cuts} times; {in_tx} sessions terminated inside a transaction");
    assert!(
        in_tx >= 4,
        "too few sessions cut mid-batch to prove anything"
    );

    wait_drained_to(&pool, 0).await;
    assert!(relay.running());
    let (code, _) = relay.terminate(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0));

    let in_redis = list_uuids(&ns, "queue:default").await;
    let t = tally(&inserted, &in_redis, &HashSet::new());
    t.assert_exactly_once();
    assert_eq!(dead_count(&pool).await, 0);
    let b = Batches::of(&log_lines(&logs.files()));
    assert_eq!(b.delivered(), ROWS as u64, "{b:?}");
    let duplicates = b.duplicates;
    println!("pg-cuts: duplicates by relay logs {}; {b:?}", b.duplicates);
    figures("postgres_cuts", t.relayed, duplicates, t.lost.len());
}

// ---------------------------------------------------------------------------------------------
// 5. Poison: a queue key that holds a string.
// ---------------------------------------------------------------------------------------------

#[sqlx::test]
async fn poison_rows_are_retried_then_dead_lettered_and_the_rest_flows(pool: PgPool) {
    let redis = RedisServer::start();
    let ns = Namespace::on(&redis.url());
    let db = database_url_of(&pool).await;
    let mut con = ns.con().await;
    let _: () = redis::cmd("SET")
        .arg(ns.key("queue:poison"))
        .arg("x")
        .query_async(&mut con)
        .await
        .unwrap();
    // 30 poison rows among 2,970 good ones, spread over three batches.
    sqlx::query(
        "INSERT INTO pending_jobs (queue, job_type, payload)
         SELECT CASE WHEN i % 100 = 0 THEN 'poison' ELSE 'default' END, 'Bulk',
                convert_to('job-' || i, 'UTF8')
         FROM generate_series(1, 3000) AS i",
    )
    .execute(&pool)
    .await
    .unwrap();
    let good: HashSet<String> =
        sqlx::query_scalar("SELECT uuid::text FROM pending_jobs WHERE queue = 'default'")
            .fetch_all(&pool)
            .await
            .unwrap()
            .into_iter()
            .collect();
    let poison: Vec<String> =
        sqlx::query_scalar("SELECT uuid::text FROM pending_jobs WHERE queue = 'poison'")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(poison.len(), 30);
    let mut logs = Logs::new();
    let mut relay = logs.start(&db, &redis.url(), &ns, &["--max-attempts", "3"]);

    // Each refusal counts an attempt, records the error and pushes available_at back
    // (1 s doubling, with jitter: attempt 1 waits 0.5-1 s, attempt 2 waits 1-2 s).
    for attempts in [1, 2] {
        let p = &pool;
        wait_until(
            &format!("a poison row waiting after attempt {attempts}"),
            Duration::from_secs(30),
            || async move {
                sqlx::query_scalar::<_, bool>(
                    "SELECT EXISTS (SELECT 1 FROM pending_jobs
                     WHERE queue = 'poison' AND attempts = $1 AND available_at > now()
                       AND last_error LIKE '%WRONGTYPE%')",
                )
                .bind(attempts)
                .fetch_one(p)
                .await
                .unwrap()
            },
        )
        .await;
    }
    let p = &pool;
    wait_until("30 dead letters", Duration::from_secs(60), || async move {
        dead_count(p).await == 30
    })
    .await;
    wait_drained_to(&pool, 0).await;

    let dead: Vec<(String, String, i32, Option<String>)> = sqlx::query_as(
        "SELECT uuid::text, queue, attempts, last_error FROM pending_jobs_dead ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    for (uuid, queue, attempts, last_error) in &dead {
        assert_eq!(queue, "poison");
        assert_eq!(*attempts, 3, "{uuid}");
        let e = last_error.as_deref().unwrap_or("");
        assert!(
            e.contains("WRONGTYPE") && e.contains(&ns.key("queue:poison")),
            "{e}"
        );
    }
    let mut dead_uuids: Vec<String> = dead.into_iter().map(|d| d.0).collect();
    dead_uuids.sort();
    let mut want = poison.clone();
    want.sort();
    assert_eq!(dead_uuids, want);
    // The refused jobs left nothing behind: the key is untouched and no marker was written.
    let v: String = redis::cmd("GET")
        .arg(ns.key("queue:poison"))
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(v, "x");
    for u in &poison {
        // GET, not EXISTS: the test must not add to the EXISTS count the figures rest on.
        let marker: Option<Vec<u8>> = redis::cmd("GET")
            .arg(ns.key(&format!("jobs:{u}")))
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(marker, None, "marker written for refused job {u}");
    }
    // Every good row arrived, once.
    let in_redis = list_uuids(&ns, "queue:default").await;
    let t = tally(&good, &in_redis, &HashSet::new());
    t.assert_exactly_once();
    assert_eq!(in_redis.len(), good.len());

    // The relay never stopped: rows written now still flow.
    assert!(relay.running());
    insert_rows(&pool, 100, "later").await;
    wait_drained_to(&pool, 0).await;
    assert_eq!(ns.llen("queue:later").await, 100);

    // The operator fixes the key and requeues the dead letters: they arrive too.
    let _: () = redis::cmd("DEL")
        .arg(ns.key("queue:poison"))
        .query_async(&mut con)
        .await
        .unwrap();
    let (code, out, err) = run_relay(
        &["dead-letter", "requeue", "--queue", "poison"],
        &[("DATABASE_URL", &db)],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), "requeued 30 rows");
    wait_drained_to(&pool, 0).await;
    let mut requeued = list_uuids(&ns, "queue:poison").await;
    requeued.sort();
    assert_eq!(requeued, want);
    assert_eq!(dead_count(&pool).await, 0);

    assert!(relay.running());
    let (code, _) = relay.terminate(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0));
    let b = Batches::of(&log_lines(&logs.files()));
    assert_eq!(b.dead_lettered, 30, "{b:?}");
    assert_eq!(b.refused, 60 + 30, "{b:?}");
    let relayed = t.relayed + 100 + requeued.len();
    let duplicates = b.duplicates;
    println!("poison: duplicates by relay logs {}; {b:?}", b.duplicates);
    figures("poison", relayed, duplicates, t.lost.len());
}

/// A row that can never become a job (the table lost its CHECK constraints) is dead-lettered
/// at its first attempt, and the rows around it flow.
#[sqlx::test]
async fn invalid_rows_are_dead_lettered_at_once(pool: PgPool) {
    let redis = RedisServer::start();
    let ns = Namespace::on(&redis.url());
    let db = database_url_of(&pool).await;
    sqlx::query("ALTER TABLE pending_jobs DROP CONSTRAINT pending_jobs_queue_check")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO pending_jobs (queue, job_type, payload)
         SELECT CASE WHEN i % 50 = 0 THEN 'no spaces allowed' ELSE 'default' END, 'Bulk',
                convert_to('job-' || i, 'UTF8')
         FROM generate_series(1, 500) AS i",
    )
    .execute(&pool)
    .await
    .unwrap();
    let mut logs = Logs::new();
    let mut relay = logs.start(&db, &redis.url(), &ns, &["--max-attempts", "5"]);
    wait_drained_to(&pool, 0).await;
    let dead: Vec<(String, i32, Option<String>)> =
        sqlx::query_as("SELECT queue, attempts, last_error FROM pending_jobs_dead")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(dead.len(), 10);
    for (queue, attempts, last_error) in dead {
        assert_eq!(queue, "no spaces allowed");
        assert_eq!(attempts, 1, "dead-lettered at the first attempt");
        assert!(last_error
            .unwrap_or_default()
            .contains("invalid job: queue"));
    }
    assert_eq!(ns.llen("queue:default").await, 490);
    let (code, _) = relay.terminate(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0));
}

// ---------------------------------------------------------------------------------------------
// 6. SIGTERM during a 200,000-row drain.
// ---------------------------------------------------------------------------------------------

#[sqlx::test]
async fn sigterm_during_a_large_drain_exits_0_and_loses_nothing(pool: PgPool) {
    const ROWS: i64 = 200_000;
    const SHUTDOWN: Duration = Duration::from_secs(10);
    let redis = RedisServer::start();
    let ns = Namespace::on(&redis.url());
    let db = database_url_of(&pool).await;
    let inserted = insert_bulk(&pool, ROWS).await;
    let mut logs = Logs::new();
    let args = ["--shutdown-timeout", "10s"];
    let mut relay = logs.start(&db, &redis.url(), &ns, &args);

    let drained = rand::rng().random_range(20_000..60_000);
    wait_drained_to(&pool, ROWS - drained).await;
    // Exit 0 means every batch in hand finished within --shutdown-timeout (the relay exits 1
    // when the timeout cuts one off); the test waits a little longer than that, no more.
    let (code, took) = relay.terminate(SHUTDOWN + Duration::from_secs(5)).await;
    assert_eq!(code, Some(0), "exit code after SIGTERM");
    println!("SIGTERM after {drained}+ rows: exit 0 in {took:?}");

    // Stopped mid-drain: what is not pending is in Redis, exactly once.
    let pending = pending_uuids(&pool).await;
    assert!(!pending.is_empty(), "the drain had ended before SIGTERM");
    let in_redis = list_uuids(&ns, "queue:default").await;
    let t = tally(&inserted, &in_redis, &pending);
    t.assert_exactly_once();
    assert_eq!(
        t.relayed + pending.len() - t.pending_and_pushed,
        ROWS as usize
    );
    println!(
        "after SIGTERM: {} pending, {} in redis, {} both",
        pending.len(),
        in_redis.len(),
        t.pending_and_pushed
    );
    let lines = log_lines(&logs.files());
    assert_eq!(count_message(&lines, "shutdown complete"), 1);

    // A new relay finishes the drain.
    let mut relay = logs.start(&db, &redis.url(), &ns, &args);
    wait_drained_to(&pool, 0).await;
    let (code, _) = relay.terminate(SHUTDOWN + Duration::from_secs(5)).await;
    assert_eq!(code, Some(0));
    let in_redis = list_uuids(&ns, "queue:default").await;
    let t = tally(&inserted, &in_redis, &HashSet::new());
    t.assert_exactly_once();
    assert_eq!(in_redis.len(), ROWS as usize);
    assert_eq!(dead_count(&pool).await, 0);
    let b = Batches::of(&log_lines(&logs.files()));
    assert_eq!(b.delivered(), ROWS as u64, "{b:?}");
    let duplicates = b.duplicates;
    println!("sigterm: duplicates by relay logs {}; {b:?}", b.duplicates);
    figures("sigterm", t.relayed, duplicates, t.lost.len());
}

/// A batch that cannot finish within --shutdown-timeout (Redis hangs) is cut off: exit 1, and
/// its rows are pending again, attempts untouched.
#[sqlx::test]
async fn shutdown_timeout_cuts_off_a_hung_batch_and_loses_nothing(pool: PgPool) {
    let redis = RedisServer::start();
    let proxy = Proxy::start(upstream(redis.port));
    let ns = Namespace::on(&redis.url());
    let db = database_url_of(&pool).await;
    let mut logs = Logs::new();
    let mut relay = logs.start(
        &db,
        &proxy.redis_url(),
        &ns,
        &["--push-timeout", "30s", "--shutdown-timeout", "1s"],
    );
    let files = logs.files();
    let files = &files;
    wait_until(
        "the relay connected to redis",
        Duration::from_secs(30),
        || async move { count_message(&log_lines(files), "redis connected") == 1 },
    )
    .await;
    proxy.stall();
    let inserted = insert_bulk(&pool, 5_000).await;
    let p = &pool;
    wait_until("a batch in hand", Duration::from_secs(30), || async move {
        relay_transactions(p).await.0 > 0
    })
    .await;
    let (code, took) = relay.terminate(Duration::from_secs(10)).await;
    assert_eq!(code, Some(1), "a cut-off batch exits 1");
    assert!(took < Duration::from_secs(5), "exit took {took:?}");
    println!("hung batch: exit 1 in {took:?}");
    assert_eq!(pending_uuids(&pool).await, inserted);
    assert_eq!(max_attempts_pending(&pool).await, 0);
    // The push never reached Redis (the proxy held it), and nothing else did.
    drop(proxy);
    assert_eq!(dbsize(&ns).await, 0);
}

/// A relay frozen mid-batch (SIGSTOP: its sockets stay open, so Postgres sees no disconnect)
/// holds its claimed rows only until `idle_in_transaction_session_timeout` (push timeout +
/// statement timeout, here 1 s + 15 s) ends its session; then another relay delivers them.
#[sqlx::test]
async fn a_frozen_relay_gives_its_rows_up_after_the_idle_transaction_timeout(pool: PgPool) {
    const ROWS: i64 = 50_000;
    let redis = RedisServer::start();
    let ns = Namespace::on(&redis.url());
    let db = database_url_of(&pool).await;
    let inserted = insert_bulk(&pool, ROWS).await;
    let mut logs = Logs::new();
    // Three claim slots: the frozen relay's two workers can hold two, so the other relay keeps
    // one (a relay holds at most as many slots as it has workers; see the README on sizing).
    let args = ["--push-timeout", "1s", "--claim-slots", "3"];
    let mut frozen = logs.start(&db, &redis.url(), &ns, &args);

    // Freeze it while one of its batches is between claim and commit.
    let started = Instant::now();
    loop {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "never caught a batch in hand"
        );
        assert!(pending_count(&pool).await > 0, "drained before the freeze");
        if relay_transactions(&pool).await.0 > 0 {
            frozen.child.signal("STOP");
            tokio::time::sleep(Duration::from_millis(100)).await;
            // Frozen with a transaction open *and* rows claimed in it (not, say, between
            // BEGIN and its claim, or in a one-statement poll that the server finished).
            let unlocked: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM (SELECT 1 FROM pending_jobs FOR UPDATE SKIP LOCKED) t",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            if relay_transactions(&pool).await.0 > 0 && unlocked < pending_count(&pool).await {
                break;
            }
            frozen.child.signal("CONT");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let froze = Instant::now();
    let mut other = logs.start(&db, &redis.url(), &ns, &args);
    // The other relay takes every row but the locked ones (SKIP LOCKED): none is claimable, and
    // the count holds still (no batch of the other relay in flight) ...
    let waiting = Instant::now();
    let mut last = None;
    let locked = loop {
        assert!(
            waiting.elapsed() < drain_deadline(ROWS as u64),
            "the other relay stalled"
        );
        let unlocked: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM (SELECT 1 FROM pending_jobs FOR UPDATE SKIP LOCKED) t",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        let pending = pending_count(&pool).await;
        if unlocked == 0 && last == Some(pending) {
            break pending;
        }
        last = (unlocked == 0).then_some(pending);
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // The default workers, each with at most one default-sized batch.
    let most = (jobrelay::config::DEFAULT_WORKERS * jobrelay::config::DEFAULT_BATCH_SIZE) as i64;
    assert!(
        (1..=most).contains(&locked),
        "{locked} rows held by the frozen relay"
    );
    // ... which come free when Postgres ends the frozen session, not before.
    wait_drained_to(&pool, 0).await;
    let held = froze.elapsed();
    println!("a frozen relay held {locked} rows for {held:?}");
    assert!(held > Duration::from_secs(10), "freed after only {held:?}");
    frozen.child.kill9().await;
    let (code, _) = other.terminate(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0));
    let in_redis = list_uuids(&ns, "queue:default").await;
    tally(&inserted, &in_redis, &HashSet::new()).assert_exactly_once();
    assert_eq!(in_redis.len(), ROWS as usize);
    assert_eq!(dead_count(&pool).await, 0);
}

// ---------------------------------------------------------------------------------------------
// Transient classes: READONLY and MASTERDOWN; outages of either dependency.
// ---------------------------------------------------------------------------------------------

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

/// A Redis that turned replica (READONLY), then a stale replica (MASTERDOWN): rows wait with
/// their attempts untouched, the outage is logged once, and delivery resumes on promotion.
#[sqlx::test]
async fn readonly_and_masterdown_are_transient(pool: PgPool) {
    let redis = RedisServer::start();
    let ns = Namespace::on(&redis.url());
    let db = database_url_of(&pool).await;
    let dead_master = free_port().to_string();
    redis_cmd(&redis.url(), &["REPLICAOF", "127.0.0.1", &dead_master]).await;
    let inserted = insert_bulk(&pool, 2_000).await;
    let mut logs = Logs::new();
    let mut relay = logs.start(&db, &redis.url(), &ns, &[]);

    // (redis-rs renders the codes as ReadOnly and MasterDown.)
    for (stale, code) in [("yes", "readonly"), ("no", "masterdown")] {
        redis_cmd(
            &redis.url(),
            &["CONFIG", "SET", "replica-serve-stale-data", stale],
        )
        .await;
        let files = logs.files();
        let files = &files;
        wait_until(
            &format!("a push refused with {code}"),
            Duration::from_secs(30),
            || async move {
                log_lines(files).iter().any(|l| {
                    message(l) == "batch rolled back; backing off"
                        && l["error"]
                            .as_str()
                            .unwrap_or("")
                            .to_lowercase()
                            .contains(code)
                })
            },
        )
        .await;
        // Give the workers a few more tries.
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(pending_count(&pool).await, 2_000);
        assert_eq!(
            max_attempts_pending(&pool).await,
            0,
            "{code} counted an attempt"
        );
        assert_eq!(dead_count(&pool).await, 0);
    }
    redis_cmd(&redis.url(), &["REPLICAOF", "NO", "ONE"]).await;
    wait_drained_to(&pool, 0).await;
    let (code, _) = relay.terminate(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0));
    tally(
        &inserted,
        &list_uuids(&ns, "queue:default").await,
        &HashSet::new(),
    )
    .assert_exactly_once();
    let lines = log_lines(&logs.files());
    print_health(&lines);
    // Not writable from the start: one "not reachable yet" and, on promotion, one "recovered",
    // however often the probe and the workers were refused in between.
    assert_eq!(
        count_message(&lines, "redis not reachable yet; retrying with backoff"),
        1
    );
    assert_eq!(
        count_message(&lines, "redis unavailable; retrying with backoff"),
        0
    );
    assert_eq!(count_message(&lines, "redis recovered"), 1);
}

async fn ping(
    con: &mut jobrelay::redis::connection::RedisConnection,
) -> redis::RedisResult<String> {
    redis::cmd("PING").query_async(con).await
}

/// A connection whose reconnects all failed during an outage: the first request after Redis is
/// back gets an answer (one more try on a new connection), not the stale failure of a reconnect
/// begun during the outage, which the relay would report as a second outage.
#[tokio::test]
async fn the_first_request_after_an_outage_is_not_handed_a_stale_reconnect_failure() {
    let redis = RedisServer::start();
    let proxy = Proxy::start(upstream(redis.port));
    let client = redis::Client::open(proxy.redis_url()).unwrap();
    let mut con = jobrelay::redis::connection::connect(&client, Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(ping(&mut con).await.unwrap(), "PONG");

    let before = proxy.accepted();
    proxy.set_mode(Mode::Reject);
    assert!(ping(&mut con).await.is_err(), "Redis is unreachable");
    // The request found its connection cut and started a reconnect of two attempts. Once both
    // were refused, the connection holds a failed reconnect.
    wait_until(
        "two reconnect attempts refused",
        Duration::from_secs(10),
        || async { proxy.accepted() >= before + 2 },
    )
    .await;
    proxy.set_mode(Mode::Forward);
    assert_eq!(
        ping(&mut con)
            .await
            .expect("first request after the outage"),
        "PONG"
    );
}

/// Postgres, then Redis, unreachable for 4 s each (a proxy that closes every connection):
/// each outage is logged once and its end once, the relay retries at a bounded rate, and
/// every row arrives once.
#[sqlx::test]
async fn outages_are_logged_once_and_retried_at_a_bounded_rate(pool: PgPool) {
    const ROWS: i64 = 30_000;
    let redis = RedisServer::start();
    let redis_proxy = Proxy::start(upstream(redis.port));
    let pg_proxy = Proxy::start(upstream(5432));
    let ns = Namespace::on(&redis.url());
    let db = database_url_of(&pool).await;
    let mut db_via_proxy = url::Url::parse(&db).unwrap();
    db_via_proxy.set_port(Some(pg_proxy.port)).unwrap();
    let inserted = insert_bulk(&pool, ROWS).await;
    let mut logs = Logs::new();
    let mut relay = logs.start(db_via_proxy.as_str(), &redis_proxy.redis_url(), &ns, &[]);

    let mut drained_to = ROWS;
    for (name, proxy) in [("postgres", &pg_proxy), ("redis", &redis_proxy)] {
        drained_to -= 5_000;
        wait_drained_to(&pool, drained_to).await;
        let before = proxy.accepted();
        proxy.set_mode(Mode::Reject);
        let down = Instant::now();
        // The batch in flight settles within --push-timeout (5 s): it rolls back, or commits
        // the script calls Redis acknowledged before the outage and keeps the rest.
        tokio::time::sleep(Duration::from_secs(6)).await;
        let pending_down = pending_count(&pool).await;
        while down.elapsed() < Duration::from_secs(9) {
            assert_eq!(
                max_attempts_pending(&pool).await,
                0,
                "{name} outage counted an attempt"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(
            pending_count(&pool).await,
            pending_down,
            "rows deleted during the {name} outage"
        );
        let tries = proxy.accepted() - before;
        let rate = tries as f64 / down.elapsed().as_secs_f64();
        println!(
            "{name} down {:?}: {tries} connection attempts ({rate:.1}/s)",
            down.elapsed()
        );
        // Two workers, the probe (1/s) and the listener, each backing off: a handful a second.
        // A relay that retried in a loop would make hundreds.
        assert!(rate < 15.0, "{name}: {tries} connection attempts in 9 s");
        proxy.set_mode(Mode::Forward);
    }
    wait_drained_to(&pool, 0).await;
    assert!(relay.running());
    let (code, _) = relay.terminate(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0));
    tally(
        &inserted,
        &list_uuids(&ns, "queue:default").await,
        &HashSet::new(),
    )
    .assert_exactly_once();
    assert_eq!(dead_count(&pool).await, 0);
    let lines = log_lines(&logs.files());
    print_health(&lines);
    for dep in ["postgres", "redis"] {
        let down = format!("{dep} unavailable; retrying with backoff");
        let up = format!("{dep} recovered");
        assert_eq!(count_message(&lines, &down), 1, "{down}");
        assert_eq!(count_message(&lines, &up), 1, "{up}");
    }
}

// ---------------------------------------------------------------------------------------------
// 7. status --json and dead-letter list|requeue|purge, through the binary.
// ---------------------------------------------------------------------------------------------

/// A dead letter as the test wrote it, every column requeue must keep.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
struct JobColumns {
    uuid: uuid::Uuid,
    queue: String,
    job_type: String,
    payload: Vec<u8>,
    parent_uuid: Option<uuid::Uuid>,
    predecessor_uuid: Option<uuid::Uuid>,
    dead_parent: bool,
    run_at: Option<chrono::DateTime<chrono::Utc>>,
    headers: serde_json::Value,
    created_at: chrono::DateTime<chrono::Utc>,
}

const JOB_COLUMNS: &str = "uuid, queue, job_type, payload, parent_uuid, predecessor_uuid, \
                           dead_parent, run_at, headers, created_at";

async fn admin(db: &str, args: &[&str]) -> (String, String) {
    let (code, out, err) = run_relay(args, &[("DATABASE_URL", db)]).await;
    assert_eq!(code, 0, "jobrelay {args:?}\nstdout: {out}\nstderr: {err}");
    (out, err)
}

async fn status_json(db: &str) -> serde_json::Value {
    let (out, _) = admin(db, &["status", "--json"]).await;
    assert_eq!(out.lines().count(), 1, "one object: {out}");
    serde_json::from_str(&out).unwrap()
}

#[sqlx::test]
async fn status_and_dead_letter_commands_end_to_end(pool: PgPool) {
    use serde_json::json;
    let db = database_url_of(&pool).await;

    // Empty: the exact object of docs/cli.md, with null for the age.
    assert_eq!(
        status_json(&db).await,
        json!({"pending": 0, "oldest_pending_age_seconds": null, "dead": 0, "queues": {}})
    );

    // Pending: alpha x3 (the oldest 100 s old), beta x2.
    insert_rows(&pool, 3, "alpha").await;
    insert_rows(&pool, 2, "beta").await;
    sqlx::query(
        "UPDATE pending_jobs SET created_at = now() - interval '100 seconds'
         WHERE id = (SELECT min(id) FROM pending_jobs)",
    )
    .execute(&pool)
    .await
    .unwrap();
    // Dead: alpha x2, gamma x1, every column set.
    sqlx::query(
        "INSERT INTO pending_jobs_dead (id, uuid, queue, job_type, payload, parent_uuid,
             predecessor_uuid, dead_parent, run_at, headers, created_at, attempts, available_at,
             last_error, dead_at)
         SELECT 9000 + i, gen_random_uuid(), q, 'Type' || i, decode('00ff0' || i, 'hex'),
                gen_random_uuid(), gen_random_uuid(), i % 2 = 1,
                '2030-01-02 03:04:05.678901+00'::timestamptz + i * interval '1 hour',
                jsonb_build_object('traceparent', 'tp-' || i),
                '2020-05-06 07:08:09.123456+00'::timestamptz + i * interval '1 day',
                7, now() + interval '1 hour', 'redis refused job: WRONGTYPE ' || i, now()
         FROM (VALUES (1, 'alpha'), (2, 'alpha'), (3, 'gamma')) AS v(i, q)",
    )
    .execute(&pool)
    .await
    .unwrap();

    let s = status_json(&db).await;
    let keys: Vec<&str> = s.as_object().unwrap().keys().map(|k| k.as_str()).collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        ["dead", "oldest_pending_age_seconds", "pending", "queues"]
    );
    assert_eq!(s["pending"], json!(5));
    assert_eq!(s["dead"], json!(3));
    let age = s["oldest_pending_age_seconds"].as_f64().expect("a number");
    assert!((100.0..1000.0).contains(&age), "{age}");
    assert_eq!(
        s["queues"],
        json!({
            "alpha": {"pending": 3, "dead": 2},
            "beta": {"pending": 2, "dead": 0},
            "gamma": {"pending": 0, "dead": 1},
        })
    );
    let (text, _) = admin(&db, &["status"]).await;
    assert!(text.starts_with("pending 5  oldest "), "{text}");

    // list: one JSON object per line, oldest id first; --queue and --limit filter.
    let (out, err) = admin(&db, &["dead-letter", "list", "--json"]).await;
    let listed: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ids: Vec<i64> = listed.iter().map(|v| v["id"].as_i64().unwrap()).collect();
    assert_eq!(ids, [9001, 9002, 9003]);
    assert!(err.contains("3 dead-lettered rows listed"), "{err}");
    let first = listed[0].as_object().unwrap();
    let mut fields: Vec<&str> = first.keys().map(|k| k.as_str()).collect();
    fields.sort();
    assert_eq!(
        fields,
        [
            "attempts",
            "created_at",
            "dead_at",
            "id",
            "job_type",
            "last_error",
            "queue",
            "uuid"
        ]
    );
    assert_eq!(listed[0]["attempts"], json!(7));
    assert_eq!(
        listed[0]["last_error"],
        json!("redis refused job: WRONGTYPE 1")
    );
    let (out, err) = admin(&db, &["dead-letter", "list", "--queue", "gamma", "--json"]).await;
    assert_eq!(out.lines().count(), 1);
    assert!(err.contains("1 dead-lettered rows listed"), "{err}");
    let (out, _) = admin(&db, &["dead-letter", "list", "--limit", "2"]).await;
    assert_eq!(out.lines().count(), 2);
    assert!(out.starts_with("9001\t"), "{out}");

    // requeue --id: the job comes back whole, with attempts, available_at and last_error reset.
    let before: JobColumns = sqlx::query_as(&format!(
        "SELECT {JOB_COLUMNS} FROM pending_jobs_dead WHERE id = 9003"
    ))
    .fetch_one(&pool)
    .await
    .unwrap();
    let (out, _) = admin(&db, &["dead-letter", "requeue", "--id", "9003"]).await;
    assert_eq!(out.trim(), "requeued 1 rows");
    let after: JobColumns = sqlx::query_as(&format!(
        "SELECT {JOB_COLUMNS} FROM pending_jobs WHERE uuid = $1"
    ))
    .bind(before.uuid)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(after, before);
    let (attempts, due, last_error): (i32, bool, Option<String>) = sqlx::query_as(
        "SELECT attempts, available_at <= now(), last_error FROM pending_jobs WHERE uuid = $1",
    )
    .bind(before.uuid)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((attempts, due, last_error), (0, true, None));
    assert_eq!(
        status_json(&db).await["queues"]["gamma"],
        json!({"pending": 1, "dead": 0})
    );

    // requeue --queue, and a selection that matches nothing.
    let (out, _) = admin(&db, &["dead-letter", "requeue", "--queue", "alpha"]).await;
    assert_eq!(out.trim(), "requeued 2 rows");
    let (out, _) = admin(&db, &["dead-letter", "requeue", "--id", "12345"]).await;
    assert_eq!(out.trim(), "requeued 0 rows");
    let s = status_json(&db).await;
    assert_eq!(
        (s["pending"].clone(), s["dead"].clone()),
        (json!(8), json!(0))
    );

    // purge --id, --queue, --all.
    sqlx::query(
        "INSERT INTO pending_jobs_dead (id, uuid, queue, job_type)
         SELECT i, gen_random_uuid(), CASE WHEN i <= 2 THEN 'x' ELSE 'y' END, 'T'
         FROM generate_series(1, 5) AS i",
    )
    .execute(&pool)
    .await
    .unwrap();
    let (out, _) = admin(&db, &["dead-letter", "purge", "--id", "1,5"]).await;
    assert_eq!(out.trim(), "purged 2 rows");
    let (out, _) = admin(&db, &["dead-letter", "purge", "--queue", "x"]).await;
    assert_eq!(out.trim(), "purged 1 rows");
    let (out, _) = admin(&db, &["dead-letter", "purge", "--all"]).await;
    assert_eq!(out.trim(), "purged 2 rows");
    assert_eq!(dead_count(&pool).await, 0);
    assert_eq!(status_json(&db).await["dead"], json!(0));

    // A selection is required.
    let (code, _, err) = run_relay(&["dead-letter", "purge"], &[("DATABASE_URL", &db)]).await;
    assert_eq!(code, 2, "{err}");
}

/// `used_memory` of a Redis, from `INFO memory`.
async fn used_memory(url: &str) -> i64 {
    let mut con = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut con)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("INFO memory has used_memory")
}

/// A Redis at `maxmemory` (noeviction) for 2.5 x `--dedup-ttl`, reached in the middle of a
/// batch: the script calls Redis acknowledged before the OOM are committed (their rows
/// deleted), the rest kept with attempts untouched; when the markers of the acknowledged jobs
/// have expired and the limit is lifted, every job is in Redis exactly once (list entries
/// counted, not markers), nothing is dead-lettered, and the outage is logged once, with its
/// reason, although the probe and the workers were refused all along.
#[sqlx::test]
async fn acknowledged_pushes_survive_an_oom_outage_longer_than_the_dedup_ttl(pool: PgPool) {
    const ROWS: i64 = 20_000;
    const TTL_SECONDS: u64 = 32; // the least --dedup-ttl allows with --push-timeout 1s
    let redis = RedisServer::start();
    let url = redis.url();
    let ns = Namespace::on(&url);
    let db = database_url_of(&pool).await;
    // 1 KiB payloads: one script call (1,000 jobs) needs over 1 MiB of Redis memory.
    sqlx::query(
        "INSERT INTO pending_jobs (queue, job_type, payload)
         SELECT 'default', 'Bulk', convert_to(rpad(i::text, 1024, 'x'), 'UTF8')
         FROM generate_series(1, $1) AS i",
    )
    .bind(ROWS)
    .execute(&pool)
    .await
    .unwrap();
    let inserted = pending_uuids(&pool).await;
    // Room for about one call (its request, over 1 MiB, counts while Redis reads it; its
    // writes take over 2 MiB): the first call lands, the next is refused with OOM.
    let room = used_memory(&url).await + 5 * 512 * 1024;
    redis_cmd(&url, &["CONFIG", "SET", "maxmemory-policy", "noeviction"]).await;
    redis_cmd(&url, &["CONFIG", "SET", "maxmemory", &room.to_string()]).await;
    let mut logs = Logs::new();
    let ttl = format!("{TTL_SECONDS}s");
    let mut relay = logs.start(
        &db,
        &url,
        &ns,
        &["--dedup-ttl", &ttl, "--push-timeout", "1s"],
    );

    let files = logs.files();
    let oom_logged = |files: Vec<PathBuf>| async move {
        log_lines(&files).iter().any(|l| {
            message(l) == "redis unavailable; retrying with backoff"
                && l["reason"] == "out of memory"
        })
    };
    wait_until("an OOM outage logged", Duration::from_secs(60), || {
        oom_logged(files.clone())
    })
    .await;
    // Hold Redis full: every write is refused while the acknowledged jobs' markers expire.
    redis_cmd(&url, &["CONFIG", "SET", "maxmemory", "1"]).await;
    let landed = ns.llen("queue:default").await as i64;
    println!("{landed} jobs landed before the OOM");
    assert!(
        (1_000..ROWS).contains(&landed),
        "{landed} jobs landed before the OOM"
    );
    // Not synchronisation: the outage must outlast the markers (the scenario).
    tokio::time::sleep(Duration::from_secs(TTL_SECONDS * 5 / 2)).await;
    assert_eq!(
        ns.marker_count().await,
        0,
        "the markers expired during the outage"
    );
    assert_eq!(
        pending_count(&pool).await,
        ROWS - landed,
        "acknowledged rows deleted, the rest kept"
    );
    assert_eq!(
        max_attempts_pending(&pool).await,
        0,
        "OOM counted no attempt"
    );

    redis_cmd(&url, &["CONFIG", "SET", "maxmemory", "0"]).await;
    wait_drained_to(&pool, 0).await;
    let (code, _) = relay.terminate(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0));
    let in_redis = list_uuids(&ns, "queue:default").await;
    assert_eq!(
        in_redis.len() as i64,
        ROWS,
        "list entries, not only markers"
    );
    let t = tally(&inserted, &in_redis, &HashSet::new());
    t.assert_exactly_once();
    assert_eq!(dead_count(&pool).await, 0);
    let lines = log_lines(&logs.files());
    print_health(&lines);
    assert_eq!(
        count_message(&lines, "redis unavailable; retrying with backoff"),
        1
    );
    assert_eq!(count_message(&lines, "redis recovered"), 1);
    figures(
        "oom_longer_than_dedup_ttl",
        t.relayed,
        Batches::of(&lines).duplicates,
        t.lost.len(),
    );
}

/// Which of `pids` owns the local TCP port `port` (a Postgres session's `client_port`), from
/// `/proc/<pid>/fd` (socket inodes) and `/proc/net/tcp{,6}` (local port -> inode).
fn owner_of_port(pids: &[i32], port: i32) -> Option<i32> {
    let mut inode = None;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        for line in std::fs::read_to_string(table)
            .unwrap_or_default()
            .lines()
            .skip(1)
        {
            let f: Vec<&str> = line.split_whitespace().collect();
            let local_port = f.get(1).and_then(|a| a.rsplit(':').next());
            if local_port.and_then(|p| i32::from_str_radix(p, 16).ok()) == Some(port) {
                inode = f.get(9).map(|s| s.to_string());
            }
        }
    }
    let wanted = format!("socket:[{}]", inode?);
    pids.iter().copied().find(|pid| {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy() == wanted))
    })
}

/// A fleet of three relays (two workers each, two claim slots): kill -9 of a relay that holds
/// a batch in the middle of a drain loses nothing and doubles nothing, and its rows are taken
/// over by the others well within the idle-in-transaction timeout (`--push-timeout` + 15 s).
#[sqlx::test]
async fn kill_9_of_a_relay_in_a_fleet_loses_nothing(pool: PgPool) {
    const ROWS: i64 = 30_000;
    let redis = RedisServer::start();
    let ns = Namespace::on(&redis.url());
    let db = database_url_of(&pool).await;
    let inserted = insert_bulk(&pool, ROWS).await;
    let mut logs = Logs::new();
    let mut relays: Vec<Relay> = (0..3)
        .map(|_| logs.start(&db, &redis.url(), &ns, &["--batch-size", "500"]))
        .collect();
    let pids: Vec<i32> = relays.iter().map(|r| r.child.pid()).collect();
    // A relay with a batch in hand: the owner of a session inside a claim transaction.
    let (p, pids_ref) = (&pool, &pids);
    let victim = std::sync::Mutex::new(None);
    let v = &victim;
    wait_until(
        "a relay holding a batch",
        Duration::from_secs(60),
        || async move {
            let ports: Vec<i32> = sqlx::query_scalar(
                "SELECT client_port FROM pg_stat_activity
                 WHERE datname = current_database() AND application_name = 'jobrelay'
                   AND xact_start IS NOT NULL AND pid <> pg_backend_pid()",
            )
            .fetch_all(p)
            .await
            .unwrap();
            let found = ports
                .into_iter()
                .find_map(|port| owner_of_port(pids_ref, port));
            *v.lock().unwrap() = found;
            found.is_some() && pending_count(p).await < ROWS
        },
    )
    .await;
    let victim = victim.into_inner().unwrap().expect("found above");
    let i = pids.iter().position(|&p| p == victim).unwrap();
    relays[i].child.kill9().await;
    let killed = Instant::now();
    let left = pending_count(&pool).await;
    println!("killed relay {i} (pid {victim}) holding a batch; {left} rows pending");
    assert!(left > 0, "the kill came after the drain ended");
    wait_pending_at_most(&pool, 0, Duration::from_secs(120)).await;
    let took = killed.elapsed();
    println!("the rest drained {took:?} after the kill");
    for (j, r) in relays.iter_mut().enumerate().filter(|(j, _)| *j != i) {
        assert_eq!(
            r.terminate(Duration::from_secs(30)).await.0,
            Some(0),
            "relay {j}"
        );
    }
    let in_redis = list_uuids(&ns, "queue:default").await;
    let t = tally(&inserted, &in_redis, &HashSet::new());
    t.assert_exactly_once();
    assert_eq!(in_redis.len() as i64, ROWS);
    assert_eq!(dead_count(&pool).await, 0);
    // The killed relay's sessions end with its sockets, so its slot and rows are free at once;
    // the bound is the idle-in-transaction timeout for a relay that vanished without closing.
    assert!(took < Duration::from_secs(20), "took {took:?}");
    figures(
        "fleet_kill_9",
        t.relayed,
        Batches::of(&log_lines(&logs.files())).duplicates,
        t.lost.len(),
    );
}
