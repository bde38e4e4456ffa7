//! The relay benchmark: prints one JSON object with
//!
//! Every stage measures from production states: the table is analysed while empty (as
//! autovacuum leaves an outbox that is nearly empty most of the time), rows land in one
//! transaction on a relay that has been running (its statements planned on the near-empty
//! table), and later stages run on the dead tuples the earlier ones left. Nothing is vacuumed
//! or analysed in between; `BENCH_VACUUMED=1` adds `drain_vacuumed`, the same drain after
//! `VACUUM (ANALYZE)`, as a labelled extra figure.
//!
//! - `drain`: start the relay with the binary's default settings on the empty table, let it
//!   relay 20 single rows, then COPY `BENCH_ROWS` rows (default 200,000; 200-byte payloads over
//!   8 queues) in one transaction and time from its commit until the table is empty and every
//!   job is in Redis; rows/s, relay CPU seconds per 100,000 jobs, and where the machine's CPU went:
//!   microseconds per job in the relay, Redis and Postgres, the rest, and the cores busy;
//! - `naive`: `BENCH_NAIVE_ROWS` rows (default 10,000) through a naive relay written here (one
//!   row per transaction, one Redis round trip per job, same enqueue script and dedup); rows/s,
//!   and the ratio drain/naive;
//! - `latency`: a producer commits `BENCH_RATE` jobs/s (default 2,000, one row per transaction)
//!   for `BENCH_SECONDS` (default 20) while the relay runs and a consumer BRPOPs; per job, the
//!   time from the producer's commit returning to the pop: p50, p99, max; and, for all jobs and
//!   for the slowest 1%, how that time splits into waiting to be claimed, the push to Redis and
//!   the pop;
//! - `notify_cost`: single-row insert rate of 8 producers with the notify trigger and without,
//!   the relay running (so its wake-up lock is in play, as in production), over
//!   `BENCH_INSERT_SECONDS` (default 30) in alternating pairs of 2 s; the cost is the median of
//!   the pairs' ratios (a single pair swings by 10-30 % on this machine).
//!
//! ```text
//! cargo run --release --example bench
//! BENCH_ROWS=20000 BENCH_SECONDS=5 cargo run --release --example bench
//! ```
//!
//! It works in a database of its own (`jobrelay_bench_<random>`, created next to `DATABASE_URL`,
//! default `postgres://postgres@127.0.0.1:5432/postgres`, dropped at the end) and a Redis
//! namespace of its own (`bench<random>:` on `REDIS_URL`, deleted at the end, and on SIGINT or
//! SIGTERM). `BENCH_WORKERS` and `BENCH_BATCH_SIZE` override the relay defaults;
//! `BENCH_LAYOUT=conveyor` (or `sidekiq`, `celery`, `bullmq`, `rq`) runs the relay in that
//! layout (default `jobrelay`); in the sidekiq, celery and rq layouts every payload is a JSON
//! array of the same size (the job's `args`), and so in the bullmq layout (the job's `data`).

/// The daemon's allocator (src/main.rs), so that the relay measured here allocates as the
/// binary's does.
#[cfg(feature = "daemon")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[path = "cpu.rs"]
mod cpu;
// Also loaded by the other benchmark example when both are compiled into the tests.
#[allow(clippy::duplicate_mod)]
#[path = "../support/sandbox.rs"]
mod sandbox;
#[path = "timed_sink.rs"]
mod timed_sink;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jobrelay::config::{
    DEFAULT_BATCH_SIZE, DEFAULT_CLAIM_SLOTS, DEFAULT_WORKERS, STATEMENT_TIMEOUT,
};
use jobrelay::redis::sink::RedisSink;
use jobrelay::relay::{self, BatchSettings, Health, RelaySettings};
use jobrelay::{Enqueuer, Job, LayoutKind, TableName};
use serde_json::json;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection, PgPool};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Any error, boxed.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

const QUEUES: usize = 8;
const PAYLOAD_BYTES: usize = 200;

/// Row `i`'s payload: `PAYLOAD_BYTES` bytes, a JSON array in the sidekiq layout (Sidekiq's
/// `args`: `[{"thing_id":i,"pad":"xx..."}]`), else `{"thing_id":i,"pad":"xx...` cut off.
fn payload(layout: LayoutKind, i: usize) -> Vec<u8> {
    let (head, tail) = if takes_args(layout) {
        (format!("[{{\"thing_id\":{i},\"pad\":\""), "\"}]")
    } else {
        (format!("{{\"thing_id\":{i},\"pad\":\""), "")
    };
    let pad = PAYLOAD_BYTES.saturating_sub(head.len() + tail.len());
    let mut p = head.into_bytes();
    p.resize(p.len() + pad, b'x');
    p.extend_from_slice(tail.as_bytes());
    p
}

