//! A row not yet due, and the relay's workers.

use std::time::Instant;

use super::*;
use crate::common::http_relay::HttpRelay;
use chrono::Utc;

/// A row whose run_at is ahead does not wake the relay: while its workers are awake (they
/// just claimed), the wake-up lock's poll (every millisecond) counts only rows that are due,
/// so the workers do not claim again and again in vain until it is.
#[sqlx::test]
async fn a_row_not_yet_due_does_not_keep_the_workers_claiming(pool: PgPool) {
    let ns = Namespace::new();
    let relay = HttpRelay::start(&pool, &ns.url, &ns.prefix, &["--layout", "celery"]).await;
    let now = Row::new("a", TASK, "[1]");
    let later = Row {
        run_at: Some(Utc::now() + chrono::Duration::seconds(30)),
        ..Row::new("a", TASK, "[2]")
    };
    let commits = || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        n
    };
    let mut tx = pool.begin().await.unwrap();
    insert(&mut *tx, &[now, later]).await;
    tx.commit().await.unwrap();
    wait_until("the due row relayed", Duration::from_secs(10), || async {
        ns.llen("a").await == 1
    })
    .await;
    // Statistics reach pg_stat_database with a delay (up to a second): measure over 2 s.
    let before = commits().await;
    let start = Instant::now();
    wait_until("two seconds", Duration::from_secs(3), || async {
        start.elapsed() >= Duration::from_secs(2)
    })
    .await;
    let during = commits().await - before;
    eprintln!("{during} transactions in 2 s");
    assert_eq!(relay.count("queued").await, 1.0);
    assert_eq!(pending_count(&pool).await, 1, "the later row waits");
    assert!(during < 100, "{during} transactions in 2 s while idle");
}
