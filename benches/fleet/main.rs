//! The fleet benchmark (issue "Scale-out", acceptance item 1): P relay processes of W workers
//! each on one table against the baseline of 1 process of 2 workers, alternating, in the same
//! run. Prints one JSON object on stdout and a short summary on stderr.
//!
//! ```text
//! cargo bench --bench fleet                  # builds the relay binary it starts, too
//! FLEET_ROWS=20000 FLEET_PROCESSES=4 FLEET_WORKERS=2 FLEET_ROUNDS=1 cargo bench --bench fleet
//! ```
//!
//! Each round runs the baseline, then the fleet. Each run: empty the table (TRUNCATE), start
//! the relay processes (the real binary, `--http-addr off --log-format json --workers W`,
//! default batch size and claim slots, `RUST_LOG=info,jobrelay=debug`, stderr to a file per
//! process) and wait until each has logged that it reached Postgres and Redis (plus 300 ms for
//! its workers to start), then COPY `FLEET_ROWS` rows (200-byte payloads over 4 queues, uuids
//! chosen here) in one transaction and time from its commit until every job is in Redis and
//! the table is empty: a running fleet draining a backlog, as sidecars do, not process
//! start-up. Then check exactly-once (every COPYed uuid in the queues once, no
//! other job, nothing left in the table or the dead letters), SIGTERM the relays and require
//! exit 0, read their logs, and delete the namespace's keys.
//!
//! Per run: rows/s; the claim statement's duration (`claim_ms` of every "batch committed" debug
//! line of every process: p50, p99, max); Postgres CPU per row (µs), from `/proc`: the relays'
//! own backends (found by their `application_name`; CPU counted from the commit of the rows) and, for reference, every Postgres process on the host
//! (which includes the WAL writer, the checkpointer, and any other client of this server);
//! the relays' and Redis's CPU per row; cores busy. Per configuration, the medians over the
//! rounds; per round, and as a median, the ratio fleet/baseline of the drain rates.
//!
//! Then, once, the idle fleet (issue: "24 idle relays cost Postgres at most 5 % of one core
//! together, and a single committed row reaches Redis within 50 ms with 24 relays running"):
//! `FLEET_IDLE_RELAYS` relays of the default workers on the empty table, ready, then 2 s more;
//! over `FLEET_IDLE_SECONDS` the CPU of every Postgres process on the host (and of the relays'
//! backends alone), of the relays (their threads' `schedstat`) and of Redis, as percentages of
//! one core. Then a consumer thread BRPOPs the queues on a blocking connection while rows are
//! inserted one by one, each in its own transaction (autocommit INSERT, uuid chosen here): the
//! "steady" series, `FLEET_LATENCY_ROWS` rows one every `FLEET_LATENCY_GAP`, and the "quiet"
//! series, `FLEET_QUIET_ROWS` rows each after `FLEET_QUIET_GAP` without one (longer than the
//! relays' 1 s poll interval: every worker is waiting for a notification). A row's latency runs
//! from its INSERT being sent (its commit included) to the consumer's BRPOP returning it; per series p50, p90, p99,
//! max. Then SIGTERM (exit 0), exactly-once over the popped jobs, and a summary on stderr with
//! PASS/FAIL against the targets (Postgres ≤ 5 % of a core, steady p99 ≤ 50 ms): informational,
//! only exactly-once fails the benchmark. 24 idle relays hold about 4 connections each: mind
//! the server's `max_connections` (reported).
//!
//! Settings by environment: `FLEET_ROWS` (default 100000), `FLEET_PROCESSES` (6),
//! `FLEET_WORKERS` (4), `FLEET_ROUNDS` (3), `FLEET_TIMEOUT` (per drain, default `10m`),
//! `FLEET_KEEP_LOGS` (non-empty: keep the relays' logs and print where), `FLEET_IDLE_RELAYS`
//! (24; 0 skips the idle stage), `FLEET_IDLE_SECONDS` (10), `FLEET_LATENCY_ROWS` (200),
//! `FLEET_LATENCY_GAP` (`50ms`), `FLEET_VACUUMED` (non-empty: `VACUUM (ANALYZE)` after each
//! COPY, a labelled extra figure; by default the table is analysed while empty and the rows
//! land in one transaction, the state an outbox is in when an outage ends), `FLEET_QUIET_ROWS` (20; 0: no quiet series), `FLEET_QUIET_GAP`
//! (`2s`), `DATABASE_URL`
//! (default `postgres://postgres@127.0.0.1:5432/postgres`; the benchmark creates and drops its
//! own database `jobrelay_fleet_<random>` next to it), `REDIS_URL` (default
//! `redis://127.0.0.1:6379`; namespace `fleet<random>:`, deleted at the end), `JOBRELAY_BIN`
//! (the relay binary; default: the `jobrelay` that `cargo bench` builds with the benchmark,
//! `target/release/jobrelay`). Variables `JOBRELAY_*` other than `JOBRELAY_BIN` are not passed on to the
//! relays. The database, the keys, the logs and the relays are removed also on SIGINT or
//! SIGTERM.
//!
//! One file per part: the settings `args.rs`; the relay processes `relays.rs` and their logs
//! `logs.rs`; the rows and queues `outbox.rs`, exactly-once `check.rs`; a drain `drain.rs`, the
//! rounds `rounds.rs` and their figures `figures.rs`; the idle stage `idle.rs`, its consumer
//! `consumer.rs` and latency series `latency.rs`; CPU counters `snapshot.rs`. The sandbox
//! (database, namespace, relays, logs) is `benches/support/sandbox.rs`.

