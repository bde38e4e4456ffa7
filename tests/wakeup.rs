//! The wake-up lease (migration 3, src/relay/lease.rs): a busy relay holds a lease and
//! producers skip NOTIFY; when the lease lapses, a producer that trusted it is not stranded.

mod common;

use std::time::Duration;

use common::child::RelayChild;
use common::*;
use sqlx::postgres::PgListener;
use sqlx::PgPool;

async fn lease_held(pool: &PgPool) -> bool {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM jobrelay_wakeup
                        WHERE channel = 'pending_jobs' AND awake_until > clock_timestamp())",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Starts a daemon that would only poll every 30 s, and makes it busy (one row relayed).
async fn busy_relay(pool: &PgPool, ns: &Namespace) -> RelayChild {
    let db = database_url_of(pool).await;
    let relay = RelayChild::start(&db, &ns.url, &ns.prefix, &["--poll-interval", "30s"]);
    insert_rows(pool, 1, "warmup").await;
    wait_until(
        "the warm-up row is relayed",
        Duration::from_secs(10),
        || async { ns.llen("queue:warmup").await == 1 },
    )
    .await;
    relay
}

#[sqlx::test]
async fn a_busy_relay_holds_the_lease_and_inserts_skip_notify(pool: PgPool) {
    let ns = Namespace::new();
    let mut relay = busy_relay(&pool, &ns).await;
    wait_until("the lease is held", Duration::from_secs(5), || {
        lease_held(&pool)
    })
    .await;

    let mut listener = PgListener::connect_with(&pool).await.unwrap();
    listener.listen("pending_jobs").await.unwrap();
    // Keep the relay busy so that the lease is renewed, and insert while it holds.
    insert_rows(&pool, 1, "q").await;
    assert!(lease_held(&pool).await);
    let n = tokio::time::timeout(Duration::from_millis(300), listener.recv()).await;
    assert!(n.is_err(), "no NOTIFY while the lease holds: {n:?}");
    wait_until(
        "the row is relayed by polling",
        Duration::from_secs(5),
        || async { ns.llen("queue:q").await == 1 },
    )
    .await;

    // Idle: the lease lapses and inserts notify again.
    wait_until("the lease lapses", Duration::from_secs(10), || async {
        !lease_held(&pool).await
    })
    .await;
    // The lapse wakes the workers once more; let that pass, then insert.
    insert_rows(&pool, 1, "after").await;
    tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .expect("NOTIFY after the lease lapsed")
        .unwrap();
    wait_until(
        "the row after the lapse is relayed",
        Duration::from_secs(5),
        || async { ns.llen("queue:after").await == 1 },
    )
    .await;
    relay.signal("TERM");
    assert_eq!(relay.wait(Duration::from_secs(30)).await, Some(0));
}

/// A producer whose trigger saw the lease (so it did not notify) but that commits only after
/// the lease lapsed: the relay waits for it before going to sleep, so its row does not wait
/// for the 30 s poll.
#[sqlx::test]
async fn a_producer_that_trusted_the_lease_is_not_stranded(pool: PgPool) {
    let ns = Namespace::new();
    let mut relay = busy_relay(&pool, &ns).await;
    wait_until("the lease is held", Duration::from_secs(5), || {
        lease_held(&pool)
    })
    .await;

    let mut tx = pool.begin().await.unwrap();
    sqlx::query("INSERT INTO pending_jobs (queue, job_type) VALUES ('late', 'Late')")
        .execute(&mut *tx)
        .await
        .unwrap();
    let trusted: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM jobrelay_wakeup WHERE awake_until > clock_timestamp())",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert!(
        trusted,
        "the insert ran while the lease held, so it did not notify"
    );
    // The relay goes idle: its lease expires while this transaction is still open.
    wait_until("the lease lapses", Duration::from_secs(10), || async {
        !lease_held(&pool).await
    })
    .await;
    tx.commit().await.unwrap();
    wait_until(
        "the late row is relayed well before the 30 s poll",
        Duration::from_secs(8),
        || async { ns.llen("queue:late").await == 1 },
    )
    .await;
    relay.signal("TERM");
    assert_eq!(relay.wait(Duration::from_secs(30)).await, Some(0));
}

/// A relay whose role may not write the lease (e.g. roles set up before migration 3) says so
/// once and still wakes on NOTIFY: nothing waits for the 30 s poll.
#[sqlx::test]
async fn without_the_lease_grant_the_relay_falls_back_to_notify(pool: PgPool) {
    let ns = Namespace::new();
    let role = format!(
        "jobrelay_nolease_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    for sql in [
        format!("CREATE ROLE {role} LOGIN"),
        format!("GRANT SELECT, INSERT, DELETE ON pending_jobs TO {role}"),
        format!("GRANT UPDATE (available_at) ON pending_jobs TO {role}"),
        format!("GRANT SELECT, INSERT ON pending_jobs_dead TO {role}"),
        format!("GRANT SELECT ON _sqlx_migrations TO {role}"),
    ] {
        sqlx::query(&sql).execute(&pool).await.unwrap();
    }
    let mut url = url::Url::parse(&database_url_of(&pool).await).unwrap();
    url.set_username(&role).unwrap();
    let logs = tempfile::NamedTempFile::new().unwrap();
    let mut relay = RelayChild::start_logged(
        url.as_str(),
        &ns.url,
        &ns.prefix,
        &["--poll-interval", "30s"],
        logs.path(),
        "info",
    );
    for round in 0..3 {
        insert_rows(&pool, 1, &format!("q{round}")).await;
        wait_until(
            "the row is relayed, woken by NOTIFY",
            Duration::from_secs(5),
            || async { ns.llen(&format!("queue:q{round}")).await == 1 },
        )
        .await;
    }
    relay.signal("TERM");
    assert_eq!(relay.wait(Duration::from_secs(30)).await, Some(0));
    let log = std::fs::read_to_string(logs.path()).unwrap();
    assert_eq!(
        log.matches("cannot hold the wake-up lease").count(),
        1,
        "warned once: {log}"
    );
    let held: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM jobrelay_wakeup)")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(!held, "no lease was written");
    for sql in [
        format!("REVOKE ALL ON pending_jobs, pending_jobs_dead, _sqlx_migrations FROM {role}"),
        format!("DROP ROLE {role}"),
    ] {
        sqlx::query(&sql).execute(&pool).await.unwrap();
    }
}
