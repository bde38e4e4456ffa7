//! The row's `options` (the runner's own job options, migration 8): added to outboxes in use,
//! refused by the table unless a JSON object, written by the producer, and kept through the
//! dead letters and `dead-letter requeue`.

use crate::common::*;
use jobrelay::producer::{JobBuilder, Producer};
use jobrelay::TableName;
use serde_json::{json, Value};
use sqlx::PgPool;

/// `options` of every row of `table`, by id.
async fn options_of(pool: &PgPool, table: &str) -> Vec<(i64, Value)> {
    sqlx::query_as(&format!("SELECT id, options FROM {table} ORDER BY id"))
        .fetch_all(pool)
        .await
        .unwrap()
}

/// The tables with an `options jsonb NOT NULL DEFAULT '{}'` column, and the outboxes with a
/// validated `pending_jobs_options_check`.
async fn options_catalog(pool: &PgPool) -> (Vec<String>, Vec<(String, bool)>) {
    let columns = sqlx::query_scalar(
        "SELECT attrelid::regclass::text FROM pg_attribute a
         JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
         WHERE attname = 'options' AND atttypid = 'jsonb'::regtype AND attnotnull
           AND pg_get_expr(d.adbin, d.adrelid) = '''{}''::jsonb'
         ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let checks = sqlx::query_as(
        "SELECT conrelid::regclass::text, convalidated FROM pg_constraint
         WHERE conname = 'pending_jobs_options_check' ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    (columns, checks)
}

/// Migration 8 on a database at version 7 with rows in `pending_jobs` and in an outbox made by
/// `jobrelay_create_outbox`: both outboxes and their dead-letter tables get the column (the old
/// rows read `{}`), both outboxes a validated check that refuses anything but an object, inside
/// the producer's transaction. A table of the outbox's shape made before it (no trigger yet) is
/// adopted by `migrate --table` without `options`, and gets it.
#[sqlx::test(migrations = false)]
async fn migration_8_adds_options_to_outboxes_in_use(pool: PgPool) {
    migrate_before(&pool, "20261128000008").await;
    sqlx::raw_sql(
        "SELECT jobrelay_create_outbox('billing_jobs');
         CREATE TABLE orders_jobs (LIKE pending_jobs INCLUDING ALL);
         INSERT INTO pending_jobs (queue, job_type) VALUES ('q', 'Old');
         INSERT INTO billing_jobs (queue, job_type) VALUES ('q', 'Old');",
    )
    .execute(&pool)
    .await
    .unwrap();

    jobrelay::db::MIGRATOR
        .run(&pool)
        .await
        .expect("migration 8 applies");

    let (columns, checks) = options_catalog(&pool).await;
    assert_eq!(
        columns,
        [
            "billing_jobs",
            "billing_jobs_dead",
            "pending_jobs",
            "pending_jobs_dead"
        ],
        "every outbox and dead-letter table; orders_jobs has no trigger yet"
    );
    assert_eq!(
        checks,
        [
            ("billing_jobs".to_owned(), true),
            ("pending_jobs".to_owned(), true)
        ]
    );
    for table in ["pending_jobs", "billing_jobs"] {
        let rows = options_of(&pool, table).await;
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].1, json!({}), "{table}: the old row reads {{}}");
        for bad in ["[]", "1", "\"retry\"", "null"] {
            let e = sqlx::query(&format!(
                "INSERT INTO {table} (queue, job_type, options) VALUES ('q', 'T', $1::jsonb)"
            ))
            .bind(bad)
            .execute(&pool)
            .await
            .expect_err(bad);
            let e = e.as_database_error().expect("a database error");
            assert_eq!(
                e.constraint(),
                Some("pending_jobs_options_check"),
                "{table} {bad}: {e}"
            );
        }
    }

    jobrelay::db::migrate(&pool, &TableName::parse("orders_jobs").unwrap())
        .await
        .expect("orders_jobs adopted");
    let (columns, checks) = options_catalog(&pool).await;
    assert!(
        columns.contains(&"orders_jobs".to_owned())
            && columns.contains(&"orders_jobs_dead".to_owned()),
        "{columns:?}"
    );
    assert!(
        checks.contains(&("orders_jobs".to_owned(), false)),
        "{checks:?}"
    );
}

/// `JobBuilder::option` writes the column; a job with options that is dead-lettered, by the
/// claim (its payload over `--max-job-size`) or after it (a row the relay cannot make a job
/// of), keeps them, and `dead-letter requeue` brings them back.
#[sqlx::test]
async fn options_are_written_and_kept_through_the_dead_letters(pool: PgPool) {
    let db = database_url_of(&pool).await;
    let ns = Namespace::new();
    let producer = Producer::new(ns.prefix.clone());
    let mut jobs = producer.pending();
    let options =
        json!({"retry": false, "tags": ["a", "b"], "backoff": {"type": "fixed", "delay": 200}});
    let with = |b: JobBuilder| {
        options
            .as_object()
            .unwrap()
            .iter()
            .fold(b, |b, (k, v)| b.option(k.clone(), v.clone()))
    };
    jobs.add(with(
        JobBuilder::new("q", "TooLarge").payload(vec![b'x'; 4096]),
    ))
    .unwrap();
    jobs.add(with(JobBuilder::new("q", "Nameless"))).unwrap();
    let mut tx = pool.begin().await.unwrap();
    jobs.create_pending(&mut tx).await.unwrap();
    tx.commit().await.unwrap();
    let written = options_of(&pool, "pending_jobs").await;
    assert_eq!(
        written.iter().map(|r| &r.1).collect::<Vec<_>>(),
        [&options, &options]
    );
    // The second row becomes one the relay cannot make a job of.
    sqlx::raw_sql(&format!(
        "ALTER TABLE pending_jobs DROP CONSTRAINT pending_jobs_job_type_check;
         UPDATE pending_jobs SET job_type = '' WHERE id = {}",
        written[1].0
    ))
    .execute(&pool)
    .await
    .unwrap();

    let env = [
        ("DATABASE_URL", db.as_str()),
        ("REDIS_URL", ns.url.as_str()),
        ("JOBRELAY_NAMESPACE", ns.prefix.as_str()),
    ];
    let args = ["--sweep", "--older-than", "0s", "--max-job-size", "1024"];
    let (code, out, err) = run_relay(&args, &env).await;
    assert_eq!(code, 1, "stdout: {out}\nstderr: {err}");
    assert_eq!(pending_count(&pool).await, 0);
    let dead = options_of(&pool, "pending_jobs_dead").await;
    assert_eq!(dead, written, "both dead letters keep their options");

    let (code, out, err) = run_relay(&["dead-letter", "requeue", "--all"], &env).await;
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    let back = options_of(&pool, "pending_jobs").await;
    assert_eq!(
        back.iter().map(|r| &r.1).collect::<Vec<_>>(),
        [&options, &options],
        "requeued with their options"
    );
}