/// Whether the layout's payloads are a job's `args`, a JSON array (sidekiq, celery, rq), or must
/// be JSON anyway (bullmq's `data`: the same arrays).
fn takes_args(layout: LayoutKind) -> bool {
    matches!(
        layout,
        LayoutKind::Sidekiq | LayoutKind::Celery | LayoutKind::Bullmq | LayoutKind::Rq
    )
}

/// The SQL literal of a one-row insert's payload: `[]` (empty `args`) where the layout takes
/// args, else `otherwise`.
fn tiny_payload(layout: LayoutKind, otherwise: &'static str) -> &'static str {
    if takes_args(layout) {
        "'\\x5b5d'"
    } else {
        otherwise
    }
}

/// What to run, and how big.
pub struct Args {
    pub database_url: String,
    pub redis_url: String,
    pub rows: usize,
    pub naive_rows: usize,
    pub rate: usize,
    pub seconds: f64,
    pub insert_seconds: f64,
    pub workers: usize,
    pub batch_size: usize,
    /// `BENCH_LAYOUT`: the Redis layout (`jobrelay`, `conveyor`, `sidekiq`, `celery`, `bullmq` or
    /// `rq`).
    pub layout: LayoutKind,
    /// `BENCH_BACKLOG_ROWS`: the backlog one worker drains in `backlog` (default 1,000,000).
    pub backlog_rows: usize,
    /// `BENCH_VACUUMED=1`: also the drain after `VACUUM (ANALYZE)` (labelled).
    pub vacuumed: bool,
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| default.to_owned())
}

fn env_num<T: std::str::FromStr>(name: &str, default: T) -> Result<T, BoxError>
where
    T::Err: std::fmt::Display,
{
    match std::env::var(name).ok().filter(|s| !s.is_empty()) {
        None => Ok(default),
        Some(v) => v.parse().map_err(|e| format!("{name}={v:?}: {e}").into()),
    }
}

impl Args {
    /// Sizes from `BENCH_*` variables, defaults as documented above.
    pub fn from_env() -> Result<Self, BoxError> {
        Ok(Args {
            database_url: env_or(
                "DATABASE_URL",
                "postgres://postgres@127.0.0.1:5432/postgres",
            ),
            redis_url: env_or("REDIS_URL", "redis://127.0.0.1:6379"),
            rows: env_num("BENCH_ROWS", 200_000)?,
            naive_rows: env_num("BENCH_NAIVE_ROWS", 10_000)?,
            rate: env_num("BENCH_RATE", 2_000)?,
            seconds: env_num("BENCH_SECONDS", 20.0)?,
            insert_seconds: env_num("BENCH_INSERT_SECONDS", 30.0)?,
            workers: env_num("BENCH_WORKERS", DEFAULT_WORKERS)?,
            batch_size: env_num("BENCH_BATCH_SIZE", DEFAULT_BATCH_SIZE)?,
            layout: env_or("BENCH_LAYOUT", "jobrelay").parse()?,
            backlog_rows: env_num("BENCH_BACKLOG_ROWS", 1_000_000)?,
            vacuumed: env_or("BENCH_VACUUMED", "") == "1",
        })
    }
}

/// The bench's own database and namespace, removed by `cleanup`.
struct Sandbox {
    admin_url: String,
    db_name: String,
    pool: PgPool,
    db_url: String,
    redis: redis::Client,
    namespace: String,
    layout: LayoutKind,
}

impl Sandbox {
    async fn create(args: &Args) -> Result<Self, BoxError> {
        let tag = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
        let db_name = format!("jobrelay_bench_{tag}");
        let mut admin = PgConnection::connect(&args.database_url).await?;
        sqlx::query(&format!("CREATE DATABASE {db_name}"))
            .execute(&mut admin)
            .await?;
        admin.close().await?;
        let mut url = url::Url::parse(&args.database_url)?;
        url.set_path(&format!("/{db_name}"));
        let db_url = url.to_string();
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .connect(&db_url)
            .await?;
        jobrelay::db::migrate(&pool, &TableName::default()).await?;
        // Analysed while empty: what autovacuum does to an outbox that is nearly empty most of
        // the time (and the planner keeps until the next ANALYZE, however many rows land).
        sqlx::query("ANALYZE pending_jobs").execute(&pool).await?;
        Ok(Sandbox {
            admin_url: args.database_url.clone(),
            db_name,
            pool,
            db_url,
            redis: redis::Client::open(args.redis_url.as_str())?,
            namespace: format!("bench{tag}:"),
            layout: args.layout,
        })
    }

