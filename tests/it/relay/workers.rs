//! Concurrent claimers: two workers in one process and two relay processes deliver each row
//! exactly once (SKIP LOCKED claims, docs/guarantees.md).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::batch::*;
use crate::common::child::RelayChild;
use crate::common::*;
use jobrelay::broker::enqueue::JobResult;
use jobrelay::broker::redis_sink::RedisSink;
use jobrelay::relay::{Health, JobSink, RelaySettings};
use jobrelay::{Job, Outcome, TableName};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

const MANY: i64 = 20_000;

/// A real sink that counts what it pushed.
struct Counting {
    inner: RedisSink,
    pushed: Arc<AtomicU64>,
    duplicates: Arc<AtomicU64>,
}

impl JobSink for Counting {
    async fn push(&self, jobs: &[Job]) -> jobrelay::Result<Vec<JobResult>> {
        let results = self.inner.push(jobs).await?;
        for r in &results {
            match r {
                Ok(Outcome::Duplicate) => self.duplicates.fetch_add(1, Ordering::Relaxed),
                Ok(_) => self.pushed.fetch_add(1, Ordering::Relaxed),
                Err(_) => 0,
            };
        }
        Ok(results)
    }
}

#[sqlx::test]
async fn two_workers_deliver_each_row_once(pool: PgPool) {
    let ns = Namespace::new();
    let expected = insert_many(&pool, MANY, "bulk").await;

    let pushed: Vec<Arc<AtomicU64>> = (0..2).map(|_| Arc::default()).collect();
    let duplicates = Arc::new(AtomicU64::new(0));
    let mut sinks = Vec::new();
    for p in &pushed {
        sinks.push(Counting {
            inner: redis_sink(&ns, TTL).await,
            pushed: p.clone(),
            duplicates: duplicates.clone(),
        });
    }
    let settings = RelaySettings {
        table: TableName::default(),
        batch: (*self::settings(250)).clone(),
        poll_interval: Duration::from_millis(200),
    };
    let tracker = TaskTracker::new();
    let shutdown = CancellationToken::new();
    jobrelay::relay::spawn(
        &tracker,
        &settings,
        pool.clone(),
        sinks,
        Arc::new(Health::default()),
        shutdown.clone(),
    );
    drained_then_stopped(&pool, Duration::from_secs(60), tracker, shutdown).await;

    assert_exactly_once(&queue_uuids(&ns, "queue:bulk").await, &expected);
    assert_eq!(ns.marker_count().await, MANY as usize);
    let per_worker: Vec<u64> = pushed.iter().map(|p| p.load(Ordering::Relaxed)).collect();
    assert_eq!(
        per_worker.iter().sum::<u64>(),
        MANY as u64,
        "{per_worker:?}"
    );
    assert!(
        per_worker.iter().all(|&n| n > 0),
        "both workers took a share: {per_worker:?}"
    );
    assert_eq!(
        duplicates.load(Ordering::Relaxed),
        0,
        "no row was claimed twice"
    );
}

#[sqlx::test]
async fn two_processes_deliver_each_row_once(pool: PgPool) {
    let ns = Namespace::new();
    let db = database_url_of(&pool).await;
    let args = [
        "--workers",
        "1",
        "--batch-size",
        "250",
        "--poll-interval",
        "200ms",
    ];
    let a = RelayChild::start(&db, &ns.url, &ns.prefix, &args);
    let b = RelayChild::start(&db, &ns.url, &ns.prefix, &args);
    // Both running (and listening) before the rows arrive, so they compete for them.
    wait_until("both relays listen", Duration::from_secs(20), || async {
        listening_relays(&pool).await == 2
    })
    .await;
    let expected = insert_many(&pool, MANY, "bulk").await;
    wait_until("table drained", Duration::from_secs(60), || async {
        pending_count(&pool).await == 0
    })
    .await;
    stop(a).await;
    stop(b).await;
    assert_exactly_once(&queue_uuids(&ns, "queue:bulk").await, &expected);
    assert_eq!(ns.marker_count().await, MANY as usize);
}
