//! Issue 4 acceptance: the producer library (docs/schema.md#producing-jobs) against real Postgres and Redis.
//!
//! - building jobs: defaults, every field, refusals naming the field;
//! - rows written in the caller's transaction: rolled back, no row and no job; committed, the
//!   relay delivers them; many jobs, one INSERT statement (proved by a statement-level trigger
//!   and by counting the Execute messages on the wire);
//! - the fast path: push and delete without a relay; with Redis down (error, rows kept, the
//!   relay delivers each job once); racing a running relay (each job once); per-job refusals
//!   (only those rows stay); a custom `--table`;
//! - the examples: `examples/things.rs` (its `run`) and `examples/plain_sql.sql` (via psql).

mod common;

#[allow(dead_code)]
#[path = "../examples/things.rs"]
mod things_example;

#[allow(dead_code)]
#[path = "../examples/producer_bench.rs"]
mod producer_bench;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use common::child::RelayChild;
use common::redis_server::RedisServer;
use common::*;
use jobrelay::producer::{JobBuilder, Producer, Stage};
use jobrelay::{Error, ErrorClass, Outcome, TableName};
use sqlx::{Connection, PgConnection, PgPool};
use uuid::Uuid;

const DEADLINE: Duration = Duration::from_secs(60);

fn producer(ns: &Namespace) -> Producer {
    Producer::new(ns.prefix.clone())
}

async fn count(pool: &PgPool, table: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
        .fetch_one(pool)
        .await
        .unwrap()
}

/// `jobrelay --sweep --older-than 0s` against the test database and `ns`; returns stdout.
async fn sweep(pool: &PgPool, ns: &Namespace, extra: &[&str]) -> (i32, String) {
    let db = database_url_of(pool).await;
    let mut args = vec!["--sweep", "--older-than", "0s"];
    args.extend_from_slice(extra);
    let (code, out, err) = run_relay(
        &args,
        &[
            ("DATABASE_URL", &db),
            ("REDIS_URL", &ns.url),
            ("JOBRELAY_NAMESPACE", &ns.prefix),
        ],
    )
    .await;
    (code, format!("stdout: {out}\nstderr: {err}"))
}

fn uuids_of(jobs: &[jobrelay::proto::v1::Job]) -> Vec<Uuid> {
    jobs.iter().map(|j| j.uuid.parse().unwrap()).collect()
}

fn field_of(e: Error) -> &'static str {
    match e {
        Error::InvalidJob { field, .. } => field,
        other => panic!("expected InvalidJob, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Building jobs (no services).

#[test]
fn builder_defaults_and_every_field() {
    let job = JobBuilder::new("default", "ProcessThing").build().unwrap();
    assert_eq!(job.uuid.get_version_num(), 4, "generated uuids are v4");
    assert!(job.payload.is_empty());
    assert_eq!(
        (
            job.parent_uuid,
            job.predecessor_uuid,
            job.dead_parent,
            job.run_at
        ),
        (None, None, false, None)
    );
    assert!(job.headers.is_empty());

    let uuid = Uuid::new_v4();
    let parent = Uuid::new_v4();
    let pred = Uuid::new_v4();
    let at = DateTime::from_timestamp(2_000_000_000, 123_456_789).unwrap();
    let job = JobBuilder::new("q.1:x-y_z", "Resize")
        .uuid(uuid)
        .json(&serde_json::json!({ "id": 7, "name": "x" }))
        .parent(parent)
        .predecessor(pred)
        .dead_parent(true)
        .run_at(at)
        .header("tenant", "acme")
        .headers([("a", "1"), ("b", "2")])
        .build()
        .unwrap();
    assert_eq!(job.uuid, uuid);
    assert_eq!(job.queue, "q.1:x-y_z");
    assert_eq!(job.job_type, "Resize");
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&job.payload).unwrap(),
        serde_json::json!({ "id": 7, "name": "x" })
    );
    assert_eq!(job.parent_uuid, Some(parent));
    assert_eq!(job.predecessor_uuid, Some(pred));
    assert!(job.dead_parent);
    // Kept to the microsecond: what Postgres stores, so both paths marshal the same bytes.
    assert_eq!(
        job.run_at,
        Some(DateTime::from_timestamp(2_000_000_000, 123_456_000).unwrap())
    );
    assert_eq!(job.headers.len(), 3);

    let raw = JobBuilder::new("default", "Raw")
        .payload(vec![0u8, 159, 255])
        .build()
        .unwrap();
    assert_eq!(raw.payload, vec![0u8, 159, 255]);
}

#[test]
fn a_delay_becomes_run_at() {
    let before = Utc::now();
    let job = JobBuilder::new("default", "Later")
        .delay(Duration::from_secs(90))
        .build()
        .unwrap();
    let after = Utc::now();
    let run_at = job.run_at.unwrap();
    assert!(run_at >= before + chrono::TimeDelta::seconds(90) - chrono::TimeDelta::microseconds(1));
    assert!(run_at <= after + chrono::TimeDelta::seconds(90));
    let now = JobBuilder::new("default", "Now")
        .delay(Duration::ZERO)
        .build()
        .unwrap();
    assert_eq!(now.run_at, None, "a zero delay means no run_at");
}

