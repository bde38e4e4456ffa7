//! The backlog gauges: `jobrelay_oldest_claimable_age_seconds` is the age of the first row a
//! claim could take now, leaving out rows parked for a retry and, in the celery layout, rows
//! not yet due, which `jobrelay_oldest_pending_age_seconds` counts.

use super::*;
use jobrelay::relay::queries::{self, Queries};
use jobrelay::{LayoutKind, TableName};
use sqlx::Connection as _;

/// Inserts a row created `hours` ago, claimable after `available_in` and due after `run_in`
/// (SQL intervals, or NULL for `run_in`); returns its id.
async fn insert_aged(pool: &PgPool, hours: i32, available_in: &str, run_in: &str) -> i64 {
    sqlx::query_scalar(&format!(
        "INSERT INTO pending_jobs (queue, job_type, created_at, available_at, run_at)
         VALUES ('default', 'Aged', now() - {hours} * interval '1 hour',
                 now() + interval '{available_in}', now() + {run_in})
         RETURNING id"
    ))
    .fetch_one(pool)
    .await
    .unwrap()
}

/// [`Queries::oldest_claimable`] for `layout`, as the probe runs it.
async fn claimable_age(pool: &PgPool, layout: LayoutKind) -> f64 {
    let sql = Queries::for_layout(&TableName::default(), layout).oldest_claimable;
    let mut conn = pool.acquire().await.unwrap();
    let mut tx = conn.begin_with(queries::BEGIN).await.unwrap();
    let age: f64 = sqlx::query_scalar(&sql).fetch_one(&mut *tx).await.unwrap();
    tx.rollback().await.unwrap();
    age
}

#[sqlx::test]
async fn the_claimable_age_leaves_out_parked_rows_and_celery_rows_not_due(pool: PgPool) {
    let hour = |age: f64, hours: f64| (age - hours * 3600.0).abs() < 60.0;
    assert_eq!(claimable_age(&pool, LayoutKind::Jobrelay).await, 0.0);
    // Parked for a retry, 3 hours old; due in an hour, 2 hours old; claimable, 1 hour old.
    insert_aged(&pool, 3, "1 hour", "NULL").await;
    insert_aged(&pool, 2, "0 seconds", "interval '1 hour'").await;
    let claimable = insert_aged(&pool, 1, "0 seconds", "NULL").await;
    // Every layout but celery pushes a row due later at once (into a scheduled set).
    let age = claimable_age(&pool, LayoutKind::Jobrelay).await;
    assert!(hour(age, 2.0), "jobrelay layout: {age}");
    // The celery layout holds it in the outbox until it is due.
    let age = claimable_age(&pool, LayoutKind::Celery).await;
    assert!(hour(age, 1.0), "celery layout: {age}");
    sqlx::query("DELETE FROM pending_jobs WHERE id = $1")
        .bind(claimable)
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(claimable_age(&pool, LayoutKind::Celery).await, 0.0);
    assert!(hour(claimable_age(&pool, LayoutKind::Jobrelay).await, 2.0));
}

/// A relay's gauges while a claimable row is held by another transaction (no claim can take
/// it), and once it is relayed; a parked row, older, counts only in the pending age.
#[sqlx::test]
async fn a_relay_reports_the_oldest_claimable_age_apart_from_the_oldest_pending(pool: PgPool) {
    insert_aged(&pool, 3, "1 hour", "NULL").await;
    let held = insert_aged(&pool, 1, "0 seconds", "NULL").await;
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM pending_jobs WHERE id = $1 FOR UPDATE")
        .bind(held)
        .execute(&mut *holder)
        .await
        .unwrap();

    let ns = Namespace::new();
    let db = database_url_of(&pool).await;
    let mut d = Daemon::start(
        &["--poll-interval", "200ms"],
        &[
            ("DATABASE_URL", &db),
            ("REDIS_URL", &ns.url),
            ("JOBRELAY_NAMESPACE", &ns.prefix),
        ],
    );
    d.wait_ready(Duration::from_secs(15)).await;
    let ages = |m: &Metrics| {
        (
            m.try_get("jobrelay_oldest_pending_age_seconds"),
            m.try_get("jobrelay_oldest_claimable_age_seconds"),
        )
    };
    let near = |v: Option<f64>, hours: f64| v.is_some_and(|v| (v - hours * 3600.0).abs() < 60.0);
    wait_until(
        "the held row's age sampled",
        Duration::from_secs(15),
        || async {
            let (pending, claimable) = ages(&d.metrics().await);
            near(pending, 3.0) && near(claimable, 1.0)
        },
    )
    .await;
    holder.rollback().await.unwrap();
    wait_until("the held row relayed", Duration::from_secs(15), || async {
        let m = d.metrics().await;
        let (pending, claimable) = ages(&m);
        m.try_get("jobrelay_pending_jobs") == Some(1.0)
            && near(pending, 3.0)
            && claimable == Some(0.0)
    })
    .await;
    assert_eq!(ns.llen("queue:default").await, 1);
    assert_eq!(d.terminate(Duration::from_secs(30)).await, Some(0));
}