    /// What `cleanup` removes, detached from the sandbox (for the signal handler).
    fn leftovers(&self) -> Leftovers {
        Leftovers {
            admin_url: self.admin_url.clone(),
            db_name: self.db_name.clone(),
            redis: self.redis.clone(),
            namespace: self.namespace.clone(),
        }
    }

    async fn cleanup(self) {
        self.pool.close().await;
        self.leftovers().remove().await;
    }

    async fn redis_con(&self) -> Result<redis::aio::MultiplexedConnection, BoxError> {
        Ok(self.redis.get_multiplexed_async_connection().await?)
    }

    /// COPYs `n` rows in one transaction: 200-byte payloads, round-robin over 8 queues named
    /// `<prefix>0..7`. No ANALYZE: the statistics stay those of the empty table.
    async fn copy_rows(&self, n: usize, prefix: &str) -> Result<(), BoxError> {
        let mut conn = self.pool.acquire().await?;
        let mut copy = conn
            .copy_in_raw("COPY pending_jobs (queue, job_type, payload) FROM STDIN")
            .await?;
        let mut buf = String::with_capacity(1 << 20);
        for i in 0..n {
            let mut hex = String::with_capacity(PAYLOAD_BYTES * 2);
            for b in payload(self.layout, i) {
                hex.push_str(&format!("{b:02x}"));
            }
            buf.push_str(&format!(
                "{prefix}{}\tProcessThing\t\\\\x{hex}\n",
                i % QUEUES
            ));
            if buf.len() > (1 << 20) {
                copy.send(buf.as_bytes()).await?;
                buf.clear();
            }
        }
        copy.send(buf.as_bytes()).await?;
        copy.finish().await?;
        Ok(())
    }

    async fn jobs_in_queues(&self, prefix: &str) -> Result<usize, BoxError> {
        let mut con = self.redis_con().await?;
        let mut total = 0usize;
        for q in 0..QUEUES {
            let n: usize = redis::cmd("LLEN")
                .arg(self.queue_key(&format!("{prefix}{q}")))
                .query_async(&mut con)
                .await?;
            total += n;
        }
        Ok(total)
    }

    /// The list of `queue` in the bench's layout and namespace.
    fn queue_key(&self, queue: &str) -> String {
        Enqueuer::new(self.namespace.clone(), Duration::ZERO)
            .with_layout(self.layout)
            .queue_key(queue)
    }

    async fn table_empty(&self) -> Result<bool, BoxError> {
        let any: Option<i32> = sqlx::query_scalar("SELECT 1 FROM pending_jobs LIMIT 1")
            .fetch_optional(&self.pool)
            .await?;
        Ok(any.is_none())
    }
}

/// The bench's database and Redis keys, removed at the end of a run or on SIGINT or SIGTERM.
type Leftovers = sandbox::Scratch;

/// The relay with the binary's wiring (one pool, one Redis connection per worker), on a
/// runtime of its own so that the benchmark's producers and consumer do not queue its tasks
/// (in production the relay is a process of its own).
struct RunningRelay {
    tracker: TaskTracker,
    shutdown: CancellationToken,
    runtime: tokio::runtime::Runtime,
}

async fn start_relay(
    sb: &Sandbox,
    args: &Args,
    push_times: Option<timed_sink::PushTimes>,
) -> Result<RunningRelay, BoxError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(cpu::RELAY_THREAD)
        .enable_all()
        .build()?;
    let opts = jobrelay::config::session_settings(sb.db_url.parse()?);
    let pool = jobrelay::db::lazy_pool(opts, args.workers as u32 + 2);
    let enqueuer =
        Enqueuer::new(sb.namespace.clone(), Duration::from_secs(900)).with_layout(args.layout);
    let mut sinks = Vec::new();
    for _ in 0..args.workers {
        // Connected on the relay's runtime, so that the connection's driver task runs there.
        let client = sb.redis.clone();
        let con = runtime
            .spawn(async move {
                jobrelay::redis::connection::connect(&client, Duration::from_secs(5)).await
            })
            .await??;
        sinks.push(timed_sink::TimedSink {
            inner: RedisSink::new(enqueuer.clone(), con, Duration::from_secs(5)),
            times: push_times.clone(),
        });
    }
    let settings = RelaySettings {
        table: TableName::default(),
        batch: BatchSettings {
            batch_size: args.batch_size,
            max_attempts: 25,
            statement_timeout: STATEMENT_TIMEOUT,
            // As the daemon: its batches take a fleet-wide claim slot.
            claim_slots: Some(DEFAULT_CLAIM_SLOTS as u32),
            ..BatchSettings::default()
        },
        poll_interval: Duration::from_secs(1),
    };
    let tracker = TaskTracker::new();
    let shutdown = CancellationToken::new();
    {
        let _on_relay_runtime = runtime.enter();
        relay::spawn(
            &tracker,
            &settings,
            pool,
            sinks,
            Arc::new(Health::default()),
            shutdown.clone(),
        );
    }
    tracker.close();
    Ok(RunningRelay {
        tracker,
        shutdown,
        runtime,
    })
}

