//! Hardening ("no row may block the outbox"): rows and tables the relay must survive.
//!
//! A `timestamptz` holds `infinity`, `-infinity` and the years 4713 BC ..= 294276 AD; a job
//! carries `run_at` and `created_at` as a protobuf Timestamp (0001-01-01 ..= 9999-12-31, docs/wire.md).
//! Such rows are refused at insert by migration 6's CHECK constraints; in a table without them
//! the relay dead-letters them (docs/guarantees.md#failure-classes) and relays the rows behind them, and the operator
//! commands work on them. `jobrelay migrate --table T` refuses an existing T of another shape.
//!
//! Postgres and Redis are the real local ones (fresh database, random Redis namespace).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use jobrelay::broker::redis_sink::RedisSink;
use jobrelay::relay::{BatchSettings, Health, RelaySettings};
use jobrelay::{Enqueuer, TableName};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

/// Timestamps no job can carry, as Postgres prints them in UTC (the session time zone of sqlx
/// and of the relay): the infinities, beyond chrono's years, and one microsecond beyond each
/// end of the protobuf range.
const UNRELAYABLE: [&str; 5] = [
    "infinity",
    "-infinity",
    "294276-12-31 00:00:00+00",
    "10000-01-01 00:00:00+00",
    "0001-12-31 23:59:59.999999+00 BC",
];
/// The first and the last instant a job can carry.
const EDGES: [&str; 2] = ["0001-01-01 00:00:00+00", "9999-12-31 23:59:59.999999+00"];
/// The two columns concerned.
const COLUMNS: [&str; 2] = ["run_at", "created_at"];

/// The relay's `last_error` for `column` holding `value`.
fn expected_error(column: &str, value: &str) -> String {
    format!(
        "invalid job: {column}: {value} cannot be relayed \
         (protobuf Timestamp carries 0001-01-01..9999-12-31)"
    )
}

/// Drops migration 6's constraints from `table`: a table of an older schema, or made by hand.
async fn drop_checks(pool: &PgPool, table: &str) {
    sqlx::query(&format!(
        "ALTER TABLE {table} DROP CONSTRAINT pending_jobs_run_at_check,
                            DROP CONSTRAINT pending_jobs_created_at_check"
    ))
    .execute(pool)
    .await
    .unwrap();
}

/// Inserts a row into `table` (queue `hostile`), with `column` set to `value` when given.
async fn insert_into(
    pool: &PgPool,
    table: &str,
    at: Option<(&str, &str)>,
) -> sqlx::Result<(i64, Uuid)> {
    let (column, value) = match at {
        Some((column, value)) => (column, Some(value)),
        None => ("run_at", None),
    };
    sqlx::query_as(&format!(
        "INSERT INTO {table} (queue, job_type, {column}) VALUES ('hostile', 'T', $1::timestamptz)
         RETURNING id, uuid"
    ))
    .bind(value)
    .fetch_one(pool)
    .await
}

async fn insert(pool: &PgPool, at: Option<(&str, &str)>) -> (i64, Uuid) {
    insert_into(pool, "pending_jobs", at).await.unwrap()
}

/// `(id, run_at, created_at, last_error)` of every dead letter of `table`, timestamps as text.
async fn dead_rows(pool: &PgPool, table: &str) -> Vec<(i64, Option<String>, String, String)> {
    sqlx::query_as(&format!(
        "SELECT id, run_at::text, created_at::text, last_error FROM {table}_dead ORDER BY id"
    ))
    .fetch_all(pool)
    .await
    .unwrap()
}

/// The same columns of pending rows, `last_error` being what the relay will say of them.
async fn doomed_rows(
    pool: &PgPool,
    table: &str,
    ids: &[(i64, &str, &str)],
) -> Vec<(i64, Option<String>, String, String)> {
    let mut rows = Vec::new();
    for &(id, column, value) in ids {
        let (run_at, created_at): (Option<String>, String) = sqlx::query_as(&format!(
            "SELECT run_at::text, created_at::text FROM {table} WHERE id = $1"
        ))
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap();
        rows.push((id, run_at, created_at, expected_error(column, value)));
    }
    rows
}