#[test]
fn invalid_input_is_refused_when_built_naming_the_field() {
    let own = Uuid::new_v4();
    let mut bad_map = std::collections::HashMap::new();
    bad_map.insert((1, 2), 3);
    let cases: Vec<(&str, JobBuilder)> = vec![
        ("queue", JobBuilder::new("", "T")),
        ("queue", JobBuilder::new("has space", "T")),
        ("queue", JobBuilder::new("q".repeat(129), "T")),
        ("job_type", JobBuilder::new("q", "")),
        ("job_type", JobBuilder::new("q", "x".repeat(257))),
        ("job_type", JobBuilder::new("q", "nul\0inside")),
        ("uuid", JobBuilder::new("q", "T").uuid(Uuid::nil())),
        ("payload", JobBuilder::new("q", "T").json(&bad_map)),
        ("parent_uuid", JobBuilder::new("q", "T").parent(Uuid::nil())),
        (
            "parent_uuid",
            JobBuilder::new("q", "T").uuid(own).parent(own),
        ),
        (
            "predecessor_uuid",
            JobBuilder::new("q", "T").uuid(own).predecessor(own),
        ),
        (
            "run_at",
            JobBuilder::new("q", "T").run_at("+10000-01-01T00:00:00Z".parse().unwrap()),
        ),
        ("run_at", JobBuilder::new("q", "T").delay(Duration::MAX)),
        ("headers", JobBuilder::new("q", "T").header("", "x")),
        ("headers", JobBuilder::new("q", "T").header("k", "v\0")),
    ];
    for (field, builder) in cases {
        let shown = format!("{builder:?}");
        let e = builder.build().expect_err(&shown);
        assert_eq!(e.class(), ErrorClass::Permanent);
        assert!(e.to_string().contains(field), "{e}");
        assert_eq!(field_of(e), field, "{shown}");
    }
}

#[test]
fn add_refuses_a_uuid_twice_and_add_all_is_all_or_nothing() {
    let mut jobs = Producer::default().pending();
    let uuid = jobs.add(JobBuilder::new("default", "A")).unwrap();
    assert_eq!(
        field_of(
            jobs.add(JobBuilder::new("default", "B").uuid(uuid))
                .unwrap_err()
        ),
        "uuid"
    );
    let e = jobs
        .add_all(vec![
            JobBuilder::new("default", "C"),
            JobBuilder::new("bad queue", "D"),
        ])
        .unwrap_err();
    assert_eq!(field_of(e), "queue");
    assert_eq!(jobs.len(), 1, "a refused add_all adds nothing");
    let twice = Uuid::new_v4();
    let e = jobs
        .add_all(vec![
            JobBuilder::new("default", "E").uuid(twice),
            JobBuilder::new("default", "F").uuid(twice),
        ])
        .unwrap_err();
    assert_eq!(field_of(e), "uuid");
    assert_eq!(jobs.len(), 1);
    // A hand-made Job goes through the same checks.
    let mut job = JobBuilder::new("default", "G").build().unwrap();
    job.queue = "no spaces".into();
    assert_eq!(field_of(jobs.add(job).unwrap_err()), "queue");
}

#[cfg(feature = "otel")]
#[test]
fn traceparent_comes_from_the_current_span() {
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
    };
    let sc = SpanContext::new(
        TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
        SpanId::from_hex("00f067aa0ba902b7").unwrap(),
        TraceFlags::SAMPLED,
        true,
        TraceState::from_key_value([("vendor", "abc")]).unwrap(),
    );
    let cx = opentelemetry::Context::new().with_remote_span_context(sc);

    let outside = JobBuilder::new("default", "T").build().unwrap();
    assert!(
        !outside.headers.contains_key("traceparent"),
        "no span, no header"
    );

    let explicit = JobBuilder::new("default", "T")
        .trace_context(&cx)
        .build()
        .unwrap();
    {
        let _attached = cx.clone().attach();
        let inside = JobBuilder::new("default", "T").build().unwrap();
        for job in [&inside, &explicit] {
            assert_eq!(
                job.headers["traceparent"],
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
            );
            assert_eq!(job.headers["tracestate"], "vendor=abc");
        }
        let own = JobBuilder::new("default", "T")
            .header("traceparent", "mine")
            .build()
            .unwrap();
        assert_eq!(
            own.headers["traceparent"], "mine",
            "an explicit header wins"
        );
    }
    let after = JobBuilder::new("default", "T").build().unwrap();
    assert!(!after.headers.contains_key("traceparent"));
}

// ---------------------------------------------------------------------------------------------
// Rows in the caller's transaction.

/// Acceptance 1a: a rolled-back transaction leaves no row and no job, and the fast path pushes
/// nothing for it.
#[sqlx::test]
async fn rolled_back_transaction_leaves_no_row_and_no_job(pool: PgPool) {
    let ns = Namespace::new();
    let producer = producer(&ns);
    let mut jobs = producer.pending();
    let mut tx = pool.begin().await.unwrap();
    jobs.add_all((0..3).map(|i| JobBuilder::new("default", "Doomed").json(&i)))
        .unwrap();
    let rows = jobs.create_pending(&mut tx).await.unwrap();
    assert_eq!(rows.len(), 3);
    // Inside the transaction the rows exist; outside it they are invisible.
    let inside: i64 = sqlx::query_scalar("SELECT count(*) FROM pending_jobs")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    assert_eq!(inside, 3);
    assert_eq!(pending_count(&pool).await, 0, "invisible until commit");
    tx.rollback().await.unwrap();
    assert_eq!(pending_count(&pool).await, 0);

    // Misuse: the fast path after a rollback finds no row to claim and pushes nothing.
    let mut con = ns.con().await;
    let report = jobs.push_and_delete(&mut con, &pool).await.unwrap();
    assert!(report.pushed.is_empty());
    assert_eq!(report.skipped.len(), 3);

    let (code, out) = sweep(&pool, &ns, &[]).await;
    assert_eq!(code, 0, "{out}");
    assert!(
        ns.keys().await.is_empty(),
        "no job in redis: {:?}",
        ns.keys().await
    );
}

