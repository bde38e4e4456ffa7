//! `notify_cost`: what the notify trigger costs the producers, the relay running.

use std::time::{Duration, Instant};

use jobrelay::LayoutKind;
use serde_json::json;

use super::support::sandbox::Sandbox;
use super::support::stats::{median, round};
use super::{relay, rows, Args, BoxError};

/// Single-row inserts by `PRODUCERS` concurrent producers for `seconds`, while the relay
/// drains them (as in production); returns rows/s.
async fn insert_rate(sb: &Sandbox, layout: LayoutKind, seconds: f64) -> Result<f64, BoxError> {
    let stop = Instant::now() + Duration::from_secs_f64(seconds);
    let insert = format!(
        "INSERT INTO pending_jobs (queue, job_type, payload) VALUES ('ins', 'X', {})",
        rows::tiny_payload(layout, "'\\x00'")
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
pub async fn bench_notify_cost(sb: &Sandbox, args: &Args) -> Result<serde_json::Value, BoxError> {
    const PAIR_SECONDS: f64 = 2.0;
    let relay = relay::start_relay(sb, args, None).await?;
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
            rate[on as usize] = insert_rate(sb, args.layout, side).await?;
        }
        with += rate[1];
        without += rate[0];
        costs.push((1.0 - rate[1] / rate[0]) * 100.0);
    }
    set_trigger(true).await?;
    relay.stop().await;
    // Printed in order, as the median takes them.
    costs.sort_by(f64::total_cmp);
    let median = median(&costs);
    Ok(json!({
        "producers": PRODUCERS,
        "pairs": pairs,
        "inserts_per_second_with_trigger": round(with / pairs as f64, 0),
        "inserts_per_second_without_trigger": round(without / pairs as f64, 0),
        "overhead_percent": round(median, 1),
        "overhead_percent_each_pair": costs.iter().map(|c| round(*c, 1)).collect::<Vec<_>>(),
    }))
}