/// Uuids of the jobs in `queue:hostile` and `scheduled`, each as often as it is there.
async fn delivered(ns: &Namespace) -> Vec<Uuid> {
    let mut jobs = ns.list_jobs("queue:hostile").await;
    jobs.extend(ns.scheduled().await.into_iter().map(|(j, _)| j));
    jobs.iter().map(|j| j.uuid.parse().unwrap()).collect()
}

fn relay_env<'a>(db: &'a str, ns: &'a Namespace) -> Vec<(&'static str, &'a str)> {
    vec![
        ("DATABASE_URL", db),
        ("REDIS_URL", &ns.url),
        ("JOBRELAY_NAMESPACE", &ns.prefix),
    ]
}

/// Runs the daemon's workers in-process (as `relay::spawn` does for the binary) until the
/// outbox is empty, then stops them.
async fn relay_until_empty(pool: &PgPool, ns: &Namespace, workers: usize, batch_size: usize) {
    let mut sinks = Vec::new();
    for _ in 0..workers {
        sinks.push(RedisSink::new(
            Enqueuer::new(ns.prefix.clone(), Duration::from_secs(600)),
            ns.manager().await.into(),
            Duration::from_secs(5),
        ));
    }
    let settings = RelaySettings {
        table: TableName::default(),
        batch: BatchSettings {
            batch_size,
            max_attempts: 25,
            statement_timeout: Duration::from_secs(15),
            ..BatchSettings::default()
        },
        poll_interval: Duration::from_millis(100),
    };
    let (tracker, shutdown) = (TaskTracker::new(), CancellationToken::new());
    let health = Arc::new(Health::default());
    jobrelay::relay::spawn(
        &tracker,
        &settings,
        pool.clone(),
        sinks,
        health,
        shutdown.clone(),
    );
    crate::common::batch::drained_then_stopped(pool, Duration::from_secs(60), tracker, shutdown)
        .await;
}

// ---------------------------------------------------------------------------------------------
// The relay
// ---------------------------------------------------------------------------------------------

/// Every unrelayable value in each column, between good rows and the edges of the range, in a
/// table without the CHECKs, two workers, three rows a batch: the good rows arrive exactly once,
/// the others are dead letters that name column and value and keep their timestamps as they were.
#[sqlx::test]
async fn two_workers_dead_letter_unrelayable_rows_and_deliver_the_rest(pool: PgPool) {
    let ns = Namespace::new();
    drop_checks(&pool, "pending_jobs").await;
    let mut good = BTreeSet::new();
    let mut bad = Vec::new();
    for column in COLUMNS {
        for value in UNRELAYABLE {
            good.insert(insert(&pool, None).await.1);
            let (id, _) = insert(&pool, Some((column, value))).await;
            bad.push((id, column, value));
        }
        for edge in EDGES {
            good.insert(insert(&pool, Some((column, edge))).await.1);
        }
    }
    for _ in 0..5 {
        good.insert(insert(&pool, None).await.1);
    }
    let expected_dead = doomed_rows(&pool, "pending_jobs", &bad).await;

    relay_until_empty(&pool, &ns, 2, 3).await;

    let got = delivered(&ns).await;
    assert_eq!(
        got.len(),
        good.len(),
        "each good row delivered once: {got:?}"
    );
    assert_eq!(got.into_iter().collect::<BTreeSet<_>>(), good);
    assert_eq!(dead_rows(&pool, "pending_jobs").await, expected_dead);
    // The edges travel intact: 9999-12-31T23:59:59.999999Z waits in `scheduled`.
    let scheduled = ns.scheduled().await;
    assert_eq!(scheduled.len(), 1, "{scheduled:?}");
    let run_at = scheduled[0].0.run_at.unwrap();
    assert_eq!(
        (run_at.seconds, run_at.nanos),
        (253_402_300_799, 999_999_000)
    );
    let first = ns
        .list_jobs("queue:hostile")
        .await
        .into_iter()
        .find_map(|j| {
            let c = j.created_at.unwrap();
            (c.seconds < 0).then_some((c.seconds, c.nanos))
        });
    assert_eq!(first, Some((-62_135_596_800, 0)), "created_at 0001-01-01");
}