/// Acceptance 1b: committed rows reach Redis through the relay (`--sweep`), field for field.
#[sqlx::test]
async fn committed_jobs_reach_redis_through_the_relay(pool: PgPool) {
    let ns = Namespace::new();
    let mut jobs = producer(&ns).pending();
    let pred = Uuid::new_v4();
    let mut tx = pool.begin().await.unwrap();
    let now_uuid = jobs
        .add(
            JobBuilder::new("default", "ProcessThing")
                .json(&serde_json::json!({ "id": 1 }))
                .header("tenant", "acme"),
        )
        .unwrap();
    let later_uuid = jobs
        .add(JobBuilder::new("default", "Later").delay(Duration::from_secs(3600)))
        .unwrap();
    let after_uuid = jobs
        .add(JobBuilder::new("default", "After").predecessor(pred))
        .unwrap();
    jobs.create_pending(&mut tx).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(pending_count(&pool).await, 3);

    let (code, out) = sweep(&pool, &ns, &[]).await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(pending_count(&pool).await, 0);

    let queued = ns.list_jobs("queue:default").await;
    assert_eq!(uuids_of(&queued), vec![now_uuid]);
    let job = &jobs.jobs()[0];
    assert_eq!(queued[0].job_type, "ProcessThing");
    assert_eq!(queued[0].payload, br#"{"id":1}"#);
    assert_eq!(
        queued[0].headers.get("tenant").map(String::as_str),
        Some("acme")
    );
    let created = queued[0].created_at.unwrap();
    assert_eq!(
        (created.seconds, created.nanos),
        (
            job.created_at.timestamp(),
            job.created_at.timestamp_subsec_nanos() as i32
        ),
        "create_pending took the row's created_at"
    );

    let scheduled = ns.scheduled().await;
    assert_eq!(scheduled.len(), 1);
    assert_eq!(scheduled[0].0.uuid, later_uuid.to_string());
    let run_at = jobs.jobs()[1].run_at.unwrap();
    assert!((scheduled[0].1 - run_at.timestamp_micros() as f64 / 1e6).abs() < 1e-3);

    let waiting = ns.list_jobs(&format!("jobs:{pred}:onComplete")).await;
    assert_eq!(uuids_of(&waiting), vec![after_uuid]);

    // The fast path afterwards has nothing left to do.
    let mut con = ns.con().await;
    let report = jobs.push_and_delete(&mut con, &pool).await.unwrap();
    assert!(report.pushed.is_empty() && report.skipped.len() == 3);
}

/// Acceptance 4: 10,000 jobs in one transaction are written with ONE statement. Two proofs:
/// a statement-level trigger fires once per INSERT statement on the table, and a proxy on the
/// wire counts the Execute (extended protocol) and Query (simple protocol) messages
/// `create_pending` sends.
#[sqlx::test]
async fn ten_thousand_jobs_are_written_with_one_statement(pool: PgPool) {
    sqlx::raw_sql(
        "CREATE TABLE insert_statements (n int NOT NULL);
         INSERT INTO insert_statements VALUES (0);
         CREATE FUNCTION count_insert_statement() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN UPDATE insert_statements SET n = n + 1; RETURN NULL; END $$;
         CREATE TRIGGER count_insert_statements AFTER INSERT ON pending_jobs
             FOR EACH STATEMENT EXECUTE FUNCTION count_insert_statement();",
    )
    .execute(&pool)
    .await
    .unwrap();

    let proxy = WireCounter::start().await;
    let db: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&pool)
        .await
        .unwrap();
    let mut conn = PgConnection::connect(&proxy.url(&db)).await.unwrap();

    let mut jobs = Producer::default().pending();
    let uuids = jobs
        .add_all((0..10_000).map(|i| {
            JobBuilder::new("bulk", "Bulk")
                .json(&serde_json::json!({ "i": i }))
                .header("n", i.to_string())
        }))
        .unwrap();
    let mut tx = conn.begin().await.unwrap();
    proxy.counting.store(true, Ordering::SeqCst);
    let rows = jobs.create_pending(&mut tx).await.unwrap();
    proxy.counting.store(false, Ordering::SeqCst);
    tx.commit().await.unwrap();

    let executes = proxy.executes.load(Ordering::SeqCst);
    let queries = proxy.queries.load(Ordering::SeqCst);
    assert_eq!(
        (executes, queries),
        (1, 0),
        "create_pending sent {executes} Execute and {queries} Query messages"
    );
    let statements: i32 = sqlx::query_scalar("SELECT n FROM insert_statements")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(statements, 1, "INSERT statements on pending_jobs");
    assert_eq!(pending_count(&pool).await, 10_000);

    // Rows come back in the order added, which is also id order (the relay's claim order).
    assert_eq!(rows.iter().map(|r| r.uuid).collect::<Vec<_>>(), uuids);
    assert!(rows.windows(2).all(|w| w[0].id < w[1].id));
    let sample: (String, Vec<u8>, String) =
        sqlx::query_as("SELECT queue, payload, headers->>'n' FROM pending_jobs WHERE uuid = $1")
            .bind(uuids[4242])
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        sample,
        ("bulk".into(), br#"{"i":4242}"#.to_vec(), "4242".into())
    );

    // Nothing left to write: a second call sends nothing.
    proxy.counting.store(true, Ordering::SeqCst);
    assert!(jobs.create_pending(&mut conn).await.unwrap().is_empty());
    assert_eq!(proxy.executes.load(Ordering::SeqCst), 1);
}

