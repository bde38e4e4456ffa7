//! The horizon benchmark's run: phases A and B alternating on the steady stream, then the
//! simulated hour; the report.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sqlx::{Connection, PgConnection};

use super::sample::{insert, Bench};
use super::support::sandbox::Sandbox;
use super::support::stats::round;
use super::workers::{start_stream, start_workers};
use super::{Args, BoxError};

/// Holds the xmin horizon on `holder`: a repeatable-read transaction that has taken its
/// snapshot.
async fn hold(holder: &mut PgConnection) -> Result<(), BoxError> {
    sqlx::raw_sql("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1")
        .execute(holder)
        .await?;
    Ok(())
}

/// Runs the phases and the hour on the sandbox's (empty, analysed) table.
pub async fn run(args: &Args, sb: &Sandbox) -> Result<Value, BoxError> {
    let bench = Bench::default();
    let db_url = sb.url(None);
    let opts = jobrelay::config::session_settings(db_url.parse()?);
    let relay_pool = jobrelay::db::lazy_pool(opts, args.workers as u32 + 1);
    let workers = start_workers(&relay_pool, args.workers, &bench);
    let mut holder = PgConnection::connect(&db_url).await?;
    let mut windows = Vec::new();
    let mut phases = Vec::new();

    // The steady stream, A and B alternating.
    let steady = start_stream(sb, &bench, args.rate);
    for pair in 1..=args.pairs {
        for held in [false, true] {
            let name = format!("{}{pair}", if held { "B" } else { "A" });
            if held {
                hold(&mut holder).await?;
            }
            let start = Instant::now();
            let mut last = bench.sample(sb).await?;
            let mut last_window = Value::Null;
            while start.elapsed() < args.phase {
                tokio::time::sleep(args.window.min(args.phase.saturating_sub(start.elapsed())))
                    .await;
                let now = bench.sample(sb).await?;
                last_window = bench.window(sb, &name, &last, &now).await?;
                windows.push(last_window.clone());
                last = now;
            }
            if held {
                sqlx::raw_sql("ROLLBACK").execute(&mut holder).await?;
            }
            phases.push(json!({ "phase": name, "last_window": last_window }));
        }
    }
    steady.stop().await?;

    // The simulated hour: the horizon held while `hour_rows` rows go through.
    let mut hour = Vec::new();
    if args.hour_rows > 0 {
        hold(&mut holder).await?;
        let base = bench.sample(sb).await?;
        let target = base.jobs + args.hour_rows;
        let step = (args.hour_rows / 10).max(1);
        let mut last = base;
        let mut next = base.jobs + step;
        loop {
            let s = bench.sample(sb).await?;
            if s.jobs >= next {
                hour.push(bench.window(sb, "H", &last, &s).await?);
                last = s;
                next += step;
            }
            if s.jobs >= target {
                break;
            }
            let produced = bench.produced.load(Ordering::Relaxed);
            if produced < target && produced.saturating_sub(s.jobs) < 20_000 {
                let n = 10_000.min(target - produced);
                insert(&sb.pool, n as i64).await?;
                bench.produced.fetch_add(n, Ordering::Relaxed);
            } else {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        sqlx::raw_sql("ROLLBACK").execute(&mut holder).await?;
    }
    workers.stop().await?;
    holder.close().await?;
    relay_pool.close().await;
    report(args, sb, phases, hour, windows).await
}

/// The JSON report: the settings, per phase its last window, B over A at the end, the hour.
async fn report(
    args: &Args,
    sb: &Sandbox,
    phases: Vec<Value>,
    hour: Vec<Value>,
    windows: Vec<Value>,
) -> Result<Value, BoxError> {
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
        .fetch_one(&sb.pool)
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
