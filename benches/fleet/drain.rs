//! One drain: the relays of a configuration, running on the empty table, drain `FLEET_ROWS`
//! rows COPYed in one transaction; then exactly-once, and the relays stopped.

use std::time::{Duration, Instant, SystemTime};

use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use super::figures::{claim_stats, show, table_state};
use super::logs::Logs;
use super::relays::Fleet;
use super::snapshot::Snapshot;
use super::support::procfs;
use super::support::sandbox::{self, Sandbox};
use super::support::stats::round;
use super::{Args, BoxError, Shape};

/// One drain by the relays of `shape`; the run's figures, and its claim durations.
pub async fn drain(
    sb: &Sandbox,
    args: &Args,
    round_no: usize,
    config: &str,
    shape: Shape,
) -> Result<(Value, Vec<f64>), BoxError> {
    sb.reset_table().await?;
    // The relays run before the rows arrive, as a fleet of sidecars does: the clock measures
    // draining a backlog that commits at once, not starting processes.
    let mut fleet = Fleet::start(sb, args, shape, &format!("round{round_no}-{config}"))?;
    fleet.wait_ready().await?;
    let mut con = sb.redis_con().await?;
    let load = procfs::load_average();
    let uuids = sb.copy_rows(args.rows, args.vacuumed).await?;
    let before = Snapshot::take(sb.redis()).await;
    let spawned_at: DateTime<Utc> = SystemTime::now().into();
    let t0 = Instant::now();
    loop {
        fleet.check_alive()?;
        if sb.jobs_in_queues(&mut con).await? >= args.rows && sb.table_empty().await? {
            break;
        }
        if t0.elapsed() > args.timeout {
            return Err(format!(
                "{config} (round {round_no}): not drained after {:?}",
                args.timeout
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let seconds = t0.elapsed().as_secs_f64();
    let backends = sb.relay_backends().await?;
    let after = Snapshot::take(sb.redis()).await;
    let relay_cpu = fleet.cpu_seconds();
    fleet.stop().await?;
    let logs = Logs::read(&fleet)?;
    drop(fleet);
    let check = sb.check(&uuids).await?;
    let mut con = sb.redis_con().await?;
    sandbox::unlink_keys(&mut con, sb.namespace()).await;

    let rows = args.rows as f64;
    let us_per_row = |s: f64| round(s * 1e6 / rows, 2);
    let wall = after.at.duration_since(before.at).as_secs_f64();
    let pg_relay = after.postgres_since(&before, Some(&backends));
    let pg_all = after.postgres_since(&before, None);
    let redis = after.redis.zip(before.redis).map(|(a, b)| a - b);
    let ms_after = |at: Option<DateTime<Utc>>| {
        at.map(|t| round((t - spawned_at).as_seconds_f64() * 1000.0, 1))
    };
    let run = json!({
        "round": round_no,
        "config": config,
        "table_state": table_state(args.vacuumed),
        "processes": shape.processes,
        "workers": shape.workers,
        "rows": args.rows,
        "seconds": round(seconds, 3),
        "rows_per_second": round(rows / seconds, 0),
        "claim_ms": claim_stats(&logs.claim_ms),
        "rows_per_batch": round(logs.claimed as f64 / logs.claim_ms.len().max(1) as f64, 1),
        "slot_misses": logs.slot_misses,
        "pg_us_per_row": pg_relay.map(us_per_row),
        "pg_all_us_per_row": pg_all.map(us_per_row),
        "relay_us_per_row": us_per_row(relay_cpu),
        "redis_us_per_row": redis.map(us_per_row),
        "busy_cores": round((after.busy - before.busy) / wall.max(1e-9), 2),
        "relay_backends": backends.len(),
        "first_commit_ms": ms_after(logs.first_commit),
        "last_commit_ms": ms_after(logs.last_commit),
        "duplicates_logged": logs.duplicates,
        "log_warnings": logs.warnings,
        "first_warning": logs.first_warning,
        "load_average_before": load,
        "check": check,
    });
    note!(
        "fleet: round {round_no} {config:<8} {}x{}: {} rows in {:.2} s = {:.0} rows/s; claim ms \
         p50/p99/max {}/{}/{} ({} batches, {} slot misses); PG µs/row {} (all of Postgres {}); \
         exactly once: {}",
        shape.processes,
        shape.workers,
        args.rows,
        seconds,
        rows / seconds,
        show(&run["claim_ms"]["p50"]),
        show(&run["claim_ms"]["p99"]),
        show(&run["claim_ms"]["max"]),
        run["claim_ms"]["batches"],
        logs.slot_misses,
        show(&run["pg_us_per_row"]),
        show(&run["pg_all_us_per_row"]),
        run["check"]["exactly_once"],
    );
    Ok((run, logs.claim_ms))
}
