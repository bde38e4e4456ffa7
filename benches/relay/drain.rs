//! `drain`: the relay, running on the empty table, drains `BENCH_ROWS` rows COPYed in one
//! transaction; `drain_vacuumed` (`BENCH_VACUUMED=1`): the same rows, vacuumed and analysed
//! before the relay starts on them (not a production state).

use std::time::{Duration, Instant};

use jobrelay::LayoutKind;
use serde_json::json;

use super::support::sandbox::Sandbox;
use super::support::stats::round;
use super::{cpu, relay, rows, Args, BoxError};

/// Polls `cond` every 5 ms until it holds; an error after `limit`.
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
async fn warm_up(sb: &Sandbox, layout: LayoutKind, n: usize) -> Result<(), BoxError> {
    let sql = format!(
        "INSERT INTO pending_jobs (queue, job_type, payload) VALUES ('warm', 'Warm', {})",
        rows::tiny_payload(layout, "''")
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

/// Times the drain; `vacuumed`: the old way (see the module documentation).
pub async fn bench_drain(
    sb: &Sandbox,
    args: &Args,
    vacuumed: bool,
) -> Result<serde_json::Value, BoxError> {
    let prefix = if vacuumed { "vacuumed" } else { "drain" };
    let (relay, cpu0, t0) = if vacuumed {
        // The old way: rows COPYed, VACUUM (ANALYZE), then the relay starts on them.
        rows::copy_rows(
            sb,
            args.layout,
            args.rows,
            prefix,
            &args.options,
            args.ordering_keys,
        )
        .await?;
        sqlx::query("VACUUM (ANALYZE) pending_jobs")
            .execute(&sb.pool)
            .await?;
        let cpu0 = cpu::CpuSnapshot::take(sb.redis()).await;
        let t0 = Instant::now();
        (relay::start_relay(sb, args, None).await?, cpu0, t0)
    } else {
        let relay = relay::start_relay(sb, args, None).await?;
        warm_up(sb, args.layout, 20).await?;
        rows::copy_rows(
            sb,
            args.layout,
            args.rows,
            prefix,
            &args.options,
            args.ordering_keys,
        )
        .await?;
        (
            relay,
            cpu::CpuSnapshot::take(sb.redis()).await,
            Instant::now(),
        )
    };
    wait_for("the drain", Duration::from_secs(600), || async {
        Ok(sb.table_empty().await?
            && rows::jobs_in_queues(sb, args.layout, prefix).await? == args.rows)
    })
    .await?;
    let elapsed = t0.elapsed().as_secs_f64();
    let cpu1 = cpu::CpuSnapshot::take(sb.redis()).await;
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
