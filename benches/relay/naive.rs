//! `naive`: a relay written the straightforward way, for comparison: one row per transaction,
//! one Redis round trip per job, the same enqueue script and dedup.

use std::time::{Duration, Instant};

use jobrelay::{Enqueuer, Job};
use serde_json::json;
use sqlx::Connection;

use super::support::sandbox::Sandbox;
use super::support::stats::round;
use super::{rows, Args, BoxError};

/// A row as the naive relay reads it.
type NaiveRow = (
    i64,
    uuid::Uuid,
    String,
    String,
    Vec<u8>,
    chrono::DateTime<chrono::Utc>,
);

/// One row per transaction, one EVALSHA per job: what a straightforward relay does.
pub async fn bench_naive(sb: &Sandbox, args: &Args) -> Result<serde_json::Value, BoxError> {
    rows::copy_rows(sb, args.layout, args.naive_rows, "naive", "{}", 0).await?;
    let enqueuer =
        Enqueuer::new(sb.namespace().to_owned(), Duration::from_secs(900)).with_layout(args.layout);
    let mut con = sb.redis_con().await?;
    let mut conn = sb.pool.acquire().await?;
    let t0 = Instant::now();
    let mut n = 0usize;
    loop {
        let mut tx = conn.begin().await?;
        let row: Option<NaiveRow> = sqlx::query_as(
            "SELECT id, uuid, queue, job_type, payload, created_at FROM pending_jobs
                 WHERE available_at <= now() ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED",
        )
        .fetch_optional(&mut *tx)
        .await?;
        let Some((id, uuid, queue, job_type, payload, created_at)) = row else {
            break;
        };
        let job = Job {
            uuid,
            queue,
            job_type,
            payload,
            parent_uuid: None,
            predecessor_uuid: None,
            dead_parent: false,
            run_at: None,
            created_at,
            headers: Default::default(),
            options: Default::default(),
            ordering_key: None,
        };
        enqueuer.enqueue(&mut con, &job).await?;
        sqlx::query("DELETE FROM pending_jobs WHERE id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        n += 1;
    }
    let elapsed = t0.elapsed().as_secs_f64();
    if n != args.naive_rows
        || rows::jobs_in_queues(sb, args.layout, "naive").await? != args.naive_rows
    {
        return Err("naive relay lost rows".into());
    }
    Ok(json!({
        "rows": n,
        "seconds": round(elapsed, 3),
        "rows_per_second": round(n as f64 / elapsed, 0),
    }))
}