/// `--sweep` dead-letters them too, delivers the rows behind them, and exits 1 (not 101).
#[sqlx::test]
async fn sweep_dead_letters_unrelayable_rows_and_exits_1(pool: PgPool) {
    let ns = Namespace::new();
    drop_checks(&pool, "pending_jobs").await;
    let mut good = BTreeSet::new();
    let mut bad = Vec::new();
    // Rows the sweep claims (created in the past) with each kind of unrelayable value.
    let claimable = [
        ("run_at", "infinity"),
        ("created_at", "-infinity"),
        ("run_at", "294276-12-31 00:00:00+00"),
        ("run_at", "10000-01-01 00:00:00+00"),
        ("created_at", "0001-12-31 23:59:59.999999+00 BC"),
    ];
    for (column, value) in claimable {
        good.insert(insert(&pool, None).await.1);
        bad.push((insert(&pool, Some((column, value))).await.0, column, value));
    }
    good.insert(insert(&pool, None).await.1);
    let expected_dead = doomed_rows(&pool, "pending_jobs", &bad).await;

    let db = database_url_of(&pool).await;
    let args = ["--sweep", "--older-than", "0s", "--batch-size", "2"];
    let (code, out, err) = run_relay(&args, &relay_env(&db, &ns)).await;
    assert_eq!(
        code, 1,
        "a row was not delivered\nstdout: {out}\nstderr: {err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        out.contains("claimed=11 queued=6 ") && out.contains(" failed=5 dead_lettered=5"),
        "{out}"
    );
    assert_eq!(
        delivered(&ns).await.into_iter().collect::<BTreeSet<_>>(),
        good
    );
    assert_eq!(dead_rows(&pool, "pending_jobs").await, expected_dead);
    assert_eq!(pending_count(&pool).await, 0);
}

// ---------------------------------------------------------------------------------------------
// The CHECK constraints of migration 6
// ---------------------------------------------------------------------------------------------

/// On `pending_jobs` and on an outbox made after migration 6: every unrelayable value is refused
/// by the constraint named for its column; the edges and a NULL run_at are accepted.
#[sqlx::test]
async fn checks_refuse_unrelayable_timestamps_at_insert(pool: PgPool) {
    sqlx::query("SELECT jobrelay_create_outbox('billing_jobs')")
        .execute(&pool)
        .await
        .unwrap();
    for table in ["pending_jobs", "billing_jobs"] {
        for column in COLUMNS {
            for value in UNRELAYABLE {
                let e = insert_into(&pool, table, Some((column, value)))
                    .await
                    .expect_err(&format!("{table}.{column} = {value} refused"));
                let e = e.as_database_error().expect("a database error");
                assert_eq!(e.code().as_deref(), Some("23514"), "check_violation: {e}");
                let want = format!("pending_jobs_{column}_check");
                assert_eq!(e.constraint(), Some(want.as_str()), "{table}: {e}");
            }
            for edge in EDGES {
                insert_into(&pool, table, Some((column, edge)))
                    .await
                    .unwrap();
            }
        }
        insert_into(&pool, table, None).await.unwrap();
    }
}

