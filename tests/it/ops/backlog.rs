//! The backlog gauges: `jobrelay_oldest_claimable_age_seconds` is the age of the first row a
//! claim could take now, leaving out rows parked for a retry, rows behind their ordering key's
//! head and, in the celery layout, rows not yet due, which `jobrelay_oldest_pending_age_seconds`
//! counts.

use super::*;
use jobrelay::relay::backlog::Backlog;
use jobrelay::relay::queries::{self, Queries};
use jobrelay::sink::ClaimNeeds;
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

/// [`Queries::oldest_claimable`] for `layout` from the lowest id, as the probe runs it; 0 when
/// no row is claimable.
async fn claimable_age(pool: &PgPool, layout: LayoutKind) -> f64 {
    let needs = layout.layout().claim_needs();
    let sql = Queries::for_needs(&TableName::default(), needs).oldest_claimable;
    let mut conn = pool.acquire().await.unwrap();
    let mut tx = conn.begin_with(queries::BEGIN).await.unwrap();
    let found: Option<(i64, f64)> = sqlx::query_as(&sql)
        .bind(i64::MIN)
        .fetch_optional(&mut *tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    found.map_or(0.0, |(_, age)| age)
}

fn near(age: f64, hours: f64) -> bool {
    (age - hours * 3600.0).abs() < 60.0
}

#[sqlx::test]
async fn the_claimable_age_leaves_out_parked_rows_and_celery_rows_not_due(pool: PgPool) {
    assert_eq!(claimable_age(&pool, LayoutKind::Jobrelay).await, 0.0);
    // Parked for a retry, 3 hours old; due in an hour, 2 hours old; claimable, 1 hour old.
    insert_aged(&pool, 3, "1 hour", "NULL").await;
    insert_aged(&pool, 2, "0 seconds", "interval '1 hour'").await;
    let claimable = insert_aged(&pool, 1, "0 seconds", "NULL").await;
    // Every layout but celery pushes a row due later at once (into a scheduled set).
    let age = claimable_age(&pool, LayoutKind::Jobrelay).await;
    assert!(near(age, 2.0), "jobrelay layout: {age}");
    // The celery layout holds it in the outbox until it is due.
    let age = claimable_age(&pool, LayoutKind::Celery).await;
    assert!(near(age, 1.0), "celery layout: {age}");
    sqlx::query("DELETE FROM pending_jobs WHERE id = $1")
        .bind(claimable)
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(claimable_age(&pool, LayoutKind::Celery).await, 0.0);
    assert!(near(claimable_age(&pool, LayoutKind::Jobrelay).await, 2.0));
}

/// A keyed row counts only at the head of its key: the rows behind a head parked for a retry,
/// or behind a dead-lettered row of their key, wait for it, not for a relay.
#[sqlx::test]
async fn the_claimable_age_leaves_out_keyed_rows_behind_their_head(pool: PgPool) {
    let parked_head = insert_aged(&pool, 5, "1 hour", "NULL").await;
    let behind_parked = insert_aged(&pool, 4, "0 seconds", "NULL").await;
    let behind_dead = insert_aged(&pool, 3, "0 seconds", "NULL").await;
    insert_aged(&pool, 1, "0 seconds", "NULL").await;
    sqlx::raw_sql(&format!(
        "UPDATE pending_jobs SET ordering_key = 'a' WHERE id IN ({parked_head}, {behind_parked});
         UPDATE pending_jobs SET ordering_key = 'b' WHERE id = {behind_dead};
         INSERT INTO pending_jobs_dead (id, uuid, queue, job_type, ordering_key, last_error)
         VALUES (-1, gen_random_uuid(), 'default', 'Dead', 'b', 'refused')"
    ))
    .execute(&pool)
    .await
    .unwrap();
    let age = claimable_age(&pool, LayoutKind::Jobrelay).await;
    assert!(near(age, 1.0), "only the unkeyed row is claimable: {age}");
    // The head's backoff ends: the key is claimable again, from its head.
    sqlx::query("UPDATE pending_jobs SET available_at = now() WHERE id = $1")
        .bind(parked_head)
        .execute(&pool)
        .await
        .unwrap();
    let age = claimable_age(&pool, LayoutKind::Jobrelay).await;
    assert!(near(age, 5.0), "the head: {age}");
}

/// The sampler looks from its mark (the first claimable row it found), so a dead or parked head
/// is not walked at every sample, and from the lowest id at each catch-up, which finds a row
/// that became claimable below the mark.
#[sqlx::test]
async fn the_claimable_age_looks_from_its_mark_and_catches_up_below_it(pool: PgPool) {
    let parked = insert_aged(&pool, 3, "1 hour", "NULL").await;
    insert_aged(&pool, 1, "0 seconds", "NULL").await;
    let mut backlog = Backlog::new(&TableName::default(), ClaimNeeds::default())
        .catch_up_every(Duration::from_secs(3600));
    // The first sample is a catch-up; the mark moves to the claimable row.
    let age = backlog
        .sample(&pool)
        .await
        .unwrap()
        .oldest_claimable_age_seconds;
    assert!(near(age, 1.0), "{age}");
    sqlx::query("UPDATE pending_jobs SET available_at = now() WHERE id = $1")
        .bind(parked)
        .execute(&pool)
        .await
        .unwrap();
    // From the mark: the row below it is found by the next catch-up, not now.
    let age = backlog
        .sample(&pool)
        .await
        .unwrap()
        .oldest_claimable_age_seconds;
    assert!(near(age, 1.0), "{age}");
    let mut backlog = backlog.catch_up_every(Duration::ZERO);
    let age = backlog
        .sample(&pool)
        .await
        .unwrap()
        .oldest_claimable_age_seconds;
    assert!(near(age, 3.0), "{age}");
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
    let about = |v: Option<f64>, hours: f64| v.is_some_and(|v| near(v, hours));
    wait_until(
        "the held row's age sampled",
        Duration::from_secs(15),
        || async {
            let (pending, claimable) = ages(&d.metrics().await);
            about(pending, 3.0) && about(claimable, 1.0)
        },
    )
    .await;
    holder.rollback().await.unwrap();
    wait_until("the held row relayed", Duration::from_secs(15), || async {
        let m = d.metrics().await;
        let (pending, claimable) = ages(&m);
        m.try_get("jobrelay_pending_jobs") == Some(1.0)
            && about(pending, 3.0)
            && claimable == Some(0.0)
    })
    .await;
    assert_eq!(ns.llen("queue:default").await, 1);
    assert_eq!(d.terminate(Duration::from_secs(30)).await, Some(0));
}
