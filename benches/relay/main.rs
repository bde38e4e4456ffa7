//! The relay benchmark: prints one JSON object with the figures of the stages below.
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
//! cargo bench --bench relay
//! BENCH_ROWS=20000 BENCH_SECONDS=5 cargo bench --bench relay
//! ```
//!
//! It works in a database of its own (`jobrelay_bench_<random>`, created next to `DATABASE_URL`,
//! default `postgres://postgres@127.0.0.1:5432/postgres`, dropped at the end) and a Redis
//! namespace of its own (`bench<random>:` on `REDIS_URL`, deleted at the end, and on SIGINT or
//! SIGTERM). `BENCH_WORKERS` and `BENCH_BATCH_SIZE` override the relay defaults;
//! `BENCH_LAYOUT=<layout>` (any `--layout` name) runs the relay in that layout (default
//! `jobrelay`); where the layout's payloads are a job's arguments (`Payload::JsonArgs`) every
//! payload is a JSON array of the same size; `BENCH_OPTIONS=<JSON object>` gives every row of
//! the drains and of the stages backlog those job options (which the layout must carry: e.g. with `BENCH_LAYOUT=sidekiq`,
//! `{"retry":3,"backtrace":true,"tags":["billing"]}`).
//!
//! One file per stage: `drain.rs`, `stages.rs`, `naive.rs`, `latency.rs` (with the consumer of
//! `consumer.rs`) and `notify_cost.rs`; the relay they run is `relay.rs`, the rows `rows.rs`,
//! the CPU figures `cpu.rs`; the sandbox is `benches/support/sandbox.rs`.
//!
//! `BENCH_ORDERING_KEYS=<n>` gives the rows of the drains and stages ordering keys, round-robin
//! over `n` keys (interleaved; `1`: one hot key), and each latency row a key of its own;
//! `BENCH_STAGES=drain,latency` runs only the stages named (default: all).
//! `BENCH_PREPARED=1` (or `0`) runs the relay with `--prepared-statements=true` (or `false`);
//! the default is the daemon's, `auto` (named claims once the listener proved a session).

/// The daemon's allocator (src/main.rs), so that the relay measured here allocates as the
/// binary's does (the bench target requires the feature `daemon`).
#[cfg(feature = "daemon")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

// Each benchmark uses a part of it; also loaded by the others when the tests compile them all.
#[allow(clippy::duplicate_mod, dead_code)]
#[macro_use]
#[path = "../support/mod.rs"]
mod support;

#[path = "args.rs"]
mod args;
#[path = "consumer.rs"]
mod consumer;
#[path = "cpu.rs"]
mod cpu;
#[path = "drain.rs"]
mod drain;
#[path = "latency.rs"]
mod latency;
#[path = "naive.rs"]
mod naive;
#[path = "notify_cost.rs"]
mod notify_cost;
#[path = "relay.rs"]
mod relay;
#[path = "rows.rs"]
mod rows;
#[path = "stages.rs"]
mod stages;
#[path = "timed_sink.rs"]
mod timed_sink;

use serde_json::json;

pub use args::Args;
use support::sandbox::{Sandbox, Settings, SignalGuard};
use support::stats::round;
pub use support::BoxError;

/// The figures of a stage that runs (`BENCH_STAGES`), `null` for one that does not: `bench`
/// is only polled when it runs.
async fn stage(
    args: &Args,
    name: &str,
    bench: impl std::future::Future<Output = Result<serde_json::Value, BoxError>>,
) -> Result<serde_json::Value, BoxError> {
    if args.runs(name) {
        bench.await
    } else {
        Ok(serde_json::Value::Null)
    }
}

async fn run(args: &Args, sb: &Sandbox) -> Result<serde_json::Value, BoxError> {
    let drain = stage(args, "drain", drain::bench_drain(sb, args, false)).await?;
    let stages = stage(args, "stages", stages::bench_stages(sb, args)).await?;
    let naive = stage(args, "naive", naive::bench_naive(sb, args)).await?;
    let ratio = drain["rows_per_second"].as_f64().unwrap_or(0.0)
        / naive["rows_per_second"].as_f64().unwrap_or(f64::INFINITY);
    let latency = stage(args, "latency", latency::bench_latency(sb, args)).await?;
    let notify = stage(
        args,
        "notify_cost",
        notify_cost::bench_notify_cost(sb, args),
    )
    .await?;
    Ok(json!({
        "settings": {
            "workers": args.workers,
            "batch_size": args.batch_size,
            "ordering_keys": args.ordering_keys,
            "dedup": true,
            "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        },
        "drain": drain,
        "drain_vacuumed": if args.vacuumed {
            drain::bench_drain(sb, args, true).await?
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
    let sb = Sandbox::create(&Settings {
        kind: "bench",
        database_url: &args.database_url,
        redis_url: Some(&args.redis_url),
        max_connections: 16,
        application_name: None,
    })
    .await?;
    let sandbox = json!({ "database": sb.db_name(), "namespace": sb.namespace() });
    let guard = SignalGuard::arm("relay", on_signal, &sb.scratch);
    // Analysed while empty: what autovacuum does to an outbox that is nearly empty most of the
    // time (and the planner keeps until the next ANALYZE, however many rows land).
    let result = match sqlx::query("ANALYZE pending_jobs").execute(&sb.pool).await {
        Ok(_) => run(args, &sb).await,
        Err(e) => Err(e.into()),
    };
    guard.disarm().await;
    sb.remove().await;
    let mut report = result?;
    report["sandbox"] = sandbox;
    Ok(report)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    if !support::cli::started_by_cargo_bench("relay") {
        return Ok(());
    }
    let args = Args::from_env()?;
    let report = bench_in_sandbox(&args, true).await?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
