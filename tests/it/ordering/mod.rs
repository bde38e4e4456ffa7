//! Per-key order (migration 9's `ordering_key`, docs/guarantees.md#per-key-order): for each
//! key, jobs enter the runner's storage in `id` order, and none is pushed while an earlier row
//! of its key is still pending or dead-lettered, for any number of relays and workers, through
//! outages, refusals and kill -9.
//!
//! "In order" is checked, not assumed: [`Ledger::check`] reads every queue list back, maps each
//! job to the row it came from, and checks every key's ids rise strictly, and that each row's
//! job is there exactly once.

/// Defines, for a suite `async fn name(pool: PgPool, kind: ClaimKind)`, a module `name` with
/// one `#[sqlx::test]` per claim that takes a key's rows behind its head in one batch
/// (`name::runs`, `name::follow`; src/relay/claim_kind.rs).
macro_rules! per_claim_of_runs {
    ($suite:ident) => {
        mod $suite {
            use super::*;

            #[sqlx::test]
            async fn runs(pool: PgPool) {
                super::$suite(pool, ClaimKind::Runs).await
            }

            #[sqlx::test]
            async fn follow(pool: PgPool) {
                super::$suite(pool, ClaimKind::Follow).await
            }
        }
    };
}

mod claims;
mod enqueue;
mod execution;
mod fleet;
mod held;
mod held_status;
mod layouts;
mod schema;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::common::layouts::TestLayout;
use crate::common::*;
use jobrelay::LayoutKind;
use rand::Rng;
use sqlx::PgPool;
use uuid::Uuid;

/// A row a producer committed: its id, uuid and key.
#[derive(Debug, Clone)]
pub struct Written {
    pub id: i64,
    pub uuid: Uuid,
    pub key: String,
}

/// The queue a key's jobs go to: one of `queues`, by the key.
pub fn queue_of<'q>(key: &str, queues: &[&'q str]) -> &'q str {
    let h = key
        .bytes()
        .fold(7u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64));
    queues[(h % queues.len() as u64) as usize]
}

