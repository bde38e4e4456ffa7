//! The held-horizon benchmark (issue "Postgres in production", acceptance item 4): the claim's
//! cost while a long transaction holds the xmin horizon, against the same stream without one.
//!
//! ```text
//! cargo run --release --example horizon
//! HORIZON_PHASE=60s HORIZON_HOUR_ROWS=500000 cargo run --release --example horizon
//! ```
//!
//! A producer commits `HORIZON_RATE` rows/s (default 1,500; a transaction every 10 ms) into a
//! table of its own database (`jobrelay_horizon_<random>` next to `DATABASE_URL`, dropped at
//! the end, also on SIGINT or SIGTERM), analysed while empty, while `HORIZON_WORKERS` relay
//! workers (default 2; the relay's own `Batcher`s sharing one claim cursor, as one relay's
//! workers do, and polling every 20 ms when a batch was not full) claim them. Jobs go to a sink
//! that acknowledges without Redis: what is measured is Postgres's side, undiluted by the push.
//!
//! Phases alternate, `HORIZON_PHASE` each (default `5m`), `HORIZON_PAIRS` pairs (default 1):
//! **A** without a held horizon, **B** with `BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1;`
//! open on another connection for the whole phase. Every `HORIZON_WINDOW` (default `30s`) a
//! line: batches, jobs, batch mean and claim mean (ms), the table's dead tuples
//! (`n_dead_tup`) and size (heap and indexes), and Postgres CPU per job (µs): the CPU of this
//! database's backends (from `/proc/<pid>/schedstat`; other clients of a shared server are not
//! counted, nor are the WAL writer and checkpointer). The goal: at the end of B, batch mean
//! within 2x of A's and CPU per job within 1.5x.
//!
//! Then the simulated hour, **H** (`HORIZON_HOUR_ROWS`, default 2,000,000; 0 skips it): the
//! horizon held again, the producer keeps 20,000 rows waiting (10,000-row transactions) until
//! that many rows went through, and the claim mean is printed per tenth of them: flat is the
//! goal. An hour at 1,500 rows/s is 5.4 million rows; every claim at the end walks what is
//! below its start, so 2 million show the trend.
//!
//! Prints one JSON object on stdout (every window, and per phase the last window), the lines
//! on stderr. The server's `autovacuum` setting is used as it is (reported).

#[allow(clippy::duplicate_mod)]
#[path = "../support/proc_stat.rs"]
mod proc_stat;
#[allow(clippy::duplicate_mod)]
#[path = "../support/sandbox.rs"]
mod sandbox;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jobrelay::config::STATEMENT_TIMEOUT;
use jobrelay::redis::enqueue::JobResult;
use jobrelay::relay::cursor::ClaimCursor;
use jobrelay::relay::{self, BatchSettings, JobSink};
use jobrelay::{Job, Outcome, TableName};
use serde_json::{json, Value};
use sqlx::{Connection, PgConnection, PgPool};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Acknowledges every job at once: the benchmark measures Postgres.
struct Acknowledge;

impl JobSink for Acknowledge {
    async fn push(&self, jobs: &[Job]) -> jobrelay::Result<Vec<JobResult>> {
        Ok(jobs.iter().map(|_| Ok(Outcome::Queued)).collect())
    }
}

struct Args {
    database_url: String,
    rate: u64,
    workers: usize,
    phase: Duration,
    pairs: usize,
    window: Duration,
    hour_rows: u64,
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|s| !s.is_empty())
}

fn num<T: std::str::FromStr>(name: &str, default: T) -> Result<T, BoxError>
where
    T::Err: std::fmt::Display,
{
    var(name).map_or(Ok(default), |v| {
        v.parse().map_err(|e| format!("{name}={v:?}: {e}").into())
    })
}

fn duration(name: &str, default: &str) -> Result<Duration, BoxError> {
    let v = var(name).unwrap_or_else(|| default.to_owned());
    Ok(humantime::parse_duration(&v).map_err(|e| format!("{name}={v:?}: {e}"))?)
}

