//! `jobrelay sweep`: a one-shot drain that reports its counts, `--older-than` leaving fresh rows
//! alone, and a custom `--table` set up by `jobrelay migrate` and drained by the sweep.

use std::time::Duration;

use crate::common::batch::*;
use crate::common::*;
use sqlx::PgPool;
use uuid::Uuid;

#[sqlx::test]
async fn sweep_older_than_leaves_fresh_rows_alone(pool: PgPool) {
    let ns = Namespace::new();
    let db = database_url_of(&pool).await;
    let env = relay_env(&db, &ns);
    insert_rows(&pool, 5, "fresh").await;

    let (code, out, err) = run_relay(&["--sweep", "--older-than", "1h"], &env).await;
    assert_eq!(code, 0, "{out}\n{err}");
    let report = sweep_report(&out);
    assert_eq!(report["claimed"], 0, "{out}");
    assert_eq!(report["queued"], 0, "{out}");
    assert_eq!(pending_count(&pool).await, 5);
    assert!(ns.keys().await.is_empty(), "nothing written");

    // An old row (created two hours ago) is taken; the fresh ones stay.
    let old = insert_job(
        &pool,
        &NewRow {
            queue: Some("old"),
            ..NewRow::default()
        },
    )
    .await;
    sqlx::query("UPDATE pending_jobs SET created_at = now() - interval '2 hours' WHERE uuid = $1")
        .bind(old.uuid)
        .execute(&pool)
        .await
        .unwrap();
    let (code, out, err) = run_relay(&["--sweep", "--older-than", "1h"], &env).await;
    assert_eq!(code, 0, "{out}\n{err}");
    let report = sweep_report(&out);
    assert_eq!((report["claimed"], report["queued"]), (1, 1), "{out}");
    assert_eq!(pending_count(&pool).await, 5);
    assert_eq!(ns.llen("queue:old").await, 1);
    assert_eq!(ns.llen("queue:fresh").await, 0);

    let (code, out, err) = run_relay(&["--sweep", "--older-than", "0s"], &env).await;
    assert_eq!(code, 0, "{out}\n{err}");
    let report = sweep_report(&out);
    assert_eq!((report["claimed"], report["queued"]), (5, 5), "{out}");
    assert_eq!(pending_count(&pool).await, 0);
    assert_eq!(ns.llen("queue:fresh").await, 5);
}

#[sqlx::test]
async fn sweep_drains_everything_and_reports_counts(pool: PgPool) {
    let ns = Namespace::new();
    let db = database_url_of(&pool).await;
    let (parent, pred) = (Uuid::new_v4(), Uuid::new_v4());
    let mut rows = Vec::new();
    for _ in 0..3 {
        rows.push(insert_job(&pool, &NewRow::default()).await);
    }
    rows.push(
        insert_job(
            &pool,
            &NewRow {
                run_at: Some(at(3600)),
                ..NewRow::default()
            },
        )
        .await,
    );
    rows.push(
        insert_job(
            &pool,
            &NewRow {
                parent: Some(parent),
                ..NewRow::default()
            },
        )
        .await,
    );
    rows.push(
        insert_job(
            &pool,
            &NewRow {
                pred: Some(pred),
                ..NewRow::default()
            },
        )
        .await,
    );
    // Two rows whose jobs were relayed before (their markers exist).
    let mut con = ns.con().await;
    for _ in 0..2 {
        let r = insert_job(
            &pool,
            &NewRow {
                queue: Some("dup"),
                ..NewRow::default()
            },
        )
        .await;
        let _: () = redis::cmd("SET")
            .arg(ns.key(&marker(r.uuid)))
            .arg("earlier")
            .query_async(&mut con)
            .await
            .unwrap();
    }
    // Small batches: the report sums them all.
    let (code, out, err) = run_relay(
        &["--sweep", "--older-than", "0s", "--batch-size", "3"],
        &relay_env(&db, &ns),
    )
    .await;
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(
        sweep_report(&out),
        counts(&[
            ("claimed", 8),
            ("queued", 3),
            ("scheduled", 1),
            ("children", 1),
            ("on_complete", 1),
            ("duplicates", 2),
            ("failed", 0),
            ("dead_lettered", 0),
        ]),
        "{out}"
    );
    assert_eq!(pending_count(&pool).await, 0);

    let queued = ns.list_jobs("queue:billing").await;
    assert_eq!(queued.len(), 3);
    for (job, row) in queued.iter().zip(&rows[..3]) {
        assert_job_is_row(job, row);
    }
    let scheduled = ns.scheduled().await;
    assert_eq!(scheduled.len(), 1);
    assert_job_is_row(&scheduled[0].0, &rows[3]);
    assert_job_is_row(
        &ns.list_jobs(&format!("jobs:{parent}:children")).await[0],
        &rows[4],
    );
    assert_job_is_row(
        &ns.list_jobs(&format!("jobs:{pred}:onComplete")).await[0],
        &rows[5],
    );
    assert_eq!(ns.llen("queue:dup").await, 0, "duplicates write nothing");
    assert_eq!(ns.marker_count().await, 8);
}