// Each benchmark uses a part of it; also loaded by the others when the tests compile them all.
#[allow(clippy::duplicate_mod, dead_code)]
#[macro_use]
#[path = "../support/mod.rs"]
mod support;

#[path = "args.rs"]
mod args;
#[path = "check.rs"]
mod check;
#[path = "consumer.rs"]
mod consumer;
#[path = "drain.rs"]
mod drain;
#[path = "figures.rs"]
mod figures;
#[path = "idle.rs"]
mod idle;
#[path = "latency.rs"]
mod latency;
#[path = "logs.rs"]
mod logs;
#[path = "outbox.rs"]
mod outbox;
#[path = "relays.rs"]
mod relays;
#[path = "rounds.rs"]
mod rounds;
#[path = "snapshot.rs"]
mod snapshot;

use serde_json::{json, Value};

pub use args::{Args, IdleArgs, Shape, BASELINE};
use support::sandbox::{Sandbox, Settings, SignalGuard};
pub use support::BoxError;

/// Runs the whole benchmark in a database, namespace and log directory of its own, removed
/// afterwards even when a run fails; returns the JSON report.
pub async fn fleet(args: &Args) -> Result<Value, BoxError> {
    fleet_in_sandbox(args, false).await
}

/// [`fleet`]; with `on_signal`, SIGINT or SIGTERM kills the relays, removes the database, keys
/// and logs, and exits 130 (only for the program: a test must not take over its process's
/// signals).
async fn fleet_in_sandbox(args: &Args, on_signal: bool) -> Result<Value, BoxError> {
    args::warn_if_stale(&args.relay_bin);
    let mut sb = Sandbox::create(&Settings {
        kind: "fleet",
        database_url: &args.database_url,
        redis_url: Some(&args.redis_url),
        max_connections: 4,
        application_name: Some(outbox::BENCH_APP),
    })
    .await?;
    let log_dir = relays::log_dir(&sb);
    if !args.keep_logs {
        sb.scratch.dir = Some(log_dir.clone());
    }
    if let Err(e) = std::fs::create_dir_all(&log_dir) {
        sb.remove().await;
        return Err(e.into());
    }
    let sandbox = json!({
        "database": sb.db_name(),
        "namespace": sb.namespace(),
        "logs": args.keep_logs.then(|| log_dir.display().to_string()),
    });
    let guard = SignalGuard::arm("fleet", on_signal, &sb.scratch);
    let result = rounds::run(args, &sb).await;
    guard.disarm().await;
    sb.remove().await;
    let mut report = result?;
    report["sandbox"] = sandbox;
    Ok(report)
}

#[tokio::main]
async fn main() {
    if !support::cli::started_by_cargo_bench("fleet") {
        return;
    }
    let report = match Args::from_env() {
        Ok(args) => fleet_in_sandbox(&args, true).await,
        Err(e) => Err(e),
    };
    match report {
        Ok(report) => {
            println!(
                "{}",
                serde_json::to_string_pretty(&report).expect("a JSON value")
            );
            if report["exactly_once"] != true {
                note!(
                    "fleet: exactly-once did NOT hold (see each run's \"check\" and the idle \
                     stage's)"
                );
                std::process::exit(1);
            }
        }
        Err(e) => {
            note!("fleet: {e}");
            std::process::exit(1);
        }
    }
}