impl RunningRelay {
    async fn stop(self) {
        self.shutdown.cancel();
        self.tracker.wait().await;
        self.runtime.shutdown_background();
    }
}

async fn wait_for<F, Fut>(what: &str, limit: Duration, mut cond: F) -> Result<(), BoxError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool, BoxError>>,
{
    let start = Instant::now();
    while !cond().await? {
        if start.elapsed() > limit {
            return Err(format!("timed out after {limit:?} waiting for {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

/// The relay has been running on a nearly empty table: it relays `n` single rows, one at a
/// time, each in a transaction of its own (its statements are planned, and any plan cache
/// filled, while the table holds at most one row).
async fn warm_up(sb: &Sandbox, n: usize) -> Result<(), BoxError> {
    let sql = format!(
        "INSERT INTO pending_jobs (queue, job_type, payload) VALUES ('warm', 'Warm', {})",
        tiny_payload(sb.layout, "''")
    );
    for i in 0..n {
        sqlx::query(&sql).execute(&sb.pool).await?;
        wait_for("a warm-up row", Duration::from_secs(30), || async {
            sb.table_empty().await
        })
        .await
        .map_err(|e| format!("warm-up row {i}: {e}"))?;
    }
    Ok(())
}

async fn bench_drain(
    sb: &Sandbox,
    args: &Args,
    vacuumed: bool,
) -> Result<serde_json::Value, BoxError> {
    let prefix = if vacuumed { "vacuumed" } else { "drain" };
    let (relay, cpu0, t0) = if vacuumed {
        // The old way: rows COPYed, VACUUM (ANALYZE), then the relay starts on them.
        sb.copy_rows(args.rows, prefix).await?;
        sqlx::query("VACUUM (ANALYZE) pending_jobs")
            .execute(&sb.pool)
            .await?;
        let cpu0 = cpu::CpuSnapshot::take(&sb.redis).await;
        let t0 = Instant::now();
        (start_relay(sb, args, None).await?, cpu0, t0)
    } else {
        let relay = start_relay(sb, args, None).await?;
        warm_up(sb, 20).await?;
        sb.copy_rows(args.rows, prefix).await?;
        (
            relay,
            cpu::CpuSnapshot::take(&sb.redis).await,
            Instant::now(),
        )
    };
    wait_for("the drain", Duration::from_secs(600), || async {
        Ok(sb.table_empty().await? && sb.jobs_in_queues(prefix).await? == args.rows)
    })
    .await?;
    let elapsed = t0.elapsed().as_secs_f64();
    let cpu1 = cpu::CpuSnapshot::take(&sb.redis).await;
    relay.stop().await;
    let breakdown = cpu1.per_job_since(&cpu0, args.rows);
    let relay_us = breakdown["cpu_us_per_job"]["relay"].as_f64().unwrap_or(0.0);
    Ok(json!({
        "table_state": if vacuumed {
            "VACUUM (ANALYZE) after the COPY, relay started on the rows (not a production state)"
        } else {
            "analysed while empty, relay running, rows COPYed in one transaction"
        },
        "rows": args.rows,
        "seconds": round(elapsed, 3),
        "rows_per_second": round(args.rows as f64 / elapsed, 0),
        "relay_cpu_seconds_per_100k": round(relay_us / 10.0, 3),
        "cpu": breakdown,
    }))
}

/// One worker's batches, run directly on a backlog of `BENCH_BACKLOG_ROWS` rows COPYed onto
/// the table the drain left (its dead tuples, statistics of the empty table): where a batch's
/// time goes, per 1,000 rows, and the claim statement's time from the first batch to the last.
async fn bench_stages(sb: &Sandbox, args: &Args) -> Result<serde_json::Value, BoxError> {
    let rows = args.backlog_rows.max(1);
    sb.copy_rows(rows, "stages").await?;
    let opts = jobrelay::config::session_settings(sb.db_url.parse()?);
    let pool = jobrelay::db::lazy_pool(opts, 2);
    let con = jobrelay::redis::connection::connect(&sb.redis, Duration::from_secs(5)).await?;
    let sink = RedisSink::new(
        Enqueuer::new(sb.namespace.clone(), Duration::from_secs(900)).with_layout(args.layout),
        con,
        Duration::from_secs(5),
    );
    let batcher = relay::Batcher::new(
        pool,
        Arc::new(relay::Queries::for_layout(
            &TableName::default(),
            args.layout,
        )),
        Arc::new(BatchSettings {
            batch_size: args.batch_size,
            max_attempts: 25,
            statement_timeout: STATEMENT_TIMEOUT,
            ..BatchSettings::default()
        }),
        sink,
    );
    let mut total = relay::Report::default();
    let mut claims_ms = Vec::new();
    let t0 = Instant::now();
    loop {
        let r = batcher.run_once(None).await?;
        total.add(&r);
        if r.claimed == 0 {
            break;
        }
        claims_ms.push(r.stages.claim.as_secs_f64() * 1000.0);
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let per_k = |d: Duration| {
        round(
            d.as_secs_f64() * 1000.0 / (total.claimed as f64 / 1000.0),
            3,
        )
    };
    let s = total.stages;
    let mut sorted = claims_ms.clone();
    sorted.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        sorted
            .get(((sorted.len() as f64 * p).ceil() as usize).saturating_sub(1))
            .map_or(0.0, |v| round(*v, 2))
    };
    // The claim's mean time over each tenth of the batches, first to last: flat is the goal.
    let tenth = claims_ms.len().div_ceil(10).max(1);
    let curve: Vec<f64> = claims_ms
        .chunks(tenth)
        .map(|c| round(c.iter().sum::<f64>() / c.len() as f64, 2))
        .collect();
    Ok(json!({
        "table_state": "dead tuples of the drain before, analysed while empty, COPYed at once",
        "claim_ms": {
            "batches": claims_ms.len(),
            "p50": pct(0.5),
            "p99": pct(0.99),
            "max": pct(1.0),
            "mean_per_tenth_first_to_last": curve,
        },
        "rows": total.claimed,
        "one_worker_rows_per_second": round(total.claimed as f64 / elapsed, 0),
        "ms_per_1000_rows": {
            "begin": per_k(s.begin),
            "claim": per_k(s.claim),
            "push": per_k(s.push),
            "settle": per_k(s.settle),
            "commit": per_k(s.commit),
        },
    }))
}

/// A row as the naive relay reads it.
type NaiveRow = (
    i64,
    uuid::Uuid,
    String,
    String,
    Vec<u8>,
    chrono::DateTime<chrono::Utc>,
);

/// One row per transaction, one EVALSHA per job: what a straightforward relay does.
async fn bench_naive(sb: &Sandbox, args: &Args) -> Result<serde_json::Value, BoxError> {
    sb.copy_rows(args.naive_rows, "naive").await?;
    let enqueuer =
        Enqueuer::new(sb.namespace.clone(), Duration::from_secs(900)).with_layout(args.layout);
    let mut con = sb.redis_con().await?;
    let mut conn = sb.pool.acquire().await?;
    let t0 = Instant::now();
    let mut n = 0usize;
    loop {
        let mut tx = conn.begin().await?;
        let row: Option<NaiveRow> = sqlx::query_as(
            "SELECT id, uuid, queue, job_type, payload, created_at FROM pending_jobs
                 WHERE available_at <= now() ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED",
        )
        .fetch_optional(&mut *tx)
        .await?;
        let Some((id, uuid, queue, job_type, payload, created_at)) = row else {
            break;
        };
        let job = Job {
            uuid,
            queue,
            job_type,
            payload,
            parent_uuid: None,
            predecessor_uuid: None,
            dead_parent: false,
            run_at: None,
            created_at,
            headers: Default::default(),
        };
        enqueuer.enqueue(&mut con, &job).await?;
        sqlx::query("DELETE FROM pending_jobs WHERE id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        n += 1;
    }
    let elapsed = t0.elapsed().as_secs_f64();
    if n != args.naive_rows || sb.jobs_in_queues("naive").await? != args.naive_rows {
        return Err("naive relay lost rows".into());
    }
    Ok(json!({
        "rows": n,
        "seconds": round(elapsed, 3),
        "rows_per_second": round(n as f64 / elapsed, 0),
    }))
}

async fn bench_latency(sb: &Sandbox, args: &Args) -> Result<serde_json::Value, BoxError> {
    // A steady stream into the table the drains before left: hundreds of thousands of dead
    // tuples, not vacuumed (a production state: autovacuum comes when it comes).
    let total = (args.rate as f64 * args.seconds) as usize;
    let pushes: timed_sink::PushTimes = Arc::new(Mutex::new(HashMap::with_capacity(total)));
    let relay = start_relay(sb, args, Some(pushes.clone())).await?;
    let cpu0 = cpu::CpuSnapshot::take(&sb.redis).await;
    let committed: Arc<Mutex<HashMap<uuid::Uuid, Instant>>> =
        Arc::new(Mutex::new(HashMap::with_capacity(total)));
    let popped: Arc<Mutex<HashMap<uuid::Uuid, Instant>>> =
        Arc::new(Mutex::new(HashMap::with_capacity(total)));

    // The consumer: BRPOP, then RPOP up to 100 more without blocking while the list has any;
    // each job is timed when the reply that carried it arrived. A thread of its own with a
    // blocking connection, as a consumer process would be, so that the producers' tasks cannot
    // delay its timestamps. Popping one job per round trip would measure the consumer: it
    // falls behind whenever a batch lands, and the slowest jobs then wait for it, not for the
    // relay.
    let consumer = {
        let popped = popped.clone();
        let mut con = sb.redis.get_connection()?;
        let key = sb.queue_key("latency");
        let layout = args.layout;
        std::thread::spawn(move || {
            use prost::Message;
            let mut seen = 0;
            while seen < total {
                let first: Option<(String, Vec<u8>)> = redis::cmd("BRPOP")
                    .arg(&key)
                    .arg(1)
                    .query(&mut con)
                    .unwrap_or(None);
                let Some((_, first)) = first else { continue };
                let mut reply = vec![first];
                let mut now = Instant::now();
                loop {
                    let mut popped = popped.lock().unwrap();
                    for bytes in reply.drain(..) {
                        let uuid = match layout {
                            LayoutKind::Jobrelay => {
                                jobrelay::proto::v1::Job::decode(bytes.as_slice())
                                    .expect("a job")
                                    .uuid
                            }
                            LayoutKind::Conveyor => {
                                jobrelay::proto::wire::Job::decode(bytes.as_slice())
                                    .expect("a job")
                                    .uuid
                            }
                            // The jid is the uuid's 32 hex digits.
                            LayoutKind::Sidekiq => {
                                serde_json::from_slice::<serde_json::Value>(&bytes)
                                    .expect("a Sidekiq job")["jid"]
                                    .as_str()
                                    .expect("a jid")
                                    .to_owned()
                            }
                            LayoutKind::Celery => {
                                let msg: serde_json::Value =
                                    serde_json::from_slice(&bytes).expect("a celery message");
                                msg["headers"]["id"].as_str().expect("a task id").to_owned()
                            }
                            // The wait list holds the job ids: the uuids.
                            LayoutKind::Bullmq => String::from_utf8(bytes).expect("a job id"),
                            // RQ's queue holds job ids: the uuid itself.
                            LayoutKind::Rq => String::from_utf8(bytes).expect("a job id"),
                        };
                        popped.insert(uuid.parse().expect("a uuid"), now);
                        seen += 1;
                    }
                    drop(popped);
                    reply = redis::cmd("RPOP")
                        .arg(&key)
                        .arg(100)
                        .query::<Option<Vec<Vec<u8>>>>(&mut con)
                        .unwrap_or(None)
                        .unwrap_or_default();
                    now = Instant::now();
                    if reply.is_empty() {
                        break;
                    }
                }
            }
        })
    };

    let insert = format!(
        "INSERT INTO pending_jobs (uuid, queue, job_type, payload) VALUES ($1, 'latency', 'Ping', {})",
        tiny_payload(args.layout, "'\\x00'")
    );
    // Producers: job i is due at t0 + i / rate. Each commit waits for its WAL flush, so it
    // takes several connections (whose commits share flushes) to keep the schedule.
    let producers = 16usize;
    let t0 = Instant::now();
    let interval = Duration::from_secs_f64(1.0 / args.rate as f64);
    let mut handles = Vec::new();
    for p in 0..producers {
        let mut conn = sb.pool.acquire().await?.detach();
        let committed = committed.clone();
        let insert = insert.clone();
        handles.push(tokio::spawn(async move {
            let mut i = p;
            while i < total {
                let due = t0 + interval * i as u32;
                tokio::time::sleep_until(due.into()).await;
                let uuid = uuid::Uuid::new_v4();
                sqlx::query(&insert)
                    .bind(uuid)
                    .execute(&mut conn)
                    .await
                    .expect("insert");
                committed.lock().unwrap().insert(uuid, Instant::now());
                i += producers;
            }
        }));
    }
    for h in handles {
        h.await?;
    }
    let produce_secs = t0.elapsed().as_secs_f64();
    let cpu = cpu::CpuSnapshot::take(&sb.redis)
        .await
        .per_job_since(&cpu0, total);
    tokio::time::timeout(
        Duration::from_secs(60),
        tokio::task::spawn_blocking(move || consumer.join()),
    )
    .await??
    .map_err(|_| "the consumer thread panicked")?;
    relay.stop().await;

    let committed = committed.lock().unwrap();
    let popped = popped.lock().unwrap();
    let pushes = pushes.lock().unwrap();
    let mut lat: Vec<f64> = committed
        .iter()
        .map(|(u, c)| {
            let p = popped.get(u).expect("every job popped");
            // The relay can push a row before its producer has even seen COMMIT return.
            p.saturating_duration_since(*c).as_secs_f64() * 1000.0
        })
        .collect();
    lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let q = |p: f64| lat[((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len()) - 1];
    Ok(json!({
        "table_state": "dead tuples of the stages before, not vacuumed",
        "jobs": lat.len(),
        "target_rate": args.rate,
        "achieved_rate": round(lat.len() as f64 / produce_secs, 0),
        "p50_ms": round(q(0.50), 3),
        "p99_ms": round(q(0.99), 3),
        "max_ms": round(*lat.last().unwrap_or(&0.0), 3),
        "all_jobs": split_latency(&committed, &pushes, &popped, 0.0),
        "slowest_1_percent": split_latency(&committed, &pushes, &popped, q(0.99)),
        "cpu": cpu,
    }))
}

/// Where the time of the jobs whose latency is at least `from_ms` went, on average: waiting
/// to be claimed (commit returned until the relay's push began), the push to Redis, and
/// until the consumer popped the job; with how many relay batches and 100 ms windows of
/// commit time those jobs fall in (few: one stall; many: spread out).
fn split_latency(
    committed: &HashMap<uuid::Uuid, Instant>,
    pushes: &HashMap<uuid::Uuid, (Instant, Instant)>,
    popped: &HashMap<uuid::Uuid, Instant>,
    from_ms: f64,
) -> serde_json::Value {
    let Some(origin) = committed.values().min().copied() else {
        return json!(null);
    };
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let (mut n, mut wait, mut push, mut pop) = (0usize, 0.0, 0.0, 0.0);
    let mut batches = std::collections::HashSet::new();
    let mut windows = std::collections::HashSet::new();
    for (uuid, &c) in committed {
        let (Some(&(ps, pe)), Some(&p)) = (pushes.get(uuid), popped.get(uuid)) else {
            continue;
        };
        if ms(p.saturating_duration_since(c)) < from_ms {
            continue;
        }
        n += 1;
        // A push can begin before the producer has seen its COMMIT return.
        wait += ms(ps.saturating_duration_since(c));
        push += ms(pe.saturating_duration_since(ps.max(c)));
        pop += ms(p.saturating_duration_since(pe.max(c)));
        batches.insert(ps);
        windows.insert(c.duration_since(origin).as_millis() / 100);
    }
    let mean = |x: f64| round(x / n.max(1) as f64, 3);
    json!({
        "jobs": n,
        "mean_wait_for_claim_ms": mean(wait),
        "mean_push_ms": mean(push),
        "mean_until_popped_ms": mean(pop),
        "batches": batches.len(),
        "windows_of_100ms": windows.len(),
    })
}

/// Single-row inserts by `PRODUCERS` concurrent producers for `seconds`, while the relay
/// drains them (as in production); returns rows/s.
async fn insert_rate(sb: &Sandbox, seconds: f64) -> Result<f64, BoxError> {
    let stop = Instant::now() + Duration::from_secs_f64(seconds);
    let insert = format!(
        "INSERT INTO pending_jobs (queue, job_type, payload) VALUES ('ins', 'X', {})",
        tiny_payload(sb.layout, "'\\x00'")
    );
    let mut handles = Vec::new();
    for _ in 0..PRODUCERS {
        let mut conn = sb.pool.acquire().await?.detach();
        let insert = insert.clone();
        handles.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < stop {
                sqlx::query(&insert)
                    .execute(&mut conn)
                    .await
                    .expect("insert");
                n += 1;
            }
            n
        }));
    }
    let mut n = 0;
    for h in handles {
        n += h.await?;
    }
    Ok(n as f64 / seconds)
}

const PRODUCERS: usize = 8;

/// Producer insert rate with the notify trigger and without it, the relay running throughout.
///
/// The machine's speed drifts by more than the effect measured (the same 4 s pgbench run
/// varies by 15% here), so the two sides alternate in short pairs, the order flipping from one
/// pair to the next, and the cost reported is the median of the pairs' own ratios.
async fn bench_notify_cost(sb: &Sandbox, args: &Args) -> Result<serde_json::Value, BoxError> {
    const PAIR_SECONDS: f64 = 2.0;
    let relay = start_relay(sb, args, None).await?;
    let pairs = ((args.insert_seconds / PAIR_SECONDS).round() as usize).max(2);
    let side = args.insert_seconds / pairs as f64 / 2.0;
    let set_trigger = |on: bool| {
        let sql = if on {
            "ALTER TABLE pending_jobs ENABLE TRIGGER pending_jobs_notify"
        } else {
            "ALTER TABLE pending_jobs DISABLE TRIGGER pending_jobs_notify"
        };
        sqlx::query(sql).execute(&sb.pool)
    };
    let (mut with, mut without, mut costs) = (0.0, 0.0, Vec::new());
    for pair in 0..pairs {
        let mut rate = [0.0; 2];
        let order = if pair % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for on in order {
            set_trigger(on).await?;
            rate[on as usize] = insert_rate(sb, side).await?;
        }
        with += rate[1];
        without += rate[0];
        costs.push((1.0 - rate[1] / rate[0]) * 100.0);
    }
    set_trigger(true).await?;
    relay.stop().await;
    costs.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let median = if costs.len() % 2 == 1 {
        costs[costs.len() / 2]
    } else {
        (costs[costs.len() / 2 - 1] + costs[costs.len() / 2]) / 2.0
    };
    Ok(json!({
        "producers": PRODUCERS,
        "pairs": pairs,
        "inserts_per_second_with_trigger": round(with / pairs as f64, 0),
        "inserts_per_second_without_trigger": round(without / pairs as f64, 0),
        "overhead_percent": round(median, 1),
        "overhead_percent_each_pair": costs.iter().map(|c| round(*c, 1)).collect::<Vec<_>>(),
    }))
}

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

async fn run(args: &Args, sb: &Sandbox) -> Result<serde_json::Value, BoxError> {
    let drain = bench_drain(sb, args, false).await?;
    let stages = bench_stages(sb, args).await?;
    let naive = bench_naive(sb, args).await?;
    let ratio = drain["rows_per_second"].as_f64().unwrap_or(0.0)
        / naive["rows_per_second"].as_f64().unwrap_or(f64::INFINITY);
    let latency = bench_latency(sb, args).await?;
    let notify = bench_notify_cost(sb, args).await?;
    Ok(json!({
        "settings": {
            "workers": args.workers,
            "batch_size": args.batch_size,
            "dedup": true,
            "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        },
        "drain": drain,
        "drain_vacuumed": if args.vacuumed {
            bench_drain(sb, args, true).await?
        } else {
            serde_json::Value::Null
        },
        "stages": stages,
        "naive": naive,
        "drain_over_naive": round(ratio, 1),
        "latency": latency,
        "notify_cost": notify,
    }))
}

/// Runs the whole benchmark in a database and namespace of its own, removed afterwards even
/// when a stage fails; returns the JSON report.
pub async fn bench(args: &Args) -> Result<serde_json::Value, BoxError> {
    bench_in_sandbox(args, false).await
}

/// [`bench`]; with `on_signal`, SIGINT or SIGTERM removes the database and keys and exits 130
/// (only for the program: a test must not take over its process's signals).
async fn bench_in_sandbox(args: &Args, on_signal: bool) -> Result<serde_json::Value, BoxError> {
    let sb = Sandbox::create(args).await?;
    let sandbox = json!({ "database": sb.db_name.clone(), "namespace": sb.namespace.clone() });
    let on_signal = on_signal.then(|| {
        let leftovers = sb.leftovers();
        tokio::spawn(async move {
            let what = leftovers.db_name.clone();
            sandbox::remove_on_signal("bench", what, leftovers.remove()).await
        })
    });
    let result = run(args, &sb).await;
    if sandbox::interrupted() {
        // The stage failed because its database is being dropped: let the handler finish.
        std::future::pending::<()>().await;
    }
    if let Some(task) = on_signal {
        task.abort();
    }
    sb.cleanup().await;
    let mut report = result?;
    report["sandbox"] = sandbox;
    Ok(report)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::from_env()?;
    let report = bench_in_sandbox(&args, true).await?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