/// Migration 6 on a database at version 5 that holds unrelayable rows, an outbox made by
/// `jobrelay_create_outbox` and an application table that the old `migrate --table` gave a
/// trigger: it succeeds, constrains both outboxes NOT VALID (the old rows stay, new ones are
/// refused) and leaves the application table alone.
#[sqlx::test(migrations = false)]
async fn migration_6_constrains_existing_outboxes_not_valid(pool: PgPool) {
    migrate_before(&pool, "20261124000006").await;
    sqlx::raw_sql(
        "SELECT jobrelay_create_outbox('billing_jobs');
         CREATE TABLE orders (id bigint PRIMARY KEY, total numeric);
         SELECT jobrelay_notify_trigger('orders', 'orders_notify', 'orders');",
    )
    .execute(&pool)
    .await
    .unwrap();
    for table in ["pending_jobs", "billing_jobs"] {
        insert_into(&pool, table, Some(("run_at", "infinity")))
            .await
            .unwrap();
    }

    jobrelay::db::MIGRATOR
        .run(&pool)
        .await
        .expect("migration 6 applies");

    let constraints: Vec<(String, String, bool)> = sqlx::query_as(
        "SELECT conrelid::regclass::text, conname::text, convalidated FROM pg_constraint
         WHERE conname IN ('pending_jobs_run_at_check', 'pending_jobs_created_at_check')
         ORDER BY 1, 2",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let want: Vec<(String, String, bool)> = ["billing_jobs", "pending_jobs"]
        .iter()
        .flat_map(|t| {
            ["pending_jobs_created_at_check", "pending_jobs_run_at_check"]
                .map(|c| (t.to_string(), c.to_string(), false))
        })
        .collect();
    assert_eq!(
        constraints, want,
        "both outboxes, NOT VALID; orders untouched"
    );
    for table in ["pending_jobs", "billing_jobs"] {
        let left: i64 = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {table} WHERE run_at = 'infinity'"
        ))
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(left, 1, "{table}: the old row stays");
        assert!(insert_into(&pool, table, Some(("created_at", "infinity")))
            .await
            .is_err());
        insert_into(&pool, table, None).await.unwrap();
    }
}

// ---------------------------------------------------------------------------------------------
// status and dead-letter, through the binary
// ---------------------------------------------------------------------------------------------

/// `jobrelay <args>` against `db`: (exit code, stdout, stderr).
async fn admin(db: &str, args: &[&str]) -> (i32, String, String) {
    run_relay(args, &[("DATABASE_URL", db)]).await
}

async fn status_json(db: &str) -> serde_json::Value {
    let (code, out, err) = admin(db, &["status", "--json"]).await;
    assert_eq!(code, 0, "status --json\nstdout: {out}\nstderr: {err}");
    serde_json::from_str(&out).unwrap()
}

/// The oldest age ignores `infinity` and `-infinity` (null when nothing else is pending); the
/// rows still count.
#[sqlx::test]
async fn status_ignores_infinite_created_at(pool: PgPool) {
    let db = database_url_of(&pool).await;
    drop_checks(&pool, "pending_jobs").await;
    insert(&pool, Some(("created_at", "infinity"))).await;
    insert(&pool, Some(("created_at", "-infinity"))).await;
    let s = status_json(&db).await;
    assert_eq!(s["pending"], serde_json::json!(2), "{s}");
    assert_eq!(
        s["oldest_pending_age_seconds"],
        serde_json::Value::Null,
        "{s}"
    );

    let (id, _) = insert(&pool, None).await;
    sqlx::query(
        "UPDATE pending_jobs SET created_at = now() - interval '100 seconds' WHERE id = $1",
    )
    .bind(id)
    .execute(&pool)
    .await
    .unwrap();
    let s = status_json(&db).await;
    assert_eq!(s["pending"], serde_json::json!(3), "{s}");
    let age = s["oldest_pending_age_seconds"].as_f64().expect("a number");
    assert!((100.0..1000.0).contains(&age), "{s}");
    let (code, out, err) = admin(&db, &["status"]).await;
    assert_eq!(code, 0, "status\nstdout: {out}\nstderr: {err}");
    assert!(out.starts_with("pending 3  oldest 1"), "{out}");
}

