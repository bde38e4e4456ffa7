//! `stages`: where one worker's batch time goes, on a backlog.

use std::sync::Arc;
use std::time::{Duration, Instant};

use jobrelay::broker::redis_sink::RedisSink;
use jobrelay::config::STATEMENT_TIMEOUT;
use jobrelay::relay::{self, BatchSettings};
use jobrelay::{Enqueuer, TableName};
use serde_json::json;

use super::support::sandbox::Sandbox;
use super::support::stats::{percentile, round};
use super::{rows, Args, BoxError};

/// One worker's batches, run directly on a backlog of `BENCH_BACKLOG_ROWS` rows COPYed onto
/// the table the drain left (its dead tuples, statistics of the empty table): where a batch's
/// time goes, per 1,000 rows, and the claim statement's time from the first batch to the last.
pub async fn bench_stages(sb: &Sandbox, args: &Args) -> Result<serde_json::Value, BoxError> {
    let rows = args.backlog_rows.max(1);
    rows::copy_rows(
        sb,
        args.layout,
        rows,
        "stages",
        &args.options,
        args.ordering_keys,
    )
    .await?;
    let opts = jobrelay::config::session_settings(sb.url(None).parse()?);
    let pool = jobrelay::db::lazy_pool(opts, 2);
    let con = jobrelay::broker::connection::connect(sb.redis(), Duration::from_secs(5)).await?;
    let sink = RedisSink::new(
        Enqueuer::new(sb.namespace().to_owned(), Duration::from_secs(900)).with_layout(args.layout),
        con,
        Duration::from_secs(5),
    );
    let batcher = relay::Batcher::new(
        pool,
        Arc::new(relay::Queries::for_needs(
            &TableName::default(),
            args.layout.layout().claim_needs(),
        )),
        Arc::new(BatchSettings {
            batch_size: args.batch_size,
            max_attempts: 25,
            statement_timeout: STATEMENT_TIMEOUT,
            ..BatchSettings::default()
        }),
        sink,
    );
    let mut total = relay::Report::default();
    let mut claims_ms = Vec::new();
    let t0 = Instant::now();
    loop {
        let r = batcher.run_once(None).await?;
        total.add(&r);
        if r.claimed == 0 {
            break;
        }
        claims_ms.push(r.stages.claim.as_secs_f64() * 1000.0);
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let per_k = |d: Duration| {
        round(
            d.as_secs_f64() * 1000.0 / (total.claimed as f64 / 1000.0),
            3,
        )
    };
    let s = total.stages;
    let mut sorted = claims_ms.clone();
    sorted.sort_by(f64::total_cmp);
    let pct = |p: f64| round(percentile(&sorted, p), 2);
    // The claim's mean time over each tenth of the batches, first to last: flat is the goal.
    let tenth = claims_ms.len().div_ceil(10).max(1);
    let curve: Vec<f64> = claims_ms
        .chunks(tenth)
        .map(|c| round(c.iter().sum::<f64>() / c.len() as f64, 2))
        .collect();
    Ok(json!({
        "table_state": "dead tuples of the drain before, analysed while empty, COPYed at once",
        "claim_ms": {
            "batches": claims_ms.len(),
            "p50": pct(0.5),
            "p99": pct(0.99),
            "max": pct(1.0),
            "mean_per_tenth_first_to_last": curve,
        },
        "rows": total.claimed,
        "one_worker_rows_per_second": round(total.claimed as f64 / elapsed, 0),
        "ms_per_1000_rows": {
            "begin": per_k(s.begin),
            "claim": per_k(s.claim),
            "push": per_k(s.push),
            "settle": per_k(s.settle),
            "commit": per_k(s.commit),
        },
    }))
}