impl Args {
    fn from_env() -> Result<Self, BoxError> {
        Ok(Args {
            database_url: var("DATABASE_URL")
                .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/postgres".into()),
            rate: num("HORIZON_RATE", 1_500)?,
            workers: num("HORIZON_WORKERS", 2)?,
            phase: duration("HORIZON_PHASE", "5m")?,
            pairs: num("HORIZON_PAIRS", 1)?,
            window: duration("HORIZON_WINDOW", "30s")?,
            hour_rows: num("HORIZON_HOUR_ROWS", 2_000_000)?,
        })
    }
}

/// What the workers did, summed.
#[derive(Default)]
struct Totals {
    batches: AtomicU64,
    jobs: AtomicU64,
    claim_us: AtomicU64,
    batch_us: AtomicU64,
}

#[derive(Clone, Copy)]
struct Sample {
    at: Instant,
    batches: u64,
    jobs: u64,
    claim_us: u64,
    batch_us: u64,
    pg_cpu: f64,
}

struct Bench {
    pool: PgPool,
    db_name: String,
    totals: Arc<Totals>,
    produced: Arc<AtomicU64>,
    cpu_seen: Mutex<HashMap<u32, f64>>,
    cpu_gone: Mutex<f64>,
}

/// CPU seconds of one Postgres backend.
fn backend_cpu(pid: u32) -> Option<f64> {
    if let Some(ns) = std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
    {
        return Some(ns / 1e9);
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    proc_stat::stat_cpu(&stat).map(|(_, s)| s)
}

impl Bench {
    /// CPU seconds of this database's backends so far (backends that ended keep their last
    /// reading).
    async fn pg_cpu(&self) -> Result<f64, BoxError> {
        let pids: Vec<i32> =
            sqlx::query_scalar("SELECT pid FROM pg_stat_activity WHERE datname = $1")
                .bind(&self.db_name)
                .fetch_all(&self.pool)
                .await?;
        let mut seen = self.cpu_seen.lock().unwrap();
        let mut gone = self.cpu_gone.lock().unwrap();
        let now: HashMap<u32, f64> = pids
            .iter()
            .filter_map(|&p| Some((p as u32, backend_cpu(p as u32)?)))
            .collect();
        for (pid, cpu) in seen.iter() {
            if !now.contains_key(pid) {
                *gone += cpu;
            }
        }
        *seen = now;
        Ok(*gone + seen.values().sum::<f64>())
    }

    async fn sample(&self) -> Result<Sample, BoxError> {
        let t = &self.totals;
        Ok(Sample {
            at: Instant::now(),
            batches: t.batches.load(Ordering::Relaxed),
            jobs: t.jobs.load(Ordering::Relaxed),
            claim_us: t.claim_us.load(Ordering::Relaxed),
            batch_us: t.batch_us.load(Ordering::Relaxed),
            pg_cpu: self.pg_cpu().await?,
        })
    }

    /// One window's line: from `a` to `b`.
    async fn window(&self, phase: &str, a: &Sample, b: &Sample) -> Result<Value, BoxError> {
        let (dead, size): (i64, i64) = sqlx::query_as(
            "SELECT n_dead_tup, pg_total_relation_size('pending_jobs')
             FROM pg_stat_user_tables WHERE relname = 'pending_jobs'",
        )
        .fetch_one(&self.pool)
        .await?;
        let batches = (b.batches - a.batches).max(1) as f64;
        let jobs = b.jobs - a.jobs;
        let w = json!({
            "phase": phase,
            "seconds": round(b.at.duration_since(a.at).as_secs_f64(), 1),
            "batches": b.batches - a.batches,
            "jobs": jobs,
            "batch_mean_ms": round((b.batch_us - a.batch_us) as f64 / batches / 1000.0, 2),
            "claim_mean_ms": round((b.claim_us - a.claim_us) as f64 / batches / 1000.0, 2),
            "dead_tuples": dead,
            "table_mb": round(size as f64 / 1048576.0, 1),
            "pg_cpu_us_per_job": round((b.pg_cpu - a.pg_cpu) * 1e6 / (jobs.max(1) as f64), 1),
            "pg_cores": round((b.pg_cpu - a.pg_cpu) / b.at.duration_since(a.at).as_secs_f64(), 2),
            "backlog": self.produced.load(Ordering::Relaxed).saturating_sub(b.jobs),
        });
        eprintln!("{w}");
        Ok(w)
    }
}

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

/// Inserts `n` rows in one transaction.
async fn insert(pool: &PgPool, n: i64) -> Result<(), BoxError> {
    sqlx::query(
        "INSERT INTO pending_jobs (queue, job_type, payload)
         SELECT 'horizon', 'Tick', convert_to(repeat('x', 200), 'UTF8')
         FROM generate_series(1, $1)",
    )
    .bind(n)
    .execute(pool)
    .await?;
    Ok(())
}

async fn run(args: &Args, bench: &Bench, db_url: &str) -> Result<Value, BoxError> {
    let opts = jobrelay::config::session_settings(db_url.parse()?);
    let relay_pool = jobrelay::db::lazy_pool(opts, args.workers as u32 + 1);
    let queries = Arc::new(relay::Queries::new(&TableName::default()));
    let settings = Arc::new(BatchSettings {
        statement_timeout: STATEMENT_TIMEOUT,
        ..BatchSettings::default()
    });
    let cursor = Arc::new(ClaimCursor::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for _ in 0..args.workers {
        let b = relay::Batcher::new(
            relay_pool.clone(),
            queries.clone(),
            settings.clone(),
            Acknowledge,
        )
        .with_cursor(cursor.clone());
        let (totals, stop) = (bench.totals.clone(), stop.clone());
        let batch_size = settings.batch_size as u64;
        workers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let t0 = Instant::now();
                let r = b.run_once(None).await?;
                if r.claimed > 0 {
                    totals.batches.fetch_add(1, Ordering::Relaxed);
                    totals.jobs.fetch_add(r.claimed, Ordering::Relaxed);
                    totals
                        .claim_us
                        .fetch_add(r.stages.claim.as_micros() as u64, Ordering::Relaxed);
                    totals
                        .batch_us
                        .fetch_add(t0.elapsed().as_micros() as u64, Ordering::Relaxed);
                }
                if !r.more && r.claimed < batch_size {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            Ok::<_, BoxError>(())
        }));
    }
    let mut holder = PgConnection::connect(db_url).await?;
    let mut windows = Vec::new();
    let mut phases = Vec::new();

    // The steady stream, A and B alternating.
    let steady = {
        let (pool, produced, stop, rate) = (
            bench.pool.clone(),
            bench.produced.clone(),
            Arc::new(AtomicBool::new(false)),
            args.rate,
        );
        let s = stop.clone();
        let task = tokio::spawn(async move {
            let t0 = Instant::now();
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            while !s.load(Ordering::Relaxed) {
                tick.tick().await;
                let due = (t0.elapsed().as_secs_f64() * rate as f64) as u64;
                let n = due.saturating_sub(produced.load(Ordering::Relaxed));
                if n > 0 {
                    insert(&pool, n as i64).await?;
                    produced.fetch_add(n, Ordering::Relaxed);
                }
            }
            Ok::<_, BoxError>(())
        });
        (task, stop)
    };
    for pair in 1..=args.pairs {
        for held in [false, true] {
            let name = format!("{}{pair}", if held { "B" } else { "A" });
            if held {
                sqlx::raw_sql("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1")
                    .execute(&mut holder)
                    .await?;
            }
            let start = Instant::now();
            let mut last = bench.sample().await?;
            let mut last_window = Value::Null;
            while start.elapsed() < args.phase {
                tokio::time::sleep(args.window.min(args.phase - start.elapsed())).await;
                let now = bench.sample().await?;
                last_window = bench.window(&name, &last, &now).await?;
                windows.push(last_window.clone());
                last = now;
            }
            if held {
                sqlx::raw_sql("ROLLBACK").execute(&mut holder).await?;
            }
            phases.push(json!({ "phase": name, "last_window": last_window }));
        }
    }
    steady.1.store(true, Ordering::Relaxed);
    steady.0.await??;

    // The simulated hour: the horizon held while `hour_rows` rows go through.
    let mut hour = Vec::new();
    if args.hour_rows > 0 {
        sqlx::raw_sql("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1")
            .execute(&mut holder)
            .await?;
        let base = bench.sample().await?;
        let target = base.jobs + args.hour_rows;
        let step = (args.hour_rows / 10).max(1);
        let mut last = base;
        let mut next = base.jobs + step;
        loop {
            let s = bench.sample().await?;
            if s.jobs >= next {
                hour.push(bench.window("H", &last, &s).await?);
                last = s;
                next += step;
            }
            if s.jobs >= target {
                break;
            }
            let produced = bench.produced.load(Ordering::Relaxed);
            if produced < target && produced.saturating_sub(s.jobs) < 20_000 {
                let n = 10_000.min(target - produced);
                insert(&bench.pool, n as i64).await?;
                bench.produced.fetch_add(n, Ordering::Relaxed);
            } else {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        sqlx::raw_sql("ROLLBACK").execute(&mut holder).await?;
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await??;
    }
    holder.close().await?;
    relay_pool.close().await;

    let last = |p: &str, k: &str| -> f64 {
        phases
            .iter()
            .rev()
            .find(|x| x["phase"].as_str().is_some_and(|n| n.starts_with(p)))
            .and_then(|x| x["last_window"][k].as_f64())
            .unwrap_or(f64::NAN)
    };
    let ratio = |k: &str| round(last("B", k) / last("A", k), 2);
    let autovacuum: String = sqlx::query_scalar("SHOW autovacuum")
        .fetch_one(&bench.pool)
        .await?;
    Ok(json!({
        "settings": {
            "rate": args.rate,
            "workers": args.workers,
            "phase_seconds": args.phase.as_secs_f64(),
            "pairs": args.pairs,
            "hour_rows": args.hour_rows,
            "autovacuum": autovacuum,
        },
        "phases": phases,
        "b_over_a_at_the_end": {
            "batch_mean": ratio("batch_mean_ms"),
            "pg_cpu_per_job": ratio("pg_cpu_us_per_job"),
        },
        "hour_claim_mean_ms_per_tenth": hour.iter().map(|w| w["claim_mean_ms"].clone()).collect::<Vec<_>>(),
        "hour": hour,
        "windows": windows,
    }))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::from_env()?;
    let tag = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
    let db_name = format!("jobrelay_horizon_{tag}");
    let mut admin = PgConnection::connect(&args.database_url).await?;
    sqlx::query(&format!("CREATE DATABASE {db_name}"))
        .execute(&mut admin)
        .await?;
    admin.close().await?;
    let scratch = sandbox::Scratch {
        admin_url: args.database_url.clone(),
        db_name: db_name.clone(),
        redis: redis::Client::open("redis://127.0.0.1:6379")?,
        namespace: format!("horizon{tag}:"),
    };
    let on_signal = {
        let s = scratch.clone();
        tokio::spawn(async move {
            let what = s.db_name.clone();
            sandbox::remove_on_signal("horizon", what, async move { s.remove().await }).await
        })
    };
    let mut url = url::Url::parse(&args.database_url)?;
    url.set_path(&format!("/{db_name}"));
    let db_url = url.to_string();
    let result = async {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(4)
            .connect(&db_url)
            .await?;
        jobrelay::db::migrate(&pool, &TableName::default()).await?;
        sqlx::query("ANALYZE pending_jobs").execute(&pool).await?;
        let bench = Bench {
            pool: pool.clone(),
            db_name: db_name.clone(),
            totals: Arc::default(),
            produced: Arc::default(),
            cpu_seen: Mutex::default(),
            cpu_gone: Mutex::default(),
        };
        let report = run(&args, &bench, &db_url).await;
        pool.close().await;
        report
    }
    .await;
    if sandbox::interrupted() {
        std::future::pending::<()>().await;
    }
    on_signal.abort();
    scratch.remove().await;
    println!("{}", serde_json::to_string_pretty(&result?)?);
    Ok(())
}