/// `create_pending` writes only the jobs without a row; ids follow the order of `add`.
#[sqlx::test]
async fn create_pending_writes_each_job_once(pool: PgPool) {
    let mut jobs = Producer::default().pending();
    let a = jobs.add(JobBuilder::new("default", "A")).unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let first = jobs.create_pending(&mut conn).await.unwrap();
    let b = jobs.add(JobBuilder::new("default", "B")).unwrap();
    let second = jobs.create_pending(&mut conn).await.unwrap();
    assert_eq!(first.iter().map(|r| r.uuid).collect::<Vec<_>>(), vec![a]);
    assert_eq!(second.iter().map(|r| r.uuid).collect::<Vec<_>>(), vec![b]);
    assert!(first[0].id < second[0].id);
    assert_eq!(pending_count(&pool).await, 2);
    assert_eq!(jobs.rows().len(), 2);
}

/// Bad rows never get in: a CHECK violation fails `create_pending` (and so the caller's
/// transaction) with Postgres's error, for a Job whose checks were bypassed.
#[sqlx::test]
async fn the_table_refuses_what_the_builder_would(pool: PgPool) {
    // A table with a stricter CHECK than the builder's: the insert error comes back typed.
    sqlx::query("ALTER TABLE pending_jobs ADD CONSTRAINT no_x CHECK (job_type <> 'X')")
        .execute(&pool)
        .await
        .unwrap();
    let mut jobs = Producer::default().pending();
    jobs.add(JobBuilder::new("default", "X")).unwrap();
    let mut tx = pool.begin().await.unwrap();
    let e = jobs.create_pending(&mut tx).await.unwrap_err();
    assert!(matches!(e, Error::Database(_)), "{e:?}");
    assert!(e.to_string().contains("no_x"), "{e}");
    drop(tx);
    assert!(jobs.rows().is_empty(), "a failed insert records no row");
    assert_eq!(pending_count(&pool).await, 0);
}

// ---------------------------------------------------------------------------------------------
// The fast path.

