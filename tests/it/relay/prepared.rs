//! `--prepared-statements`: the claims run as named statements, prepared once on a
//! connection and executed there again (their plans cached), and relay what the unnamed ones
//! relay; without it, no statement outlives its transaction (docs/cli.md#postgres-connections).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::common::batch::*;
use crate::common::*;
use jobrelay::relay::prepared::PreparedClaims;
use jobrelay::relay::{BatchSettings, Batcher, PreparedStatements};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

/// A pool of one connection to the test's database: a relay's claims prepared on it are the
/// ones it runs again.
async fn one_connection(pool: &PgPool) -> PgPool {
    PgPoolOptions::new()
        .max_connections(1)
        .connect_with((*pool.connect_options()).clone())
        .await
        .unwrap()
}

/// Rows without a key and rows of three keys, interleaved, drained five at a time by a relay
/// whose one connection is then asked which statements it holds prepared: each job once, each
/// key's jobs in order, and the claims prepared only when asked for (two rounds: the second
/// runs statements the first prepared).
async fn relay_on_one_connection(pool: &PgPool, prepared: bool) -> (Vec<String>, i64) {
    let ns = Namespace::new();
    let one = one_connection(pool).await;
    let settings = Arc::new(BatchSettings {
        prepared_statements: if prepared {
            PreparedStatements::Always
        } else {
            PreparedStatements::Never
        },
        ..(*settings(5)).clone()
    });
    let b = Batcher::new(one.clone(), queries(), settings, redis_sink(&ns, TTL).await);
    let mut relayed = Vec::new();
    for round in 0..2 {
        sqlx::query(
            "INSERT INTO pending_jobs (queue, job_type, payload, ordering_key)
             SELECT 'default', 'Step', convert_to(format('%s-%s-%s', $1::int, k, i), 'UTF8'),
                    CASE WHEN k = 0 THEN NULL ELSE 'k' || k END
             FROM generate_series(1, 8) AS i, generate_series(0, 3) AS k
             ORDER BY i, k",
        )
        .bind(round)
        .execute(pool)
        .await
        .unwrap();
        drain(&b).await;
        assert_eq!(pending_count(pool).await, 0, "round {round} drained");
    }
    for job in ns.list_jobs("queue:default").await {
        relayed.push(String::from_utf8(job.payload).unwrap());
    }
    // Unnamed, this one: it is not among the statements it counts.
    let claims: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE '/* named */ WITH slot AS%'",
    )
    .persistent(false)
    .fetch_one(&one)
    .await
    .unwrap();
    (relayed, claims)
}

/// Each payload once, and each key's payloads (`round-key-i`) in the order they were written.
fn assert_each_once_in_key_order(relayed: &[String]) {
    assert_eq!(relayed.len(), 2 * 8 * 4, "{relayed:?}");
    let mut sorted = relayed.to_vec();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), relayed.len(), "a job twice: {relayed:?}");
    let mut last: BTreeMap<String, (i32, i32)> = BTreeMap::new();
    for p in relayed {
        let [round, key, i]: [i32; 3] = p
            .split('-')
            .map(|n| n.parse().unwrap())
            .collect::<Vec<_>>()
            .try_into()
            .unwrap();
        if key == 0 {
            continue;
        }
        let prev = last.insert(key.to_string(), (round, i));
        assert!(
            prev < Some((round, i)),
            "key {key}: {p} after {prev:?} in {relayed:?}"
        );
    }
}

#[sqlx::test]
async fn claims_are_prepared_and_reused_only_when_asked_for(pool: PgPool) {
    let (relayed, claims) = relay_on_one_connection(&pool, true).await;
    assert_each_once_in_key_order(&relayed);
    let kinds = jobrelay::relay::claim_kind::ClaimKind::ALL.len() as i64;
    assert!(
        (1..=kinds).contains(&claims),
        "one prepared statement per claim run, at most {kinds}: {claims}"
    );

    let (relayed, claims) = relay_on_one_connection(&pool, false).await;
    assert_each_once_in_key_order(&relayed);
    assert_eq!(claims, 0, "unnamed claims leave nothing prepared");
}

/// A migration that changes what a named claim returns (`job_type` from `text` to
/// `varchar`) while a relay runs: the claim that meets the cached plan fails ("cached plan must
/// not change result type"), its batch rolls back untouched, and the relay claims unnamed from
/// then on (docs/cli.md#postgres-connections): every job once, none lost.
#[sqlx::test]
async fn a_migration_that_changes_a_claims_result_ends_named_claims(pool: PgPool) {
    let ns = Namespace::new();
    let one = one_connection(&pool).await;
    let named = Arc::new(PreparedClaims::new(PreparedStatements::Always));
    let b = Batcher::new(
        one.clone(),
        queries(),
        settings(5),
        redis_sink(&ns, TTL).await,
    )
    .with_prepared(named.clone());
    insert_rows(&pool, 10, "default").await;
    drain(&b).await;
    assert!(named.on(), "named claims before the migration");
    sqlx::query("ALTER TABLE pending_jobs ALTER COLUMN job_type TYPE varchar(200)")
        .execute(&pool)
        .await
        .unwrap();
    insert_rows(&pool, 10, "default").await;
    drain(&b).await;
    assert!(!named.on(), "unnamed claims after the migration");
    assert_eq!(pending_count(&pool).await, 0);
    let jobs = ns.list_jobs("queue:default").await;
    assert_eq!(jobs.len(), 20, "every job");
    let uuids: std::collections::BTreeSet<_> = jobs.into_iter().map(|j| j.uuid).collect();
    assert_eq!(uuids.len(), 20, "no job twice");
}