/// Dead letters with unrelayable timestamps, in a migrated database (the outbox has the
/// CHECKs): `list` shows them (text and JSON), `requeue --all` moves the others and keeps them,
/// saying which and why, `purge` deletes them.
#[sqlx::test]
async fn dead_letter_commands_handle_unrelayable_rows(pool: PgPool) {
    let db = database_url_of(&pool).await;
    sqlx::query(
        "INSERT INTO pending_jobs_dead (id, uuid, queue, job_type, run_at, created_at)
         VALUES (1, gen_random_uuid(), 'q', 'T', NULL, '2020-05-06 07:08:09.5+00'),
                (2, gen_random_uuid(), 'q', 'T', 'infinity', now()),
                (3, gen_random_uuid(), 'q', 'T', NULL, '-infinity'),
                (4, gen_random_uuid(), 'q', 'T', NULL, '294276-12-31 00:00:00+00'),
                (5, gen_random_uuid(), 'q', 'T', '10000-01-01 00:00:00+00', now()),
                (6, gen_random_uuid(), 'q', 'T', '9999-12-31 23:59:59.999999+00', now())",
    )
    .execute(&pool)
    .await
    .unwrap();

    let (code, out, err) = admin(&db, &["dead-letter", "list", "--json"]).await;
    assert_eq!(code, 0, "list --json\nstdout: {out}\nstderr: {err}");
    let created: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["created_at"].clone())
        .collect();
    assert_eq!(created.len(), 6, "{out}");
    assert_eq!(
        created[0], "2020-05-06T07:08:09.500Z",
        "as before: RFC 3339"
    );
    assert_eq!(
        created[2..4],
        ["-infinity", "294276-12-31 00:00:00+00"],
        "{out}"
    );
    let (code, out, err) = admin(&db, &["dead-letter", "list"]).await;
    assert_eq!(code, 0, "list\nstdout: {out}\nstderr: {err}");
    assert_eq!(out.lines().count(), 6, "{out}");
    assert!(
        out.lines()
            .nth(2)
            .unwrap()
            .contains("\tcreated_at=-infinity\t"),
        "{out}"
    );

    let (code, out, err) = admin(&db, &["dead-letter", "requeue", "--all"]).await;
    assert_eq!(code, 0, "requeue\nstdout: {out}\nstderr: {err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "requeued 2 rows", "{out}");
    assert_eq!(lines.len(), 2, "{out}");
    assert!(
        lines[1].starts_with("kept 4 rows in the dead-letter table (ids 2, 3, 4, 5): ")
            && lines[1].contains("run_at or created_at cannot be relayed")
            && lines[1].ends_with("fix them with UPDATE first"),
        "{out}"
    );
    let left: Vec<i64> = sqlx::query_scalar("SELECT id FROM pending_jobs_dead ORDER BY id")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(left, [2, 3, 4, 5]);
    assert_eq!(pending_count(&pool).await, 2);

    let (code, out, _) = admin(&db, &["dead-letter", "purge", "--id", "2,4"]).await;
    assert_eq!((code, out.trim()), (0, "purged 2 rows"));
    let (code, out, _) = admin(&db, &["dead-letter", "purge", "--all"]).await;
    assert_eq!((code, out.trim()), (0, "purged 2 rows"));
}

// ---------------------------------------------------------------------------------------------
// migrate --table
// ---------------------------------------------------------------------------------------------