/// Acceptance 1c: with no relay running, the fast path delivers committed jobs and deletes their
/// rows; the bytes in Redis are those the relay would write (the row's created_at).
#[sqlx::test]
async fn fast_path_pushes_and_deletes_without_a_relay(pool: PgPool) {
    let ns = Namespace::new();
    let mut jobs = producer(&ns).pending();
    let parent = Uuid::new_v4();
    let mut tx = pool.begin().await.unwrap();
    let q = jobs
        .add(JobBuilder::new("default", "Now").payload(b"p".to_vec()))
        .unwrap();
    let s = jobs
        .add(JobBuilder::new("default", "Later").delay(Duration::from_secs(600)))
        .unwrap();
    let c = jobs
        .add(JobBuilder::new("default", "Child").parent(parent))
        .unwrap();
    let d = jobs
        .add(
            JobBuilder::new("other", "Orphan")
                .parent(parent)
                .dead_parent(true),
        )
        .unwrap();
    jobs.create_pending(&mut tx).await.unwrap();
    tx.commit().await.unwrap();
    let created: Vec<(Uuid, DateTime<Utc>)> =
        sqlx::query_as("SELECT uuid, created_at FROM pending_jobs ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();

    let mut con = ns.con().await;
    let report = jobs.push_and_delete(&mut con, &pool).await.unwrap();
    assert_eq!(
        report.pushed,
        vec![
            (q, Outcome::Queued),
            (s, Outcome::Scheduled),
            (c, Outcome::Children),
            (d, Outcome::Queued)
        ]
    );
    assert!(report.refused.is_empty() && report.skipped.is_empty());
    assert_eq!(report.deleted, 4);
    assert_eq!(pending_count(&pool).await, 0);

    assert_eq!(uuids_of(&ns.list_jobs("queue:default").await), vec![q]);
    assert_eq!(uuids_of(&ns.list_jobs("queue:other").await), vec![d]);
    assert_eq!(ns.scheduled().await.len(), 1);
    assert_eq!(
        uuids_of(&ns.list_jobs(&format!("jobs:{parent}:children")).await),
        vec![c]
    );
    assert_eq!(ns.marker_count().await, 4);
    for (uuid, created_at) in created {
        let raw: Vec<u8> = redis::cmd("GET")
            .arg(ns.key(&format!("jobs:{uuid}")))
            .query_async(&mut con)
            .await
            .unwrap();
        let job = decode(&raw);
        let ts = job.created_at.unwrap();
        assert_eq!(ts.seconds, created_at.timestamp());
        assert_eq!(ts.nanos as u32, created_at.timestamp_subsec_nanos());
    }

    // Again: nothing to do, nothing pushed twice.
    let report = jobs.push_and_delete(&mut con, &pool).await.unwrap();
    assert!(report.pushed.is_empty() && report.deleted == 0);
    assert_eq!(ns.llen("queue:default").await, 1);
}

/// Acceptance 2: Redis down during the fast path: an error that says the rows stay, the rows
/// stay, and a relay started later delivers each job exactly once.
#[sqlx::test]
async fn fast_path_with_redis_down_leaves_rows_for_the_relay(pool: PgPool) {
    let ns = Namespace::new();
    let mut server = RedisServer::start();
    let mut down = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    server.kill();

    let producer = producer(&ns).push_timeout(Duration::from_secs(2));
    let mut jobs = producer.pending();
    let mut tx = pool.begin().await.unwrap();
    let uuids = jobs
        .add_all((0..50).map(|i| JobBuilder::new("default", "Survive").json(&i)))
        .unwrap();
    jobs.create_pending(&mut tx).await.unwrap();
    tx.commit().await.unwrap();

    let e = jobs.push_and_delete(&mut down, &pool).await.unwrap_err();
    assert_eq!(e.stage, Stage::Push);
    assert_eq!(e.class(), ErrorClass::Transient);
    assert_eq!(e.rows_left.len(), 50);
    let msg = e.to_string();
    assert!(
        msg.contains("50 pending row(s) left for the relay"),
        "{msg}"
    );
    assert_eq!(pending_count(&pool).await, 50, "the rows stay");

    // The separate-steps API fails the same way, and deletes nothing it did not push.
    let e = jobs.push(&mut down).await.unwrap_err();
    assert_eq!(e.stage, Stage::Push);
    assert_eq!(jobs.delete_pending(&pool).await.unwrap(), 0);
    assert_eq!(pending_count(&pool).await, 50);

    let (code, out) = sweep(&pool, &ns, &[]).await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(pending_count(&pool).await, 0);
    let delivered = uuids_of(&ns.list_jobs("queue:default").await);
    assert_eq!(delivered, uuids, "each job once, in order");

    // A fast path retried now finds nothing pending and pushes nothing.
    let mut up = ns.con().await;
    let report = jobs.push_and_delete(&mut up, &pool).await.unwrap();
    assert!(report.pushed.is_empty());
    assert_eq!(report.skipped.len(), 50);
    assert_eq!(ns.llen("queue:default").await, 50);
}

/// Acceptance 3: the fast path racing a running relay daemon (woken by NOTIFY at each commit,
/// polling every 10 ms) on the same rows: each job exactly once in Redis. Even rounds use
/// `push_and_delete` (which skips the rows the relay holds), odd rounds `push` then
/// `delete_pending` (which push regardless, so the dedup marker settles the race).
#[sqlx::test]
async fn fast_path_racing_a_running_relay_delivers_each_job_once(pool: PgPool) {
    const ROUNDS: usize = 20;
    const PER_ROUND: usize = 200;
    let ns = Namespace::new();
    let db = database_url_of(&pool).await;
    let mut relay = RelayChild::start(
        &db,
        &ns.url,
        &ns.prefix,
        &[
            "--poll-interval",
            "10ms",
            "--workers",
            "2",
            "--batch-size",
            "50",
        ],
    );
    let producer = producer(&ns);
    let mut con = ns.con().await;
    let mut all = Vec::with_capacity(ROUNDS * PER_ROUND);
    let (mut by_fast_path, mut duplicates, mut skipped) = (0, 0, 0);
    for round in 0..ROUNDS {
        let mut jobs = producer.pending();
        let mut tx = pool.begin().await.unwrap();
        all.extend(
            jobs.add_all(
                (0..PER_ROUND)
                    .map(|i| JobBuilder::new("race", "Race").json(&serde_json::json!([round, i]))),
            )
            .unwrap(),
        );
        jobs.create_pending(&mut tx).await.unwrap();
        tx.commit().await.unwrap();
        // Odd rounds use the separate steps, which push whatever the relay is doing: there the
        // dedup marker is what keeps each job single.
        let report = if round % 2 == 0 {
            jobs.push_and_delete(&mut con, &pool).await.unwrap()
        } else {
            let report = jobs.push(&mut con).await.unwrap();
            jobs.delete_pending(&pool).await.unwrap();
            report
        };
        assert!(report.refused.is_empty(), "{:?}", report.refused);
        by_fast_path += report.count(Outcome::Queued);
        duplicates += report.count(Outcome::Duplicate);
        skipped += report.skipped.len();
        assert_eq!(report.pushed.len() + report.skipped.len(), PER_ROUND);
    }
    let total = ROUNDS * PER_ROUND;
    wait_until("every row relayed", DEADLINE, || async {
        pending_count(&pool).await == 0
    })
    .await;
    wait_until("every job in the queue", DEADLINE, || async {
        ns.llen("queue:race").await >= total
    })
    .await;
    relay.signal("TERM");
    assert_eq!(relay.wait(Duration::from_secs(30)).await, Some(0));

    let delivered = uuids_of(&ns.list_jobs("queue:race").await);
    assert_eq!(delivered.len(), total, "no job twice");
    let unique: HashSet<Uuid> = delivered.iter().copied().collect();
    assert_eq!(unique, all.iter().copied().collect::<HashSet<_>>());
    assert_eq!(ns.marker_count().await, total);
    println!(
        "race: {by_fast_path} jobs queued by the fast path ({duplicates} duplicates), \
         {skipped} left to the relay"
    );
}

/// A job the script refuses keeps its row (for the relay); the others are pushed and deleted.
#[sqlx::test]
async fn refused_jobs_keep_their_rows_and_the_others_are_deleted(pool: PgPool) {
    let ns = Namespace::new();
    let mut con = ns.con().await;
    let _: () = redis::cmd("SET")
        .arg(ns.key("queue:broken"))
        .arg("a string, not a list")
        .query_async(&mut con)
        .await
        .unwrap();
    let mut jobs = producer(&ns).pending();
    let mut tx = pool.begin().await.unwrap();
    let a = jobs.add(JobBuilder::new("default", "A")).unwrap();
    let b = jobs.add(JobBuilder::new("broken", "B")).unwrap();
    let c = jobs.add(JobBuilder::new("default", "C")).unwrap();
    jobs.create_pending(&mut tx).await.unwrap();
    tx.commit().await.unwrap();

    let report = jobs.push_and_delete(&mut con, &pool).await.unwrap();
    assert_eq!(
        report.pushed,
        vec![(a, Outcome::Queued), (c, Outcome::Queued)]
    );
    assert_eq!(report.refused.len(), 1);
    let (uuid, e) = &report.refused[0];
    assert_eq!(*uuid, b);
    assert_eq!(e.class(), ErrorClass::PerJob);
    assert!(e.to_string().contains("WRONGTYPE"), "{e}");
    assert_eq!(report.deleted, 2);
    let left: Vec<(Uuid, i32)> = sqlx::query_as("SELECT uuid, attempts FROM pending_jobs")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(left, vec![(b, 0)], "only the refused row stays, untouched");
    assert_eq!(
        jobs.rows().iter().map(|r| r.uuid).collect::<Vec<_>>(),
        vec![b]
    );

    // The relay takes over: it counts the refusal against the row ...
    let (_, out) = sweep(&pool, &ns, &[]).await;
    let attempts: i32 = sqlx::query_scalar("SELECT attempts FROM pending_jobs")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(attempts, 1, "{out}");
    // ... and delivers it once the key is fixed.
    let _: () = redis::cmd("DEL")
        .arg(ns.key("queue:broken"))
        .query_async(&mut con)
        .await
        .unwrap();
    sqlx::query("UPDATE pending_jobs SET available_at = now()")
        .execute(&pool)
        .await
        .unwrap();
    let (code, out) = sweep(&pool, &ns, &[]).await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(uuids_of(&ns.list_jobs("queue:broken").await), vec![b]);
    assert_eq!(pending_count(&pool).await, 0);
}

/// The pattern's separate steps: `push`, then `delete_pending` deletes only what was pushed.
#[sqlx::test]
async fn push_then_delete_pending_deletes_only_pushed_rows(pool: PgPool) {
    let ns = Namespace::new();
    let mut con = ns.con().await;
    let _: () = redis::cmd("SET")
        .arg(ns.key("queue:broken"))
        .arg("x")
        .query_async(&mut con)
        .await
        .unwrap();
    let mut jobs = producer(&ns).pending();
    let mut tx = pool.begin().await.unwrap();
    jobs.add(JobBuilder::new("default", "A")).unwrap();
    let b = jobs.add(JobBuilder::new("broken", "B")).unwrap();
    jobs.create_pending(&mut tx).await.unwrap();
    tx.commit().await.unwrap();

    assert_eq!(
        jobs.delete_pending(&pool).await.unwrap(),
        0,
        "nothing pushed yet"
    );
    let report = jobs.push(&mut con).await.unwrap();
    assert_eq!(report.pushed.len(), 1);
    assert_eq!(report.refused.len(), 1);
    let mut conn = pool.acquire().await.unwrap();
    assert_eq!(jobs.delete_pending(&mut *conn).await.unwrap(), 1);
    let left: Vec<Uuid> = sqlx::query_scalar("SELECT uuid FROM pending_jobs")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(left, vec![b]);
    assert_eq!(ns.llen("queue:default").await, 1);
    // A second push retries only the refused job.
    let report = jobs.push(&mut con).await.unwrap();
    assert!(report.pushed.is_empty() && report.refused.len() == 1);
}

/// `--table`: the producer writes to another outbox, and the relay and the fast path work on it.
#[sqlx::test]
async fn a_custom_table(pool: PgPool) {
    let ns = Namespace::new();
    sqlx::query("SELECT jobrelay_create_outbox('billing_jobs')")
        .execute(&pool)
        .await
        .unwrap();
    let producer = producer(&ns).table(TableName::parse("billing_jobs").unwrap());
    let mut con = ns.con().await;

    let mut fast = producer.pending();
    let mut tx = pool.begin().await.unwrap();
    let a = fast.add(JobBuilder::new("billing", "Invoice")).unwrap();
    fast.create_pending(&mut tx).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(count(&pool, "billing_jobs").await, 1);
    assert_eq!(pending_count(&pool).await, 0);
    let report = fast.push_and_delete(&mut con, &pool).await.unwrap();
    assert_eq!(report.deleted, 1);
    assert_eq!(count(&pool, "billing_jobs").await, 0);

    let mut slow = producer.pending();
    let mut tx = pool.begin().await.unwrap();
    let b = slow.add(JobBuilder::new("billing", "Refund")).unwrap();
    slow.create_pending(&mut tx).await.unwrap();
    tx.commit().await.unwrap();
    let (code, out) = sweep(&pool, &ns, &["--table", "billing_jobs"]).await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(count(&pool, "billing_jobs").await, 0);
    assert_eq!(uuids_of(&ns.list_jobs("queue:billing").await), vec![a, b]);
}

// ---------------------------------------------------------------------------------------------
// The examples.

/// `examples/things.rs`: the thing and its job commit together, and the fast path delivers.
#[sqlx::test]
async fn example_things_runs(pool: PgPool) {
    let ns = Namespace::new();
    let db = database_url_of(&pool).await;
    let created = things_example::run(&db, &ns.url, &ns.prefix).await.unwrap();
    let report = created.fast_path.unwrap();
    assert_eq!(report.pushed, vec![(created.job_uuid, Outcome::Queued)]);
    let name: String = sqlx::query_scalar("SELECT name FROM things WHERE id = $1")
        .bind(created.thing_id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(name, "a thing");
    assert_eq!(pending_count(&pool).await, 0);
    let queued = ns.list_jobs("queue:default").await;
    assert_eq!(uuids_of(&queued), vec![created.job_uuid]);
    assert_eq!(queued[0].job_type, "ProcessThing");
    let payload: serde_json::Value = serde_json::from_slice(&queued[0].payload).unwrap();
    assert_eq!(payload, serde_json::json!({ "thing_id": created.thing_id }));

    // With Redis unreachable the example still commits, and the relay delivers.
    let nowhere = format!("redis://127.0.0.1:{}", free_port());
    let created = things_example::run(&db, &nowhere, &ns.prefix)
        .await
        .unwrap();
    assert!(created.fast_path.is_err());
    assert_eq!(pending_count(&pool).await, 1);
    let (code, out) = sweep(&pool, &ns, &[]).await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(ns.llen("queue:default").await, 2);
}

/// `examples/plain_sql.sql` through psql: by default it cleans up after itself; with
/// `-v keep=1` its committed jobs stay, and the relay delivers them.
#[sqlx::test]
async fn example_plain_sql_runs(pool: PgPool) {
    let ns = Namespace::new();
    let db = database_url_of(&pool).await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/plain_sql.sql");
    let psql = |extra: &'static [&'static str]| {
        let db = db.clone();
        async move {
            let out = tokio::process::Command::new("psql")
                .arg(&db)
                .args(["-X", "-v", "ON_ERROR_STOP=1"])
                .args(extra)
                .args(["-f", script])
                .output()
                .await
                .expect("psql is installed (apt-get install postgresql-client)");
            let text = format!(
                "{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(out.status.success(), "psql failed: {text}");
            text
        }
    };
    let text = psql(&[]).await;
    assert!(text.contains("refused as expected"), "{text}");
    assert!(text.contains("cleaned up"), "{text}");
    assert_eq!(pending_count(&pool).await, 0, "{text}");

    let text = psql(&["-v", "keep=1"]).await;
    assert_eq!(pending_count(&pool).await, 4, "{text}");
    let rows: Vec<(String, serde_json::Value)> =
        sqlx::query_as("SELECT job_type, headers FROM pending_jobs ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    let types: Vec<&str> = rows.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(
        types,
        ["ProcessThing", "SendWelcomeMail", "SendReminder", "Archive"]
    );
    let (code, out) = sweep(&pool, &ns, &[]).await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(pending_count(&pool).await, 0);
    let queued = ns.list_jobs("queue:default").await;
    let queued_types: Vec<&str> = queued.iter().map(|j| j.job_type.as_str()).collect();
    assert_eq!(queued_types, ["ProcessThing", "SendWelcomeMail"]);
    let payload: serde_json::Value = serde_json::from_slice(&queued[0].payload).unwrap();
    assert!(payload["thing_id"].is_i64(), "{payload}");
    assert_eq!(ns.scheduled().await.len(), 1, "SendReminder waits a day");
    let headers: BTreeMap<_, _> = queued[1].headers.clone().into_iter().collect();
    assert!(headers["traceparent"].starts_with("00-"));
    assert_eq!(
        ns.list_jobs(&format!("jobs:{}:onComplete", queued[1].uuid))
            .await
            .len(),
        1
    );
}

/// `examples/producer_bench.rs` with tiny sizes: it reports rates and drops its database.
#[tokio::test]
async fn example_producer_bench_runs_and_drops_its_database() {
    let admin = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let sizes = producer_bench::Sizes {
        single_tx: 5,
        batch_tx: 2,
        baseline_tx: 1,
    };
    let report = producer_bench::run(&admin, sizes).await.unwrap();
    for key in [
        "single_job_tx",
        "thousand_job_tx",
        "row_by_row_baseline_thousand_job_tx",
    ] {
        assert!(
            report[key]["jobs_per_second"].as_f64().unwrap() > 0.0,
            "{report}"
        );
    }
    let db = report["database"]
        .as_str()
        .unwrap()
        .split(' ')
        .next()
        .unwrap();
    assert!(db.starts_with("jobrelay_bench_producer_"), "{report}");
    let mut conn = PgConnection::connect(&admin).await.unwrap();
    let left: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(db)
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert!(!left, "{db} was dropped");
}

// ---------------------------------------------------------------------------------------------
// A Postgres wire proxy that counts what a client sends.

/// Forwards 127.0.0.1:<port> to the shared Postgres, counting the frontend's Execute ('E') and
/// simple Query ('Q') messages while `counting` is set. Connections through it disable TLS.
struct WireCounter {
    port: u16,
    counting: Arc<AtomicBool>,
    executes: Arc<AtomicUsize>,
    queries: Arc<AtomicUsize>,
}

impl WireCounter {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let upstream = {
            let url = url::Url::parse(&std::env::var("DATABASE_URL").unwrap()).unwrap();
            format!(
                "{}:{}",
                url.host_str().unwrap_or("127.0.0.1"),
                url.port().unwrap_or(5432)
            )
        };
        let counter = WireCounter {
            port,
            counting: Arc::default(),
            executes: Arc::default(),
            queries: Arc::default(),
        };
        let (counting, executes, queries) = (
            counter.counting.clone(),
            counter.executes.clone(),
            counter.queries.clone(),
        );
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = tokio::net::TcpStream::connect(&upstream).await.unwrap();
                let (counting, executes, queries) =
                    (counting.clone(), executes.clone(), queries.clone());
                tokio::spawn(async move {
                    let (mut client_rx, mut client_tx) = client.into_split();
                    let (mut server_rx, mut server_tx) = server.into_split();
                    tokio::spawn(async move {
                        let _ = tokio::io::copy(&mut server_rx, &mut client_tx).await;
                    });
                    let _ = forward_frontend(
                        &mut client_rx,
                        &mut server_tx,
                        &counting,
                        &executes,
                        &queries,
                    )
                    .await;
                });
            }
        });
        counter
    }

    /// A URL for database `db` through the proxy.
    fn url(&self, db: &str) -> String {
        let mut url = url::Url::parse(&std::env::var("DATABASE_URL").unwrap()).unwrap();
        url.set_host(Some("127.0.0.1")).unwrap();
        url.set_port(Some(self.port)).unwrap();
        url.set_path(&format!("/{db}"));
        url.set_query(Some("sslmode=disable"));
        url.to_string()
    }
}