#[sqlx::test]
async fn custom_table_via_migrate_and_sweep(pool: PgPool) {
    let ns = Namespace::new();
    let db = database_url_of(&pool).await;
    let env = relay_env(&db, &ns);
    let (code, out, err) = run_relay(&["migrate", "--table", "billing_jobs"], &env).await;
    assert_eq!(code, 0, "{out}\n{err}");
    let dead: Option<String> = sqlx::query_scalar("SELECT to_regclass('billing_jobs_dead')::text")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        dead.as_deref(),
        Some("billing_jobs_dead"),
        "dead-letter table named after it"
    );

    // Its insert trigger notifies channel billing_jobs.
    let mut listener = sqlx::postgres::PgListener::connect_with(&pool)
        .await
        .unwrap();
    listener.listen("billing_jobs").await.unwrap();
    sqlx::query(
        "INSERT INTO billing_jobs (queue, job_type, payload)
         SELECT 'invoices', 'Bill', convert_to('bill-' || i, 'UTF8') FROM generate_series(1, 4) i",
    )
    .execute(&pool)
    .await
    .unwrap();
    let note = tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .expect("notified on billing_jobs")
        .unwrap();
    assert_eq!(note.channel(), "billing_jobs");
    drop(listener);
    let expected = all_uuids(&pool, "billing_jobs").await;
    insert_rows(&pool, 2, "other").await; // pending_jobs: not this relay's table

    let (code, out, err) = run_relay(
        &["--sweep", "--older-than", "0s", "--table", "billing_jobs"],
        &env,
    )
    .await;
    assert_eq!(code, 0, "{out}\n{err}");
    let report = sweep_report(&out);
    assert_eq!((report["claimed"], report["queued"]), (4, 4), "{out}");
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM billing_jobs")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(left, 0);
    assert_exactly_once(&queue_uuids(&ns, "queue:invoices").await, &expected);
    let payloads: Vec<Vec<u8>> = ns
        .list_jobs("queue:invoices")
        .await
        .into_iter()
        .map(|j| j.payload)
        .collect();
    assert_eq!(
        payloads,
        (1..=4)
            .map(|i| format!("bill-{i}").into_bytes())
            .collect::<Vec<_>>()
    );
    assert_eq!(pending_count(&pool).await, 2, "pending_jobs untouched");
    assert_eq!(ns.llen("queue:other").await, 0);
}

/// A row whose `created_at` has no age (`infinity`, year 10000: from before migration 6's
/// constraints) is taken by `--sweep --older-than` whatever the age asked for, and
/// dead-lettered: a cron-only deployment does not leave it pending forever.
#[sqlx::test]
async fn sweep_older_than_takes_rows_whose_created_at_has_no_age(pool: PgPool) {
    let ns = Namespace::new();
    let db = database_url_of(&pool).await;
    let env = relay_env(&db, &ns);
    sqlx::query("ALTER TABLE pending_jobs DROP CONSTRAINT pending_jobs_created_at_check")
        .execute(&pool)
        .await
        .unwrap();
    insert_rows(&pool, 2, "fresh").await;
    for created in ["infinity", "10000-01-01 00:00:00+00", "-infinity"] {
        sqlx::query(
            "INSERT INTO pending_jobs (queue, job_type, created_at)
             VALUES ('odd', 'Odd', $1::text::timestamptz)",
        )
        .bind(created)
        .execute(&pool)
        .await
        .unwrap();
    }
    let (code, out, err) = run_relay(&["--sweep", "--older-than", "1h"], &env).await;
    assert_eq!(code, 1, "rows were not delivered: {out}\n{err}");
    let report = sweep_report(&out);
    assert_eq!(report["claimed"], 3, "{out}");
    assert_eq!(report["dead_lettered"], 3, "{out}");
    let odd: i64 = sqlx::query_scalar("SELECT count(*) FROM pending_jobs_dead WHERE queue = 'odd'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(odd, 3);
    assert_eq!(pending_count(&pool).await, 2, "the fresh rows stay");
}
