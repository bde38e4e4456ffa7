//! A worker's three claims (src/relay/claim_kind.rs): rows without a key only, key heads (one
//! row per key), key runs. Each batch runs the claim the rows before asked for, takes what that
//! claim may take, and every key stays in order whichever claim took it.

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
    let got: Vec<Uuid> = ns
        .list_jobs("queue:q")
        .await
        .iter()
        .map(|j| Uuid::parse_str(&j.uuid).unwrap())
        .collect();
    assert_eq!(got, queued, "every row once, in the order claimed");
}