/// Copies frontend messages, counting them: first the untyped startup packets (length, body),
/// then typed messages (type byte, length, body).
async fn forward_frontend(
    rx: &mut tokio::net::tcp::OwnedReadHalf,
    tx: &mut tokio::net::tcp::OwnedWriteHalf,
    counting: &AtomicBool,
    executes: &AtomicUsize,
    queries: &AtomicUsize,
) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const SSL_REQUEST: u32 = 80_877_103;
    const GSSENC_REQUEST: u32 = 80_877_104;
    loop {
        let len = rx.read_u32().await?;
        let mut body = vec![0u8; len as usize - 4];
        rx.read_exact(&mut body).await?;
        tx.write_u32(len).await?;
        tx.write_all(&body).await?;
        let code = u32::from_be_bytes(body[..4].try_into().unwrap());
        if code != SSL_REQUEST && code != GSSENC_REQUEST {
            break;
        }
    }
    loop {
        let kind = rx.read_u8().await?;
        let len = rx.read_u32().await?;
        let mut body = vec![0u8; len as usize - 4];
        rx.read_exact(&mut body).await?;
        if counting.load(Ordering::SeqCst) {
            match kind {
                b'E' => executes.fetch_add(1, Ordering::SeqCst),
                b'Q' => queries.fetch_add(1, Ordering::SeqCst),
                _ => 0,
            };
        }
        tx.write_u8(kind).await?;
        tx.write_u32(len).await?;
        tx.write_all(&body).await?;
    }
}

