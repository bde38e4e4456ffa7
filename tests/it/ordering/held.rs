//! A key waits behind its head: a dead-lettered row holds the key's later rows in the outbox
//! (other keys flow) until the operator requeues it (it goes first again, with its own id) or
//! purges it; a row not yet due holds its successors until it is due.

use super::*;
use crate::common::batch::*;
use jobrelay::relay::claim_kind::ClaimKind;
use jobrelay::relay::{BatchSettings, Batcher};
use jobrelay::report::Report;
use std::sync::Arc;

/// A keyed row: `(uuid, id)`.
async fn keyed(
    pool: &PgPool,
    key: Option<&str>,
    options: &str,
    run_at_in: Option<f64>,
) -> (Uuid, i64) {
    sqlx::query_as(
        "INSERT INTO pending_jobs (queue, job_type, payload, ordering_key, options, run_at)
         VALUES ('q', 'Ordered', '[]', $1, $2::jsonb,
                 now() + $3 * interval '1 second')
         RETURNING uuid, id",
    )
    .bind(key)
    .bind(options)
    .bind(run_at_in)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn pending_uuids(pool: &PgPool) -> Vec<Uuid> {
    sqlx::query_scalar("SELECT uuid FROM pending_jobs ORDER BY id")
        .fetch_all(pool)
        .await
        .unwrap()
}

/// Drains with a fresh batcher starting with the claim `kind` (its first claim starts from the
/// lowest id), whose claim dead-letters a payload over 1,000 bytes itself (`--max-job-size`).
async fn relay(pool: &PgPool, ns: &Namespace, kind: ClaimKind) -> Report {
    let settings = Arc::new(BatchSettings {
        max_job_bytes: 1000,
        ..(*settings(10)).clone()
    });
    // A claim of runs or of followed keys: a key's rows behind a failed head come in the same
    // batch, and the batch holds them.
    drain(
        &Batcher::new(pool.clone(), queries(), settings, redis_sink(ns, TTL).await)
            .starting_with(kind),
    )
    .await
}

async fn a_dead_head_holds_its_key_until_requeued_or_purged(pool: PgPool, kind: ClaimKind) {
    let ns = Namespace::new();
    // The jobrelay layout takes no options: `nope` is unfit, the row is dead-lettered at once.
    let a1 = keyed(&pool, Some("a"), r#"{"nope": 1}"#, None).await;
    let b1 = keyed(&pool, Some("b"), "{}", None).await;
    let a2 = keyed(&pool, Some("a"), "{}", None).await;
    let u = keyed(&pool, None, "{}", None).await;
    let c1 = keyed(&pool, Some("c"), r#"{"nope": 1}"#, None).await;
    let a3 = keyed(&pool, Some("a"), "{}", None).await;
    let c2 = keyed(&pool, Some("c"), "{}", None).await;
    let b2 = keyed(&pool, Some("b"), "{}", None).await;
    // f1's payload is over --max-job-size: the claim itself moves it to the dead letters.
    let f1 = keyed(&pool, Some("f"), "{}", None).await;
    sqlx::query(
        "UPDATE pending_jobs SET payload = convert_to(repeat('x', 2000), 'UTF8') WHERE id = $1",
    )
    .bind(f1.1)
    .execute(&pool)
    .await
    .unwrap();
    let f2 = keyed(&pool, Some("f"), "{}", None).await;

    let report = relay(&pool, &ns, kind).await;
    assert_eq!(report.dead_lettered, 3, "{report}");
    assert_eq!(
        report.held, 4,
        "a2, a3, c2 and f2, behind a1, c1 and f1 in the same batch: {report}"
    );
    assert_eq!(
        queued_uuids(&ns).await,
        [b1.0, u.0, b2.0],
        "other keys flow"
    );
    assert_eq!(pending_uuids(&pool).await, [a2.0, a3.0, c2.0, f2.0]);

    // Claimed again, they are passed over: their key's head is in the dead letters.
    let again = relay(&pool, &ns, kind).await;
    assert_eq!((again.claimed, again.held), (0, 0), "{again}");
    assert_eq!(pending_uuids(&pool).await, [a2.0, a3.0, c2.0, f2.0]);

    // The operator mends a1 and requeues it: it keeps its id, goes first, and releases a.
    sqlx::query("UPDATE pending_jobs_dead SET options = '{}' WHERE uuid = $1")
        .bind(a1.0)
        .execute(&pool)
        .await
        .unwrap();
    let db = database_url_of(&pool).await;
    let (code, out, err) = run_relay(
        &["dead-letter", "requeue", "--id", &a1.1.to_string()],
        &[("DATABASE_URL", &db)],
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    let requeued_id: i64 = sqlx::query_scalar("SELECT id FROM pending_jobs WHERE uuid = $1")
        .bind(a1.0)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(requeued_id, a1.1, "a requeued keyed row keeps its id");
    relay(&pool, &ns, kind).await;
    assert_eq!(
        queued_uuids(&ns).await,
        [b1.0, u.0, b2.0, a1.0, a2.0, a3.0],
        "a goes, in order"
    );
    assert_eq!(
        pending_uuids(&pool).await,
        [c2.0, f2.0],
        "c and f still held"
    );

    // Purging c's dead head releases c.
    let (code, out, err) = run_relay(
        &["dead-letter", "purge", "--id", &c1.1.to_string()],
        &[("DATABASE_URL", &db)],
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    relay(&pool, &ns, kind).await;
    assert_eq!(queued_uuids(&ns).await.last(), Some(&c2.0));
    assert_eq!(pending_uuids(&pool).await, [f2.0], "f still held");
}

async fn a_row_not_yet_due_holds_its_key_until_it_is(pool: PgPool, kind: ClaimKind) {
    let ns = Namespace::new();
    let d1 = keyed(&pool, Some("d"), "{}", Some(2.0)).await;
    let d2 = keyed(&pool, Some("d"), "{}", None).await;
    let e1 = keyed(&pool, Some("e"), "{}", None).await;
    let report = relay(&pool, &ns, kind).await;
    assert_eq!(queued_uuids(&ns).await, [e1.0], "{report}");
    assert_eq!(
        pending_uuids(&pool).await,
        [d1.0, d2.0],
        "d waits for its head"
    );
    wait_until(
        "d1 due and relayed with d2 behind it",
        Duration::from_secs(20),
        || async {
            relay(&pool, &ns, kind).await;
            pending_count(&pool).await == 0
        },
    )
    .await;
    // Due, d1 goes into the queue itself (not the scheduled set), then d2.
    assert_eq!(queued_uuids(&ns).await, [e1.0, d1.0, d2.0]);
    assert!(ns.scheduled().await.is_empty());
}

per_claim_of_runs!(a_dead_head_holds_its_key_until_requeued_or_purged);
per_claim_of_runs!(a_row_not_yet_due_holds_its_key_until_it_is);
