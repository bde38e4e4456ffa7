//! The held-horizon benchmark (issue "Postgres in production", acceptance item 4): the claim's
//! cost while a long transaction holds the xmin horizon, against the same stream without one.
//!
//! ```text
//! cargo bench --bench horizon
//! HORIZON_PHASE=60s HORIZON_HOUR_ROWS=500000 cargo bench --bench horizon
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
//!
//! The settings are `args.rs`; the relay's workers and the producers `workers.rs`; the
//! figures of a window `sample.rs`; the phases and the hour `run.rs`.

// Each benchmark uses a part of it; also loaded by the others when the tests compile them all.
#[allow(clippy::duplicate_mod, dead_code)]
#[macro_use]
#[path = "../support/mod.rs"]
mod support;

#[path = "args.rs"]
mod args;
#[path = "run.rs"]
mod run;
#[path = "sample.rs"]
mod sample;
#[path = "workers.rs"]
mod workers;

use serde_json::Value;

pub use args::Args;
use support::sandbox::{Sandbox, Settings, SignalGuard};
pub use support::BoxError;

/// Runs the whole benchmark in a database of its own, removed afterwards even when it fails;
/// returns the JSON report and the database's name.
pub async fn horizon(args: &Args) -> Result<(Value, String), BoxError> {
    horizon_in_sandbox(args, false).await
}

/// [`horizon`]; with `on_signal`, SIGINT or SIGTERM removes the database and exits 130 (only
/// for the program: a test must not take over its process's signals).
async fn horizon_in_sandbox(args: &Args, on_signal: bool) -> Result<(Value, String), BoxError> {
    let sb = Sandbox::create(&Settings {
        kind: "horizon",
        database_url: &args.database_url,
        redis_url: None,
        max_connections: 4,
        application_name: None,
    })
    .await?;
    let db_name = sb.db_name().to_owned();
    let guard = SignalGuard::arm("horizon", on_signal, &sb.scratch);
    let result = match sqlx::query("ANALYZE pending_jobs").execute(&sb.pool).await {
        Ok(_) => run::run(args, &sb).await,
        Err(e) => Err(e.into()),
    };
    guard.disarm().await;
    sb.remove().await;
    Ok((result?, db_name))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    if !support::cli::started_by_cargo_bench("horizon") {
        return Ok(());
    }
    let args = Args::from_env()?;
    let (report, _) = horizon_in_sandbox(&args, true).await?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
