//! A worker's four claims (src/relay/claim_kind.rs): rows without a key only, key heads (one
//! row per key), key runs, and key heads followed through their key's index. Each batch runs the
//! claim the rows before asked for, takes what that claim may take, and every key stays in
//! order whichever claim took it.

use super::*;
use crate::common::batch::*;
use jobrelay::relay::claim_kind::ClaimKind;

/// Inserts one row of `key` (none: `None`) into queue `q`; its uuid.
async fn row(pool: &PgPool, key: Option<&str>) -> Uuid {
    sqlx::query_scalar(
        "INSERT INTO pending_jobs (queue, job_type, payload, ordering_key)
         VALUES ('q', 'Ordered', '[]', $1) RETURNING uuid",
    )
    .bind(key)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Inserts `rounds` rows of each of `keys` keys (`k0`, `k1`, ...), interleaved: one row of
/// every key, then the next of every key. Returns `(uuid, key)` per row, in id order.
async fn interleaved(pool: &PgPool, keys: usize, rounds: usize) -> Vec<(Uuid, String)> {
    let mut rows = Vec::new();
    for _ in 0..rounds {
        for k in 0..keys {
            let key = format!("k{k}");
            rows.push((row(pool, Some(&key)).await, key));
        }
    }
    rows
}

/// Holds the row `uuid` locked in a transaction of its own, as another worker's claim would,
/// until the transaction ends.
async fn hold(pool: &PgPool, uuid: Uuid) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut other = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM pending_jobs WHERE uuid = $1 FOR UPDATE")
        .bind(uuid)
        .execute(&mut *other)
        .await
        .unwrap();
    other
}

/// Runs batches until one claims nothing: (claim run, rows claimed) per batch.
async fn claims_until_empty<S: jobrelay::sink::JobSink>(
    b: &jobrelay::relay::Batcher<S>,
) -> Vec<(ClaimKind, u64)> {
    let mut kinds = Vec::new();
    loop {
        let (kind, claimed, _, _) = step(b).await;
        if claimed == 0 {
            return kinds;
        }
        kinds.push((kind, claimed));
    }
}

/// Runs one batch: (claim run, rows claimed, passed over, claim next).
async fn step<S: jobrelay::sink::JobSink>(
    b: &jobrelay::relay::Batcher<S>,
) -> (ClaimKind, u64, bool, ClaimKind) {
    let kind = b.claim_kind();
    let r = b.run_once(None).await.expect("batch succeeds");
    (kind, r.claimed, r.passed_over, b.claim_kind())
}

#[sqlx::test]
async fn each_batch_runs_the_claim_the_rows_before_asked_for(pool: PgPool) {
    let ns = Namespace::new();
    let b = batcher(&pool, &ns, TTL, 10).await;
    let mut queued = Vec::new();
    // (claim run, rows claimed, passed over, claim next), per batch.
    let mut seen = Vec::new();

    // Nothing seen yet: the claim of key heads. Rows without a key: the unkeyed claim next.
    for _ in 0..3 {
        queued.push(row(&pool, None).await);
    }
    seen.push(step(&b).await);

    // Keyed rows among unkeyed ones: the unkeyed claim takes the latter, passes the former
    // over (a catch-up at once) and hands over to the claim of key heads.
    let a1 = row(&pool, Some("a")).await;
    let u1 = row(&pool, None).await;
    let b1 = row(&pool, Some("b")).await;
    seen.push(step(&b).await);
    queued.push(u1);
    seen.push(step(&b).await);
    queued.extend([a1, b1]);

    // A hot key: heads takes its first row and leaves the others locked behind it, so the next
    // claim takes the run, the rest of the key in one batch, in order; runs stays.
    let mut hot = Vec::new();
    for _ in 0..5 {
        hot.push(row(&pool, Some("hot")).await);
    }
    seen.push(step(&b).await);
    seen.push(step(&b).await);
    queued.extend(&hot);

    // Runs stays while keyed rows are seen, and through an empty claim (which says nothing).
    seen.push(step(&b).await);

    use ClaimKind::*;
    assert_eq!(
        seen,
        [
            (Heads, 3, false, Unkeyed),
            (Unkeyed, 1, true, Heads),
            (Heads, 2, false, Heads),
            (Heads, 1, true, Runs),
            (Runs, 4, false, Runs),
            (Runs, 0, false, Runs),
        ],
        "(claim run, rows claimed, passed over, claim next) per batch"
    );
    assert_eq!(
        queued_uuids(&ns).await,
        queued,
        "every row once, in the order claimed"
    );
}

#[sqlx::test]
async fn keys_going_on_beyond_a_batch_are_followed_and_every_row_between_is_claimed(pool: PgPool) {
    let ns = Namespace::new();
    let b = batcher(&pool, &ns, TTL, 10).await;
    // 30 keys of 3 rows, interleaved: a batch of heads holds 10 distinct keys, whose rows go
    // on 30 and 60 ids later.
    let written = interleaved(&pool, 30, 3).await;
    let kinds = claims_until_empty(&b).await;
    use ClaimKind::*;
    // Heads first, a full batch of distinct keys, so follow, with a window of one row (a batch
    // of 10 over runs of 20 assumed) followed by its key's two other rows; then a window sized by
    // the runs seen: 4 heads (10 rows over runs of 3), each followed one row on (a batch of 10
    // over 4 heads), then 5 heads of 2 rows.
    assert_eq!(
        kinds[..4],
        [(Heads, 10), (Follow, 3), (Follow, 8), (Follow, 10)],
        "(claim, rows) per batch: {kinds:?}"
    );
    assert_eq!(
        pending_count(&pool).await,
        0,
        "the rows between a window and the rows it followed are claimed by the next claims, \
         not passed by the cursor: {kinds:?}"
    );
    // Every key in id order, each row once.
    let got = queued_uuids(&ns).await;
    assert_eq!(got.len(), written.len());
    let position: std::collections::HashMap<Uuid, usize> =
        got.iter().enumerate().map(|(i, u)| (*u, i)).collect();
    for k in 0..30 {
        let key = format!("k{k}");
        let at: Vec<usize> = written
            .iter()
            .filter(|(_, w)| *w == key)
            .map(|(u, _)| position[u])
            .collect();
        assert!(
            at.windows(2).all(|w| w[0] < w[1]),
            "{key} out of order: {at:?}"
        );
    }
}