/// The fast-path futures are `Send`, so they can be awaited in spawned tasks and web handlers.
#[allow(dead_code)]
fn fast_path_futures_are_send(
    jobs: &mut jobrelay::producer::PendingJobs,
    pool: &PgPool,
    conn: &mut PgConnection,
    redis: &mut redis::aio::MultiplexedConnection,
) {
    fn is_send<T: Send>(_: T) {}
    is_send(jobs.create_pending(conn));
    is_send(jobs.push_and_delete(redis, pool));
    is_send(jobs.push_and_delete(redis, &mut *conn));
    is_send(jobs.push(redis));
    is_send(jobs.delete_pending(pool));
}

/// The fast path in the conveyor layout writes what the relay would: conveyor's keys and
/// `wire.Job`, a flow's children and heirs before their parent, and the relay's own markers.
#[sqlx::test]
async fn the_fast_path_writes_the_conveyor_layout(pool: PgPool) {
    use jobrelay::proto::wire;
    use prost::Message;
    let ns = Namespace::new();
    let producer = Producer::new(ns.prefix.clone()).layout(jobrelay::LayoutKind::Conveyor);
    assert_eq!(producer.enqueuer().layout(), jobrelay::LayoutKind::Conveyor);
    let mut jobs = producer.pending();
    let parent = Uuid::new_v4();
    // The parent first: the fast path still sends its child and heir before it.
    jobs.add(JobBuilder::new("shop.Pack", "shop.Pack").uuid(parent))
        .unwrap();
    let child = jobs
        .add(
            JobBuilder::new("shop.Item", "shop.Item")
                .parent(parent)
                .payload(b"i".to_vec()),
        )
        .unwrap();
    let heir = jobs
        .add(JobBuilder::new("shop.Ship", "shop.Ship").predecessor(parent))
        .unwrap();
    let mut tx = pool.begin().await.unwrap();
    jobs.create_pending(&mut tx).await.unwrap();
    tx.commit().await.unwrap();
    let mut con = ns.con().await;
    let report = jobs.push_and_delete(&mut con, &pool).await.unwrap();
    assert_eq!(report.count(Outcome::Queued), 1);
    assert_eq!(report.count(Outcome::Children), 1);
    assert_eq!(report.count(Outcome::OnComplete), 1);
    assert_eq!(count(&pool, "pending_jobs").await, 0);

    let ns = &ns;
    let only = |key: String| async move {
        let mut con = ns.con().await;
        let items: Vec<Vec<u8>> = redis::cmd("LRANGE")
            .arg(ns.key(&key))
            .arg(0)
            .arg(-1)
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(items.len(), 1, "{key}");
        wire::Job::decode(items[0].as_slice()).unwrap()
    };
    let queued = only("queue:shop.Pack".into()).await;
    assert_eq!(
        (queued.uuid, queued.r#type),
        (parent.to_string(), "shop.Pack".to_owned())
    );
    let held = only(format!("job:{parent}:children")).await;
    assert_eq!(
        (held.uuid, held.parent_uuid, held.payload),
        (child.to_string(), parent.to_string(), b"i".to_vec())
    );
    let released = only(format!("job:{parent}:onComplete")).await;
    assert_eq!(
        (released.uuid, released.predecessor_uuid),
        (heir.to_string(), parent.to_string())
    );
    let mut keys = ns.keys().await;
    keys.retain(|k| k.starts_with("jobrelay:job:"));
    assert_eq!(keys.len(), 3, "one marker per job, of the relay's own");
}
