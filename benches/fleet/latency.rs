//! The idle stage's latency series: single rows, each in a transaction of its own, timed
//! from the INSERT being sent to the consumer's BRPOP returning the job.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use uuid::Uuid;

use super::consumer::Consumer;
use super::relays::Fleet;
use super::support::sandbox::Sandbox;
use super::support::stats::{percentile, round};
use super::BoxError;

/// The idle-fleet target of a single row's latency p99 (beside `idle::IDLE_PG_TARGET_PCT`).
pub const IDLE_P99_TARGET_MS: f64 = 50.0;

/// A signed duration `later - earlier` in milliseconds.
fn ms_between(earlier: Instant, later: Instant) -> f64 {
    match later.checked_duration_since(earlier) {
        Some(d) => d.as_secs_f64() * 1000.0,
        None => -(earlier.duration_since(later).as_secs_f64() * 1000.0),
    }
}

/// One latency series: `rows` rows inserted one by one, each in its own transaction, `gap`
/// apart (`quiet`: `gap` of silence before each row, so that each finds the fleet idle;
/// else on a fixed schedule, one every `gap`), then until all were popped. The rows' uuids
/// and commit instants, in order.
pub async fn latency_series(
    sb: &Sandbox,
    consumer: &mut Consumer,
    fleet: &mut Fleet,
    rows: usize,
    gap: Duration,
    quiet: bool,
    first: usize,
) -> Result<Vec<(Uuid, Instant)>, BoxError> {
    let mut conn = sb.pool.acquire().await?;
    let mut committed = Vec::with_capacity(rows);
    let start = tokio::time::Instant::now();
    for i in 0..rows {
        if quiet {
            tokio::time::sleep(gap).await;
        } else {
            tokio::time::sleep_until(start + gap * i as u32).await;
        }
        fleet.check_alive()?;
        consumer.collect()?;
        committed.push(sb.insert_row(&mut conn, first + i).await?);
    }
    drop(conn);
    let want: Vec<Uuid> = committed.iter().map(|(u, _)| *u).collect();
    consumer.wait_for(&want).await?;
    Ok(committed)
}

/// Latency figures of one series: from each commit to its pop.
pub fn latency_stats(
    name: &str,
    committed: &[(Uuid, Instant)],
    popped: &HashMap<Uuid, Instant>,
    gap: Duration,
) -> Value {
    let mut ms: Vec<f64> = committed
        .iter()
        .filter_map(|(u, at)| popped.get(u).map(|p| ms_between(*at, *p)))
        .collect();
    ms.sort_by(f64::total_cmp);
    let missing = committed.len() - ms.len();
    let p99 = percentile(&ms, 0.99);
    json!({
        "series": name,
        "rows": committed.len(),
        "gap_ms": round(gap.as_secs_f64() * 1000.0, 1),
        "popped": ms.len(),
        "missing": missing,
        "p50": round(percentile(&ms, 0.50), 2),
        "p90": round(percentile(&ms, 0.90), 2),
        "p99": round(p99, 2),
        "max": round(ms.last().copied().unwrap_or(0.0), 2),
        "mean": round(ms.iter().sum::<f64>() / ms.len().max(1) as f64, 2),
        "p99_ok": missing == 0 && !ms.is_empty() && p99 <= IDLE_P99_TARGET_MS,
    })
}
