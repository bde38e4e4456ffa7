//! Producer insert rate: how many jobs per second `PendingJobs::create_pending` writes in
//! transactions of 1 job and of 1,000 jobs (build, add, insert, commit, one connection), with a
//! row-by-row baseline (1,000 single-row INSERTs per transaction) for comparison. The 1-job
//! figure is measured twice: as configured (`synchronous_commit`, usually `on`: each commit
//! waits for the disk), and with `synchronous_commit = off` for this session.
//!
//! ```text
//! cargo bench --bench producer_insert
//! ```
//!
//! It creates its own database `jobrelay_bench_producer_<random>` next to `DATABASE_URL`
//! (default `postgres://postgres@127.0.0.1:5432/postgres`; `benches/support/sandbox.rs`),
//! applies the migrations, and drops it at the end, even after a failure. Sizes (defaults keep it well under 30 s):
//! `BENCH_SINGLE_TX` (2000 transactions of 1 job), `BENCH_BATCH_TX` (50 transactions of 1,000
//! jobs), `BENCH_BASELINE_TX` (10 transactions of 1,000 single-row INSERTs). Prints one JSON
//! object.

// Each benchmark uses a part of it; also loaded by the others when the tests compile them all.
#[allow(clippy::duplicate_mod, dead_code)]
#[macro_use]
#[path = "support/mod.rs"]
mod support;

use std::time::Instant;

use jobrelay::producer::{JobBuilder, Producer};
use sqlx::{Connection, PgConnection};

use support::sandbox::{Sandbox, Settings};
use support::{env, BoxError};

fn job(i: usize) -> JobBuilder {
    JobBuilder::new("bench", "ProcessThing").json(&serde_json::json!({ "thing_id": i }))
}

/// Jobs per second of `tx_count` transactions of `per_tx` jobs through `create_pending`.
async fn producer_rate(
    conn: &mut PgConnection,
    producer: &Producer,
    tx_count: usize,
    per_tx: usize,
) -> Result<f64, BoxError> {
    let start = Instant::now();
    for t in 0..tx_count {
        let mut jobs = producer.pending();
        jobs.add_all((0..per_tx).map(|i| job(t * per_tx + i)))?;
        let mut tx = conn.begin().await?;
        jobs.create_pending(&mut tx).await?;
        tx.commit().await?;
    }
    Ok((tx_count * per_tx) as f64 / start.elapsed().as_secs_f64())
}

/// Jobs per second of `tx_count` transactions of `per_tx` single-row INSERT statements.
async fn row_by_row_rate(
    conn: &mut PgConnection,
    tx_count: usize,
    per_tx: usize,
) -> Result<f64, BoxError> {
    let start = Instant::now();
    for t in 0..tx_count {
        let mut tx = conn.begin().await?;
        for i in 0..per_tx {
            let payload = serde_json::to_vec(&serde_json::json!({ "thing_id": t * per_tx + i }))?;
            sqlx::query(
                "INSERT INTO pending_jobs (uuid, queue, job_type, payload) VALUES ($1, $2, $3, $4)",
            )
            .bind(uuid::Uuid::new_v4())
            .bind("bench")
            .bind("ProcessThing")
            .bind(payload)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
    }
    Ok((tx_count * per_tx) as f64 / start.elapsed().as_secs_f64())
}

/// How many transactions each measurement runs.
#[derive(Debug, Clone, Copy)]
pub struct Sizes {
    /// Transactions of 1 job (each measured twice: as configured and with async commit).
    pub single_tx: usize,
    /// Transactions of 1,000 jobs through `create_pending`.
    pub batch_tx: usize,
    /// Transactions of 1,000 single-row INSERT statements (the baseline).
    pub baseline_tx: usize,
}

impl Sizes {
    /// From `BENCH_SINGLE_TX`, `BENCH_BATCH_TX`, `BENCH_BASELINE_TX`, or the defaults.
    pub fn from_env() -> Result<Self, BoxError> {
        Ok(Sizes {
            single_tx: env::num("BENCH_SINGLE_TX", 2000)?,
            batch_tx: env::num("BENCH_BATCH_TX", 50)?,
            baseline_tx: env::num("BENCH_BASELINE_TX", 10)?,
        })
    }
}

async fn bench(sb: &Sandbox, sizes: Sizes) -> Result<serde_json::Value, BoxError> {
    let Sizes {
        single_tx,
        batch_tx,
        baseline_tx,
    } = sizes;
    let synchronous_commit: String = sqlx::query_scalar("SHOW synchronous_commit")
        .fetch_one(&sb.pool)
        .await?;
    // One connection from here on.
    sb.pool.close().await;

    let mut conn = PgConnection::connect(&sb.url(None)).await?;
    let producer = Producer::default();
    // Warm up: prepared statements, caches.
    producer_rate(&mut conn, &producer, 20, 10).await?;
    let one = producer_rate(&mut conn, &producer, single_tx, 1).await?;
    // The same with commits that do not wait for the WAL flush: what is left is round trips
    // and the library's own cost (the difference is the disk).
    sqlx::query("SET synchronous_commit = off")
        .execute(&mut conn)
        .await?;
    let one_async = producer_rate(&mut conn, &producer, single_tx, 1).await?;
    sqlx::query("RESET synchronous_commit")
        .execute(&mut conn)
        .await?;
    let thousand = producer_rate(&mut conn, &producer, batch_tx, 1000).await?;
    let baseline = row_by_row_rate(&mut conn, baseline_tx, 1000).await?;
    conn.close().await?;
    Ok(serde_json::json!({
        "benchmark": "producer_insert",
        "single_job_tx": { "transactions": single_tx, "jobs_per_second": one.round() },
        "single_job_tx_synchronous_commit_off": {
            "transactions": single_tx,
            "jobs_per_second": one_async.round(),
        },
        "thousand_job_tx": {
            "transactions": batch_tx,
            "jobs_per_second": thousand.round(),
            "transactions_per_second": (thousand / 1000.0 * 10.0).round() / 10.0,
        },
        "row_by_row_baseline_thousand_job_tx": {
            "transactions": baseline_tx,
            "jobs_per_second": baseline.round(),
        },
        "synchronous_commit": synchronous_commit,
        "connections": 1,
    }))
}

/// Creates the benchmark database next to `admin_url`, measures, drops the database (whatever
/// happened), and returns the report.
pub async fn run(admin_url: &str, sizes: Sizes) -> Result<serde_json::Value, BoxError> {
    let sb = Sandbox::create(&Settings {
        kind: "bench_producer",
        database_url: admin_url,
        redis_url: None,
        max_connections: 1,
        application_name: None,
    })
    .await?;

    let result = bench(&sb, sizes).await;

    sb.pool.close().await;
    let dropped = sb.scratch.drop_database().await;
    let mut report = result?;
    dropped?;
    report["database"] = serde_json::Value::from(format!("{} (dropped)", sb.db_name()));
    Ok(report)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BoxError> {
    if !support::cli::started_by_cargo_bench("producer_insert") {
        return Ok(());
    }
    let admin_url = env::or(
        "DATABASE_URL",
        "postgres://postgres@127.0.0.1:5432/postgres",
    );
    let report = run(&admin_url, Sizes::from_env()?).await?;
    println!("{report}");
    Ok(())
}