#[sqlx::test]
async fn a_followed_key_stops_at_a_row_another_worker_holds_not_due_or_backing_off(pool: PgPool) {
    let ns = Namespace::new();
    // A batch of 100: the first follow claim looks at 5 rows and follows each key 19 rows on.
    let b = batcher(&pool, &ns, TTL, 100)
        .await
        .starting_with(ClaimKind::Follow);
    // Keys a..e of 4 rows, interleaved: the window is a1..e1.
    let rows = interleaved(&pool, 5, 4).await;
    let uuid = |key: usize, n: usize| rows[(n - 1) * 5 + key].0;
    let (a, bk, c, d, e) = (0, 1, 2, 3, 4);
    // c2 not yet due, d3 backing off after a refusal.
    sqlx::query("UPDATE pending_jobs SET run_at = now() + interval '1 hour' WHERE uuid = $1")
        .bind(uuid(c, 2))
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("UPDATE pending_jobs SET available_at = now() + interval '1 hour' WHERE uuid = $1")
        .bind(uuid(d, 3))
        .execute(&pool)
        .await
        .unwrap();
    // b2 held by another worker's transaction.
    let other = hold(&pool, uuid(bk, 2)).await;

    let (kind, claimed, passed_over, next) = step(&b).await;
    assert_eq!(
        (kind, passed_over, next),
        (ClaimKind::Follow, false, ClaimKind::Follow)
    );
    let taken = [
        uuid(a, 1),
        uuid(bk, 1),
        uuid(c, 1),
        uuid(d, 1),
        uuid(e, 1),
        uuid(a, 2),
        uuid(d, 2),
        uuid(e, 2),
        uuid(a, 3),
        uuid(e, 3),
        uuid(a, 4),
        uuid(e, 4),
    ];
    assert_eq!(claimed, taken.len() as u64);
    assert_eq!(
        queued_uuids(&ns).await,
        taken,
        "each key up to the row it could not take"
    );
    let mut left: Vec<Uuid> = [
        (bk, 2),
        (bk, 3),
        (bk, 4),
        (c, 2),
        (c, 3),
        (c, 4),
        (d, 3),
        (d, 4),
    ]
    .map(|(k, n)| uuid(k, n))
    .to_vec();
    let mut pending: Vec<Uuid> = sqlx::query_scalar("SELECT uuid FROM pending_jobs")
        .fetch_all(&pool)
        .await
        .unwrap();
    left.sort();
    pending.sort();
    assert_eq!(pending, left);

    // Released, b goes on in order; c and d wait for their heads.
    other.rollback().await.unwrap();
    b.cursor().catch_up_now();
    drain(&b).await;
    let got = queued_uuids(&ns).await;
    assert_eq!(got[taken.len()..], [uuid(bk, 2), uuid(bk, 3), uuid(bk, 4)]);
    assert_eq!(pending_count(&pool).await, 5, "c2.. and d3.. wait");
}

#[sqlx::test]
async fn short_runs_send_the_follow_claim_back_to_heads_for_a_while(pool: PgPool) {
    let ns = Namespace::new();
    let b = batcher(&pool, &ns, TTL, 10).await;
    // Ten keys of one row, the last with a second row behind them: a full claim of heads brings
    // follow, which finds a run of one row. Then the same again, which heads takes without
    // trying follow.
    for round in 0..2 {
        for k in 0..10 {
            row(&pool, Some(&format!("r{round}k{k}"))).await;
        }
        row(&pool, Some(&format!("r{round}k9"))).await;
    }
    let kinds = claims_until_empty(&b).await;
    use ClaimKind::*;
    assert_eq!(
        kinds,
        [(Heads, 10), (Follow, 1), (Heads, 10), (Heads, 1)],
        "(claim, rows) per batch"
    );
    assert_eq!(pending_count(&pool).await, 0);
}

#[sqlx::test]
async fn a_follow_claim_that_left_rows_of_its_window_asks_for_the_next_claim_at_once(pool: PgPool) {
    let ns = Namespace::new();
    // A batch of 40: the follow claim looks at 2 rows.
    let b = batcher(&pool, &ns, TTL, 40)
        .await
        .starting_with(ClaimKind::Follow);
    let x1 = row(&pool, Some("x")).await;
    row(&pool, Some("x")).await;
    let y1 = row(&pool, Some("y")).await;
    let y2 = row(&pool, Some("y")).await;
    // x1 held by another worker: the window is x2, behind it, and y1.
    let other = hold(&pool, x1).await;
    let r = b.run_once(None).await.expect("batch succeeds");
    assert_eq!(queued_uuids(&ns).await, [y1, y2], "{r}");
    // Without `more`, a relay's worker would wait for a notification or its poll interval
    // with the rest of its backlog behind the window.
    assert!(r.more && r.passed_over, "{r:?}");
    other.rollback().await.unwrap();
}