/// Commits `rows` rows over `keys` keys (`k0`, `k1`, ...) from `producers` concurrent
/// producers into `pending_jobs`, each in transactions of 1..=20 rows of random keys, written
/// in key order (a transaction of several keys takes their locks in that order: no deadlock
/// between producers). Each key's jobs go to `queue_of(key, queues)`. Returns every row written.
pub async fn produce(
    pool: &PgPool,
    rows: usize,
    keys: usize,
    producers: usize,
    queues: &[&'static str],
) -> Vec<Written> {
    let queues: Vec<&'static str> = queues.to_vec();
    let mut tasks = Vec::new();
    for p in 0..producers {
        let pool = pool.clone();
        let queues = queues.clone();
        let share = rows / producers + usize::from(p < rows % producers);
        tasks.push(tokio::spawn(async move {
            let mut written = Vec::with_capacity(share);
            while written.len() < share {
                let n = rand::rng().random_range(1..=20).min(share - written.len());
                let mut batch: Vec<String> = (0..n)
                    .map(|_| format!("k{}", rand::rng().random_range(0..keys)))
                    .collect();
                batch.sort();
                let queue: Vec<&str> = batch.iter().map(|k| queue_of(k, &queues)).collect();
                let payload: Vec<String> =
                    (0..n).map(|i| format!("[{}]", written.len() + i)).collect();
                let mut tx = pool.begin().await.unwrap();
                let got: Vec<(i64, Uuid, String)> = sqlx::query_as(
                    "INSERT INTO pending_jobs (queue, job_type, payload, ordering_key)
                     SELECT q, 'app.tasks.ordered', convert_to(p, 'UTF8'), k
                     FROM unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY AS u(q, p, k, n)
                     ORDER BY n
                     RETURNING id, uuid, ordering_key",
                )
                .bind(&queue)
                .bind(&payload)
                .bind(&batch)
                .fetch_all(&mut *tx)
                .await
                .unwrap();
                tx.commit().await.unwrap();
                written.extend(got.into_iter().map(|(id, uuid, key)| Written { id, uuid, key }));
            }
            written
        }));
    }
    let mut all = Vec::with_capacity(rows);
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all
}

/// What was written, by uuid, to check what Redis holds against.
pub struct Ledger {
    rows: HashMap<Uuid, Written>,
}

impl Ledger {
    pub fn new(written: &[Written]) -> Self {
        Ledger {
            rows: written.iter().map(|w| (w.uuid, w.clone())).collect(),
        }
    }

    /// Reads `queues` back as `layout` wrote them, oldest job first, and checks: every job is
    /// a row written, each row's job is there exactly once, and each key's ids rise strictly.
    /// Returns (jobs, keys) checked.
    pub async fn check(
        &self,
        con: &mut redis::aio::MultiplexedConnection,
        layout: TestLayout,
        ns: &Namespace,
        queues: &[&str],
    ) -> (usize, usize) {
        let mut seen: HashSet<Uuid> = HashSet::new();
        let mut last: HashMap<&str, (i64, Uuid)> = HashMap::new();
        let mut out_of_order = Vec::new();
        for queue in queues {
            let mut members: Vec<Vec<u8>> = redis::cmd("LRANGE")
                .arg(layout.queue_key(ns, queue))
                .arg(0)
                .arg(-1)
                .query_async(con)
                .await
                .unwrap();
            // RQ appends (RPUSH); every other layout pushes at the head (LPUSH) and its
            // workers take from the tail.
            if layout.0 != LayoutKind::Rq {
                members.reverse();
            }
            for m in &members {
                let uuid = Uuid::parse_str(&layout.uuid_of(m)).unwrap();
                let row = self
                    .rows
                    .get(&uuid)
                    .unwrap_or_else(|| panic!("job {uuid} in {queue} is no row written"));
                assert!(seen.insert(uuid), "job {uuid} (row {}) twice", row.id);
                if let Some((before, before_uuid)) = last.insert(&row.key, (row.id, uuid)) {
                    if before >= row.id {
                        out_of_order.push(format!(
                            "key {}: row {} ({uuid}) after row {before} ({before_uuid})",
                            row.key, row.id
                        ));
                    }
                }
            }
        }
        assert!(
            out_of_order.is_empty(),
            "{} jobs overtook an earlier one of their key, first: {:?}",
            out_of_order.len(),
            &out_of_order[..out_of_order.len().min(5)]
        );
        let missing: Vec<&Written> = self
            .rows
            .values()
            .filter(|w| !seen.contains(&w.uuid))
            .take(5)
            .collect();
        assert!(missing.is_empty(), "rows without their job: {missing:?}");
        (seen.len(), last.len())
    }
}

/// The uuids in the queue `q` of `ns`, oldest first.
pub async fn queued_uuids(ns: &Namespace) -> Vec<Uuid> {
    ns.list_jobs("queue:q")
        .await
        .iter()
        .map(|j| Uuid::parse_str(&j.uuid).unwrap())
        .collect()
}

/// How many jobs `queues` hold, in `layout`. A queue key that holds another type for a moment
/// (the refusal test's) counts as empty: the callers poll again.
pub async fn queued(
    con: &mut redis::aio::MultiplexedConnection,
    layout: TestLayout,
    ns: &Namespace,
    queues: &[&str],
) -> usize {
    let mut total = 0;
    for queue in queues {
        let n: redis::RedisResult<usize> = redis::cmd("LLEN")
            .arg(layout.queue_key(ns, queue))
            .query_async(con)
            .await;
        total += match n {
            Ok(n) => n,
            Err(e) if e.code() == Some("WRONGTYPE") => 0,
            Err(e) => panic!("LLEN {queue}: {e}"),
        };
    }
    total
}

/// Waits until `queues` hold `n` jobs and the outbox is empty.
pub async fn wait_drained(
    pool: &PgPool,
    con: &mut redis::aio::MultiplexedConnection,
    layout: TestLayout,
    ns: &Namespace,
    queues: &[&str],
    n: usize,
    deadline: Duration,
) {
    let mut seen = (0, 0);
    let drained = poll(deadline, Duration::from_millis(200), || {
        let mut con = con.clone();
        async move {
            let pending = pending_count(pool).await;
            let got = queued(&mut con, layout, ns, queues).await;
            (pending == 0 && got >= n)
                .then_some(())
                .ok_or((got, pending))
                .ok()
        }
    })
    .await;
    if drained.is_none() {
        seen = (
            queued(con, layout, ns, queues).await,
            pending_count(pool).await as usize,
        );
    }
    assert!(
        drained.is_some(),
        "not drained after {deadline:?}: {} of {n} jobs in Redis, {} rows pending",
        seen.0,
        seen.1
    );
}