/// What `migrate --table` could change: triggers, relations with their storage options, and
/// the migrations applied.
async fn catalog(pool: &PgPool) -> (Vec<String>, Vec<String>, Option<i64>) {
    let triggers = sqlx::query_scalar(
        "SELECT tgrelid::regclass::text || '.' || tgname FROM pg_trigger
         WHERE NOT tgisinternal ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let relations = sqlx::query_scalar(
        "SELECT relname || ' ' || relkind::text || ' ' || coalesce(array_to_string(reloptions, ','), '')
         FROM pg_class WHERE relnamespace = 'public'::regnamespace ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    (
        triggers,
        relations,
        jobrelay::db::schema_version(pool).await.unwrap(),
    )
}

/// An application's table is refused, with one line naming it and the missing columns, exit
/// 2, before anything is changed: no trigger, storage options or orders_dead, no migration.
#[sqlx::test(migrations = false)]
async fn migrate_refuses_a_table_of_another_shape(pool: PgPool) {
    let db = database_url_of(&pool).await;
    sqlx::query("CREATE TABLE orders (id bigint PRIMARY KEY, total numeric)")
        .execute(&pool)
        .await
        .unwrap();
    let before = catalog(&pool).await;
    assert_eq!(before.2, None, "no migration applied yet");

    let (code, out, err) = admin(&db, &["migrate", "--table", "orders"]).await;
    assert_eq!(code, 2, "stdout: {out}\nstderr: {err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {err}");
    assert!(
        lines[0]
            .starts_with("jobrelay: --table orders: orders exists and is not a jobrelay outbox")
            && lines[0]
                .contains("missing columns uuid uuid, queue text, job_type text, payload bytea")
            && lines[0].contains("run_at timestamptz")
            && lines[0].contains("last_error text"),
        "{err}"
    );
    assert_eq!(catalog(&pool).await, before, "nothing changed");
}

/// A table of the right shape made by hand (here without migration 6's CHECKs, and holding a
/// row with `run_at = infinity`) is adopted: trigger, storage options, dead-letter table and
/// the CHECKs (NOT VALID); the sweep then dead-letters that row into it. One column of the
/// wrong type is refused first.
#[sqlx::test]
async fn migrate_adopts_a_table_of_the_outbox_shape(pool: PgPool) {
    let db = database_url_of(&pool).await;
    sqlx::raw_sql(
        "CREATE TABLE orders_jobs (LIKE pending_jobs INCLUDING ALL);
         ALTER TABLE orders_jobs ALTER COLUMN payload TYPE text;",
    )
    .execute(&pool)
    .await
    .unwrap();
    let before = catalog(&pool).await;
    let (code, _, err) = admin(&db, &["migrate", "--table", "orders_jobs"]).await;
    assert_eq!(code, 2, "{err}");
    assert!(
        err.trim_end()
            .ends_with("payload is text, not bytea; nothing was changed"),
        "{err}"
    );
    assert_eq!(catalog(&pool).await, before, "nothing changed");

    sqlx::query("ALTER TABLE orders_jobs ALTER COLUMN payload TYPE bytea USING payload::bytea")
        .execute(&pool)
        .await
        .unwrap();
    drop_checks(&pool, "orders_jobs").await;
    let (bad, _) = insert_into(&pool, "orders_jobs", Some(("run_at", "infinity")))
        .await
        .unwrap();
    let (code, out, err) = admin(&db, &["migrate", "--table", "orders_jobs"]).await;
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    let (triggers, relations, _) = catalog(&pool).await;
    assert!(
        triggers.contains(&"orders_jobs.orders_jobs_notify".to_owned()),
        "{triggers:?}"
    );
    assert!(
        relations
            .iter()
            .any(|r| r.starts_with("orders_jobs_dead r")),
        "{relations:?}"
    );
    assert!(
        relations
            .iter()
            .any(|r| r.starts_with("orders_jobs r ")
                && r.contains("autovacuum_vacuum_threshold=10000")),
        "{relations:?}"
    );
    let e = insert_into(&pool, "orders_jobs", Some(("created_at", "infinity"))).await;
    assert!(e.is_err(), "the CHECKs are back");

    let ns = Namespace::new();
    let args = ["--sweep", "--older-than", "0s", "--table", "orders_jobs"];
    let (code, out, err) = run_relay(&args, &relay_env(&db, &ns)).await;
    assert_eq!(code, 1, "stdout: {out}\nstderr: {err}");
    let dead = dead_rows(&pool, "orders_jobs").await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].0, bad);
    assert_eq!(dead[0].1.as_deref(), Some("infinity"), "kept as it was");
    assert_eq!(dead[0].3, expected_error("run_at", "infinity"));
}
