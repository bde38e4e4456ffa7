//! Issue 2 acceptance ("core"): the enqueue algorithm's branches (docs/layouts.md#the-enqueue-algorithm), dedup, the claim
//! loop's delete-after-ack invariant, concurrent workers and processes, NOTIFY wake-up, ordering,
//! the sweep and custom tables (docs/guarantees.md#the-relay-step, 5.3, 2).
//!
//! Every test runs against the real local Postgres (a fresh database from `#[sqlx::test]`) and
//! Redis (a random key namespace), reads what the relay wrote back from Redis and decodes it.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use common::child::RelayChild;
use common::*;
use jobrelay::proto::v1;
use jobrelay::redis::enqueue::JobResult;
use jobrelay::redis::sink::RedisSink;
use jobrelay::relay::{BatchSettings, Batcher, Health, JobSink, Queries, RelaySettings, Report};
use jobrelay::{Enqueuer, Error, ErrorClass, Job, Outcome, TableName};
use sqlx::types::Json;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

/// Dedup TTL of the in-process relays.
const TTL: Duration = Duration::from_secs(600);
/// A payload with zero bytes (and a byte that is not UTF-8).
const PAYLOAD: &[u8] = b"\x00{\"id\":1}\x00\x00\xff\x01tail\x00";

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn settings(batch_size: usize) -> Arc<BatchSettings> {
    Arc::new(BatchSettings {
        batch_size,
        max_attempts: 25,
        statement_timeout: Duration::from_secs(15),
        ..BatchSettings::default()
    })
}

fn queries() -> Arc<Queries> {
    Arc::new(Queries::new(&TableName::default()))
}

async fn redis_sink(ns: &Namespace, ttl: Duration) -> RedisSink {
    RedisSink::new(
        Enqueuer::new(ns.prefix.clone(), ttl),
        ns.manager().await.into(),
        Duration::from_secs(5),
    )
}

/// An in-process batcher on `pending_jobs` pushing to `ns` for real.
async fn batcher(pool: &PgPool, ns: &Namespace, ttl: Duration, batch: usize) -> Batcher<RedisSink> {
    Batcher::new(
        pool.clone(),
        queries(),
        settings(batch),
        redis_sink(ns, ttl).await,
    )
}

/// Runs batches until one claims nothing; the sum of their reports.
async fn drain<S: JobSink>(b: &Batcher<S>) -> Report {
    let mut total = Report::default();
    loop {
        let r = b.run_once(None).await.expect("batch succeeds");
        if r.claimed == 0 {
            return total;
        }
        total.add(&r);
    }
}

/// A row as Postgres stored it (the ground truth the job in Redis is compared with).
#[derive(Debug, sqlx::FromRow)]
struct Row {
    uuid: Uuid,
    queue: String,
    job_type: String,
    payload: Vec<u8>,
    parent_uuid: Option<Uuid>,
    predecessor_uuid: Option<Uuid>,
    run_at: Option<DateTime<Utc>>,
    headers: Json<BTreeMap<String, String>>,
    created_at: DateTime<Utc>,
}

/// What to insert; the rest (job type, payload with zero bytes, headers) is fixed.
#[derive(Debug, Clone, Default)]
struct NewRow {
    uuid: Option<Uuid>,
    queue: Option<&'static str>,
    payload: Option<Vec<u8>>,
    parent: Option<Uuid>,
    pred: Option<Uuid>,
    dead_parent: bool,
    run_at: Option<DateTime<Utc>>,
}

/// Inserts one row with SQL (as a producer in any language would) and returns it as stored.
async fn insert_job(pool: &PgPool, r: &NewRow) -> Row {
    sqlx::query_as(
        "INSERT INTO pending_jobs (uuid, queue, job_type, payload, parent_uuid, predecessor_uuid,
                                   dead_parent, run_at, headers)
         VALUES ($1, $2, 'SendInvoice', $3, $4, $5, $6, $7, $8)
         RETURNING uuid, queue, job_type, payload, parent_uuid, predecessor_uuid, run_at,
                   headers, created_at",
    )
    .bind(r.uuid.unwrap_or_else(Uuid::new_v4))
    .bind(r.queue.unwrap_or("billing"))
    .bind(r.payload.as_deref().unwrap_or(PAYLOAD))
    .bind(r.parent)
    .bind(r.pred)
    .bind(r.dead_parent)
    .bind(r.run_at)
    .bind(serde_json::json!({
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "tenant": "acme \u{e9}",
    }))
    .fetch_one(pool)
    .await
    .expect("row inserted")
}

/// `offset_secs` from now, at a fixed non-zero microsecond fraction (.654321).
fn at(offset_secs: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(Utc::now().timestamp() + offset_secs, 654_321_000).unwrap()
}

fn micros(t: &prost_types::Timestamp) -> (i64, i32) {
    (t.seconds, t.nanos)
}

fn pg_micros(t: DateTime<Utc>) -> (i64, i32) {
    (t.timestamp(), (t.timestamp_subsec_micros() * 1000) as i32)
}

/// Every field of the decoded job equals the row's, timestamps to the microsecond.
fn assert_job_is_row(job: &v1::Job, row: &Row) {
    let hyph = |u: Option<Uuid>| u.map(|u| u.hyphenated().to_string()).unwrap_or_default();
    assert_eq!(job.uuid, row.uuid.hyphenated().to_string(), "uuid");
    assert_eq!(job.uuid, job.uuid.to_lowercase(), "uuid is lowercase");
    assert_eq!(job.queue, row.queue, "queue");
    assert_eq!(job.job_type, row.job_type, "job_type");
    assert_eq!(job.payload, row.payload, "payload");
    assert_eq!(job.parent_uuid, hyph(row.parent_uuid), "parent_uuid");
    assert_eq!(
        job.predecessor_uuid,
        hyph(row.predecessor_uuid),
        "predecessor_uuid"
    );
    assert_eq!(
        job.run_at.as_ref().map(micros),
        row.run_at.map(pg_micros),
        "run_at"
    );
    assert_eq!(
        job.created_at.as_ref().map(micros),
        Some(pg_micros(row.created_at)),
        "created_at"
    );
    assert_eq!(job.headers, row.headers.0, "headers");
}

async fn get_raw(ns: &Namespace, key: &str) -> Option<Vec<u8>> {
    let mut con = ns.con().await;
    redis::cmd("GET")
        .arg(ns.key(key))
        .query_async(&mut con)
        .await
        .unwrap()
}

/// Raw elements of a list, oldest push first (BRPOP order).
async fn list_raw(ns: &Namespace, key: &str) -> Vec<Vec<u8>> {
    let mut con = ns.con().await;
    let mut raw: Vec<Vec<u8>> = redis::cmd("LRANGE")
        .arg(ns.key(key))
        .arg(0)
        .arg(-1)
        .query_async(&mut con)
        .await
        .unwrap();
    raw.reverse();
    raw
}

async fn scheduled_raw(ns: &Namespace) -> Vec<(Vec<u8>, f64)> {
    let mut con = ns.con().await;
    redis::cmd("ZRANGE")
        .arg(ns.key("scheduled"))
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(&mut con)
        .await
        .unwrap()
}

async fn smembers(ns: &Namespace, key: &str) -> Vec<String> {
    let mut con = ns.con().await;
    redis::cmd("SMEMBERS")
        .arg(ns.key(key))
        .query_async(&mut con)
        .await
        .unwrap()
}

async fn pttl(ns: &Namespace, key: &str) -> i64 {
    let mut con = ns.con().await;
    redis::cmd("PTTL")
        .arg(ns.key(key))
        .query_async(&mut con)
        .await
        .unwrap()
}

fn marker(u: Uuid) -> String {
    format!("jobs:{u}")
}

fn sorted(keys: &[String]) -> Vec<String> {
    let mut k = keys.to_vec();
    k.sort();
    k
}

/// The uuids of the jobs in a list, in BRPOP order.
async fn queue_uuids(ns: &Namespace, key: &str) -> Vec<String> {
    ns.list_jobs(key)
        .await
        .into_iter()
        .map(|j| j.uuid)
        .collect()
}

/// Every uuid of `expected` appears exactly once in `got`, and nothing else.
fn assert_exactly_once(got: &[String], expected: &BTreeSet<String>) {
    let distinct: HashSet<&String> = got.iter().collect();
    assert_eq!(distinct.len(), got.len(), "a uuid was delivered twice");
    assert_eq!(got.len(), expected.len(), "delivered count");
    assert!(
        got.iter().all(|u| expected.contains(u)),
        "unknown uuid delivered"
    );
}

/// Inserts `n` plain rows into `queue` with one statement; their uuids.
async fn insert_many(pool: &PgPool, n: i64, queue: &str) -> BTreeSet<String> {
    let uuids: Vec<Uuid> = sqlx::query_scalar(
        "INSERT INTO pending_jobs (queue, job_type, payload)
         SELECT $1, 'Bulk', convert_to('job-' || i, 'UTF8') FROM generate_series(1, $2) AS i
         RETURNING uuid",
    )
    .bind(queue)
    .bind(n)
    .fetch_all(pool)
    .await
    .unwrap();
    let set: BTreeSet<String> = uuids.iter().map(|u| u.hyphenated().to_string()).collect();
    assert_eq!(set.len(), n as usize);
    set
}

async fn all_uuids(pool: &PgPool, table: &str) -> BTreeSet<String> {
    sqlx::query_scalar::<_, Uuid>(&format!("SELECT uuid FROM {table}"))
        .fetch_all(pool)
        .await
        .unwrap()
        .into_iter()
        .map(|u| u.hyphenated().to_string())
        .collect()
}

fn relay_env<'a>(db: &'a str, ns: &'a Namespace) -> Vec<(&'static str, &'a str)> {
    vec![
        ("DATABASE_URL", db),
        ("REDIS_URL", &ns.url),
        ("JOBRELAY_NAMESPACE", &ns.prefix),
    ]
}

/// The counts of the one line `sweep: claimed=.. queued=.. ...` on stdout.
fn sweep_report(stdout: &str) -> BTreeMap<String, u64> {
    let lines: Vec<&str> = stdout.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one report line on stdout: {stdout:?}");
    let rest = lines[0]
        .strip_prefix("sweep: ")
        .unwrap_or_else(|| panic!("report starts with `sweep: `: {stdout:?}"));
    rest.split_whitespace()
        .map(|kv| {
            let (k, v) = kv.split_once('=').expect("key=value");
            (k.to_owned(), v.parse().expect("a count"))
        })
        .collect()
}

fn counts(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

/// Number of relay sessions (application_name `jobrelay`) that have run LISTEN on this database.
async fn listening_relays(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND application_name = 'jobrelay'
           AND query ILIKE 'LISTEN%'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn stop(mut child: RelayChild) {
    child.signal("TERM");
    assert_eq!(
        child.wait(Duration::from_secs(30)).await,
        Some(0),
        "clean exit on SIGTERM"
    );
}

// ---------------------------------------------------------------------------------------------
// 1. docs/layouts.md#the-enqueue-algorithm, every branch and the combinations
// ---------------------------------------------------------------------------------------------

/// Where a job must land.
#[derive(Debug, Clone, Copy)]
enum Lands {
    Queue,
    Scheduled,
    Children,
    OnComplete,
}

/// Inserts `new`, relays it in-process, and checks: the outcome, the one key the job landed in
/// (with the marker's exact bytes), every field of the decoded job, the `active` set for a
/// dead parent (`active`), that no other key was written and that the row is gone.
async fn branch(pool: PgPool, new: NewRow, lands: Lands, active: bool) {
    let ns = Namespace::new();
    let row = insert_job(&pool, &new).await;
    let report = drain(&batcher(&pool, &ns, TTL, 10).await).await;

    let outcome = match lands {
        Lands::Queue => Outcome::Queued,
        Lands::Scheduled => Outcome::Scheduled,
        Lands::Children => Outcome::Children,
        Lands::OnComplete => Outcome::OnComplete,
    };
    assert_eq!(report.claimed, 1, "{report}");
    assert_eq!(report.outcome(outcome), 1, "outcome {outcome}: {report}");
    assert_eq!(report.delivered(), 1, "{report}");
    assert_eq!(pending_count(&pool).await, 0, "row deleted");

    let dest = match lands {
        Lands::Queue => format!("queue:{}", row.queue),
        Lands::Scheduled => "scheduled".to_owned(),
        Lands::Children => format!("jobs:{}:children", new.parent.unwrap()),
        Lands::OnComplete => format!("jobs:{}:onComplete", new.pred.unwrap()),
    };
    let mut expected_keys = vec![marker(row.uuid), dest.clone()];
    if active {
        expected_keys.push(format!("jobs:{}:active", new.parent.unwrap()));
    }
    assert_eq!(ns.keys().await, sorted(&expected_keys), "keys written");

    let marked = get_raw(&ns, &marker(row.uuid)).await.expect("marker set");
    assert_job_is_row(&decode(&marked), &row);
    let stored = match lands {
        Lands::Scheduled => {
            let members = scheduled_raw(&ns).await;
            assert_eq!(members.len(), 1);
            let (bytes, score) = members.into_iter().next().unwrap();
            let run_at = row.run_at.expect("scheduled rows have run_at");
            let want =
                run_at.timestamp() as f64 + f64::from(run_at.timestamp_subsec_micros()) / 1e6;
            assert!(
                (score - want).abs() < 5e-7,
                "score {score} is run_at {run_at} as epoch seconds with the fraction ({want})"
            );
            bytes
        }
        _ => {
            let items = list_raw(&ns, &dest).await;
            assert_eq!(items.len(), 1, "one job in {dest}");
            items.into_iter().next().unwrap()
        }
    };
    assert_eq!(stored, marked, "the marker holds the same marshalled job");
    assert_job_is_row(&decode(&stored), &row);

    if active {
        let key = format!("jobs:{}:active", new.parent.unwrap());
        assert_eq!(
            smembers(&ns, &key).await,
            vec![row.uuid.to_string()],
            "{key}"
        );
    }
    assert!(pttl(&ns, &marker(row.uuid)).await > 0, "marker expires");
}

#[sqlx::test]
async fn plain_row_is_queued(pool: PgPool) {
    branch(pool, NewRow::default(), Lands::Queue, false).await;
}

#[sqlx::test]
async fn future_run_at_is_scheduled_with_fractional_score(pool: PgPool) {
    let new = NewRow {
        run_at: Some(at(3600)),
        ..NewRow::default()
    };
    branch(pool, new, Lands::Scheduled, false).await;
}

#[sqlx::test]
async fn past_run_at_is_queued_and_keeps_run_at(pool: PgPool) {
    let new = NewRow {
        run_at: Some(at(-3600)),
        ..NewRow::default()
    };
    branch(pool, new, Lands::Queue, false).await;
}

#[sqlx::test]
async fn live_parent_holds_the_child(pool: PgPool) {
    let new = NewRow {
        parent: Some(Uuid::new_v4()),
        ..NewRow::default()
    };
    branch(pool, new, Lands::Children, false).await;
}

#[sqlx::test]
async fn live_parent_wins_over_predecessor_and_run_at(pool: PgPool) {
    let new = NewRow {
        parent: Some(Uuid::new_v4()),
        pred: Some(Uuid::new_v4()),
        run_at: Some(at(3600)),
        ..NewRow::default()
    };
    branch(pool, new, Lands::Children, false).await;
}

#[sqlx::test]
async fn predecessor_only_goes_on_complete(pool: PgPool) {
    let new = NewRow {
        pred: Some(Uuid::new_v4()),
        ..NewRow::default()
    };
    branch(pool, new, Lands::OnComplete, false).await;
}

#[sqlx::test]
async fn predecessor_wins_over_future_run_at(pool: PgPool) {
    let new = NewRow {
        pred: Some(Uuid::new_v4()),
        run_at: Some(at(3600)),
        ..NewRow::default()
    };
    branch(pool, new, Lands::OnComplete, false).await;
}

#[sqlx::test]
async fn dead_parent_queues_and_marks_active(pool: PgPool) {
    let new = NewRow {
        parent: Some(Uuid::new_v4()),
        dead_parent: true,
        ..NewRow::default()
    };
    branch(pool, new, Lands::Queue, true).await;
}

#[sqlx::test]
async fn dead_parent_skips_the_predecessor(pool: PgPool) {
    let new = NewRow {
        parent: Some(Uuid::new_v4()),
        pred: Some(Uuid::new_v4()),
        dead_parent: true,
        ..NewRow::default()
    };
    branch(pool, new, Lands::Queue, true).await;
}

#[sqlx::test]
async fn dead_parent_with_future_run_at_is_only_scheduled(pool: PgPool) {
    let new = NewRow {
        parent: Some(Uuid::new_v4()),
        dead_parent: true,
        run_at: Some(at(3600)),
        ..NewRow::default()
    };
    branch(pool, new, Lands::Scheduled, false).await;
}

#[sqlx::test]
async fn dead_parent_with_past_run_at_queues_and_marks_active(pool: PgPool) {
    let new = NewRow {
        parent: Some(Uuid::new_v4()),
        dead_parent: true,
        run_at: Some(at(-60)),
        ..NewRow::default()
    };
    branch(pool, new, Lands::Queue, true).await;
}

#[sqlx::test]
async fn dead_parent_flag_without_parent_skips_predecessor(pool: PgPool) {
    let new = NewRow {
        pred: Some(Uuid::new_v4()),
        dead_parent: true,
        ..NewRow::default()
    };
    branch(pool, new, Lands::Queue, false).await;
}

/// One batch mixing plain and routed jobs over two queues, in one script call: each job lands
/// where its branch says, a queue fed by both kinds gets them in id order, and a uuid repeated
/// within the batch is a duplicate.
#[sqlx::test]
async fn a_mixed_batch_lands_every_job_in_id_order(pool: PgPool) {
    let ns = Namespace::new();
    let parent = Uuid::new_v4();
    let pred = Uuid::new_v4();
    let twice = Uuid::new_v4();
    // queue, parent, predecessor, dead_parent, run_at (seconds from now), payload
    type Spec = (
        &'static str,
        Option<Uuid>,
        Option<Uuid>,
        bool,
        Option<i64>,
        &'static str,
    );
    let rows: [Spec; 12] = [
        ("a", None, None, false, None, "1"),
        ("b", None, None, false, None, "2"),
        ("a", Some(parent), None, true, None, "3"),
        ("a", None, Some(pred), false, None, "4"),
        ("a", None, None, false, Some(-60), "5"),
        ("b", None, None, false, Some(3600), "6"),
        ("a", Some(parent), None, false, None, "7"),
        ("a", None, None, false, None, "8"),
        ("b", None, None, true, None, "9"),
        ("b", None, None, false, None, "10"),
        ("a", None, None, false, Some(3600), "11"),
        ("a", None, Some(pred), false, None, "12"),
    ];
    let mut uuids = Vec::new();
    for (i, (queue, parent, pred, dead, run_at, payload)) in rows.into_iter().enumerate() {
        // Rows 10 and 11 share a uuid: the second (with a route) is a duplicate of the first.
        let uuid = if i == 9 || i == 10 {
            twice
        } else {
            Uuid::new_v4()
        };
        uuids.push(uuid);
        insert_job(
            &pool,
            &NewRow {
                uuid: Some(uuid),
                queue: Some(queue),
                payload: Some(payload.as_bytes().to_vec()),
                parent,
                pred,
                dead_parent: dead,
                run_at: run_at.map(at),
            },
        )
        .await;
    }
    let report = drain(&batcher(&pool, &ns, TTL, 100).await).await;
    assert_eq!(report.claimed, 12, "{report}");
    assert_eq!(report.outcome(Outcome::Queued), 7, "{report}");
    assert_eq!(report.outcome(Outcome::Scheduled), 1, "{report}");
    assert_eq!(report.outcome(Outcome::Children), 1, "{report}");
    assert_eq!(report.outcome(Outcome::OnComplete), 2, "{report}");
    assert_eq!(report.outcome(Outcome::Duplicate), 1, "{report}");
    assert_eq!(pending_count(&pool).await, 0);

    let payloads = |jobs: Vec<v1::Job>| -> Vec<String> {
        jobs.into_iter()
            .map(|j| String::from_utf8(j.payload).unwrap())
            .collect()
    };
    assert_eq!(
        payloads(ns.list_jobs("queue:a").await),
        ["1", "3", "5", "8"]
    );
    assert_eq!(payloads(ns.list_jobs("queue:b").await), ["2", "9", "10"]);
    assert_eq!(
        payloads(ns.list_jobs(&format!("jobs:{parent}:children")).await),
        ["7"]
    );
    assert_eq!(
        payloads(ns.list_jobs(&format!("jobs:{pred}:onComplete")).await),
        ["4", "12"]
    );
    let scheduled = scheduled_raw(&ns).await;
    assert_eq!(scheduled.len(), 1);
    assert_eq!(decode(&scheduled[0].0).payload, b"6");
    assert_eq!(
        smembers(&ns, &format!("jobs:{parent}:active")).await,
        vec![uuids[2].to_string()]
    );
    for (i, uuid) in uuids.iter().enumerate() {
        let marked = get_raw(&ns, &marker(*uuid)).await.expect("marker set");
        let want = if i == 10 { "10" } else { rows[i].5 };
        assert_eq!(
            decode(&marked).payload,
            want.as_bytes(),
            "marker of row {i}"
        );
    }
}

#[sqlx::test]
async fn namespace_prefixes_every_key(pool: PgPool) {
    // The branch tests see only their own prefix; check that nothing went unprefixed.
    let ns = Namespace::new();
    let parent = Uuid::new_v4();
    let row = insert_job(
        &pool,
        &NewRow {
            parent: Some(parent),
            dead_parent: true,
            queue: Some("nsq"),
            ..NewRow::default()
        },
    )
    .await;
    drain(&batcher(&pool, &ns, TTL, 10).await).await;
    let mut con = ns.con().await;
    for key in [
        marker(row.uuid),
        "queue:nsq".to_owned(),
        format!("jobs:{parent}:active"),
    ] {
        let n: i64 = redis::cmd("EXISTS")
            .arg(&key)
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(n, 0, "unprefixed {key} written");
        let n: i64 = redis::cmd("EXISTS")
            .arg(ns.key(&key))
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(n, 1, "prefixed {key} written");
    }
}

// ---------------------------------------------------------------------------------------------
// 2. Dedup: duplicates write nothing, the marker's TTL
// ---------------------------------------------------------------------------------------------

#[sqlx::test]
async fn relayed_uuid_is_a_duplicate_and_its_row_is_deleted(pool: PgPool) {
    let ns = Namespace::new();
    let b = batcher(&pool, &ns, TTL, 10).await;
    let first = insert_job(&pool, &NewRow::default()).await;
    let r = drain(&b).await;
    assert_eq!(r.outcome(Outcome::Queued), 1, "{r}");
    let keys_before = ns.keys().await;
    let marker_before = get_raw(&ns, &marker(first.uuid)).await.unwrap();

    // The same uuid again (as after a crash between push and delete), even with other content.
    insert_job(
        &pool,
        &NewRow {
            uuid: Some(first.uuid),
            queue: Some("elsewhere"),
            payload: Some(b"second copy".to_vec()),
            ..NewRow::default()
        },
    )
    .await;
    let r = drain(&b).await;
    assert_eq!(
        (r.claimed, r.outcome(Outcome::Duplicate), r.delivered()),
        (1, 1, 1),
        "{r}"
    );
    assert_eq!(pending_count(&pool).await, 0, "duplicate row deleted");
    assert_eq!(ns.keys().await, keys_before, "no new key");
    let queued = list_raw(&ns, "queue:billing").await;
    assert_eq!(queued.len(), 1, "still one job");
    assert_job_is_row(&decode(&queued[0]), &first);
    assert_eq!(
        get_raw(&ns, &marker(first.uuid)).await.unwrap(),
        marker_before
    );

    // Two rows of one batch with the same uuid: one job.
    let u = Uuid::new_v4();
    for _ in 0..2 {
        insert_job(
            &pool,
            &NewRow {
                uuid: Some(u),
                ..NewRow::default()
            },
        )
        .await;
    }
    let r = drain(&b).await;
    assert_eq!(
        (
            r.claimed,
            r.outcome(Outcome::Queued),
            r.outcome(Outcome::Duplicate)
        ),
        (2, 1, 1)
    );
    assert_eq!(ns.llen("queue:billing").await, 2);
    assert_eq!(pending_count(&pool).await, 0);
}

#[sqlx::test]
async fn marker_carries_the_configured_ttl(pool: PgPool) {
    let ns = Namespace::new();
    let row = insert_job(&pool, &NewRow::default()).await;
    drain(&batcher(&pool, &ns, TTL, 10).await).await;
    let ttl = pttl(&ns, &marker(row.uuid)).await;
    let max = TTL.as_millis() as i64;
    assert!(
        ttl <= max && ttl > max - 30_000,
        "PTTL {ttl} close to {max}"
    );

    let row = insert_job(&pool, &NewRow::default()).await;
    drain(&batcher(&pool, &ns, Duration::ZERO, 10).await).await;
    assert_eq!(
        pttl(&ns, &marker(row.uuid)).await,
        -1,
        "dedup TTL 0: no expiry"
    );
}

/// With `--dedup-ttl 0` the script writes markers with variadic MSETs in chunks: in one call
/// that spans several chunks every marker holds its own job and never expires. (The library
/// call, not the relay: the relay's job-by-job fallback would hide a call that Redis refused.)
#[tokio::test]
async fn markers_without_ttl_hold_their_jobs_across_chunks() {
    let ns = Namespace::new();
    let jobs: Vec<jobrelay::Job> = (0..1_000)
        .map(|i| {
            jobrelay::producer::JobBuilder::new("nottl", "Bulk")
                .payload(format!("job-{i}"))
                .build()
                .unwrap()
        })
        .collect();
    let mut con = ns.con().await;
    let results = jobrelay::Enqueuer::new(ns.prefix.clone(), Duration::ZERO)
        .enqueue_batch(&mut con, &jobs)
        .await
        .expect("one call for the whole batch");
    assert!(results.iter().all(|r| matches!(r, Ok(Outcome::Queued))));
    for job in &jobs {
        let key = ns.key(&format!("jobs:{}", job.uuid));
        let (raw, ttl): (Vec<u8>, i64) = redis::pipe()
            .cmd("GET")
            .arg(&key)
            .cmd("PTTL")
            .arg(&key)
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(decode(&raw).payload, job.payload, "{key} holds its own job");
        assert_eq!(ttl, -1, "{key} never expires");
    }
}

#[sqlx::test]
async fn binary_dedup_ttl_flag_sets_the_marker_ttl(pool: PgPool) {
    let ns = Namespace::new();
    let db = database_url_of(&pool).await;
    let env = relay_env(&db, &ns);
    let row = insert_job(&pool, &NewRow::default()).await;
    let (code, out, err) = run_relay(
        &["--sweep", "--older-than", "0s", "--dedup-ttl", "7m"],
        &env,
    )
    .await;
    assert_eq!(code, 0, "{out}\n{err}");
    let ttl = pttl(&ns, &marker(row.uuid)).await;
    assert!(
        ttl <= 420_000 && ttl > 420_000 - 30_000,
        "PTTL {ttl} close to 7m"
    );

    let row = insert_job(&pool, &NewRow::default()).await;
    let (code, out, err) =
        run_relay(&["--sweep", "--older-than", "0s", "--dedup-ttl", "0"], &env).await;
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(
        pttl(&ns, &marker(row.uuid)).await,
        -1,
        "--dedup-ttl 0: no expiry"
    );

    // The default is 15 minutes.
    let row = insert_job(&pool, &NewRow::default()).await;
    let (code, out, err) = run_relay(&["--sweep", "--older-than", "0s"], &env).await;
    assert_eq!(code, 0, "{out}\n{err}");
    let ttl = pttl(&ns, &marker(row.uuid)).await;
    assert!(
        ttl <= 900_000 && ttl > 900_000 - 30_000,
        "PTTL {ttl} close to 15m"
    );
}

// ---------------------------------------------------------------------------------------------
// 3. A row is deleted only after Redis acknowledged its write
// ---------------------------------------------------------------------------------------------

/// Pushes the first half of a batch for real, then fails the push as a whole (transient).
struct HalfThenFail {
    enqueuer: Enqueuer,
    con: redis::aio::MultiplexedConnection,
}

impl JobSink for HalfThenFail {
    async fn push(&self, jobs: &[Job]) -> jobrelay::Result<Vec<JobResult>> {
        let mut con = self.con.clone();
        let half = &jobs[..jobs.len() / 2];
        let results = self.enqueuer.enqueue_batch(&mut con, half).await?;
        assert!(results.iter().all(|r| matches!(r, Ok(Outcome::Queued))));
        Err(Error::Redis(redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "injected: connection reset after half the batch",
        ))))
    }
}

#[sqlx::test]
async fn rows_stay_until_redis_acknowledges(pool: PgPool) {
    let ns = Namespace::new();
    const N: usize = 10;
    for i in 0..N {
        insert_job(
            &pool,
            &NewRow {
                payload: Some(format!("job-{i}").into_bytes()),
                ..NewRow::default()
            },
        )
        .await;
    }
    let before: Vec<(i64, Uuid, i32, DateTime<Utc>)> =
        sqlx::query_as("SELECT id, uuid, attempts, available_at FROM pending_jobs ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();

    let failing = Batcher::new(
        pool.clone(),
        queries(),
        settings(N),
        HalfThenFail {
            enqueuer: Enqueuer::new(ns.prefix.clone(), TTL),
            con: ns.con().await,
        },
    );
    let err = failing.run_once(None).await.expect_err("the push failed");
    assert_eq!(err.class(), ErrorClass::Transient, "{err}");

    // Half of the jobs did reach Redis, yet every row is still there, untouched.
    assert_eq!(
        ns.llen("queue:billing").await,
        N / 2,
        "the sink pushed half for real"
    );
    let after: Vec<(i64, Uuid, i32, DateTime<Utc>)> =
        sqlx::query_as("SELECT id, uuid, attempts, available_at FROM pending_jobs ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        after, before,
        "rows kept with attempts and available_at unchanged"
    );
    let errors: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pending_jobs WHERE last_error IS NOT NULL")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(errors, 0);

    // The real sink delivers each exactly once: the first half turns into duplicates.
    let r = drain(&batcher(&pool, &ns, TTL, N).await).await;
    assert_eq!(r.claimed, N as u64, "{r}");
    assert_eq!(r.outcome(Outcome::Duplicate), (N / 2) as u64, "{r}");
    assert_eq!(r.outcome(Outcome::Queued), (N - N / 2) as u64, "{r}");
    assert_eq!(pending_count(&pool).await, 0);
    let got = queue_uuids(&ns, "queue:billing").await;
    let want: Vec<String> = before.iter().map(|(_, u, _, _)| u.to_string()).collect();
    assert_eq!(got, want, "each job exactly once, in id order");
}

// ---------------------------------------------------------------------------------------------
// 4. Concurrency: two workers, two processes, 20,000 rows, each exactly once
// ---------------------------------------------------------------------------------------------

const MANY: i64 = 20_000;

/// A real sink that counts what it pushed.
struct Counting {
    inner: RedisSink,
    pushed: Arc<AtomicU64>,
    duplicates: Arc<AtomicU64>,
}

impl JobSink for Counting {
    async fn push(&self, jobs: &[Job]) -> jobrelay::Result<Vec<JobResult>> {
        let results = self.inner.push(jobs).await?;
        for r in &results {
            match r {
                Ok(Outcome::Duplicate) => self.duplicates.fetch_add(1, Ordering::Relaxed),
                Ok(_) => self.pushed.fetch_add(1, Ordering::Relaxed),
                Err(_) => 0,
            };
        }
        Ok(results)
    }
}

#[sqlx::test]
async fn two_workers_deliver_each_row_once(pool: PgPool) {
    let ns = Namespace::new();
    let expected = insert_many(&pool, MANY, "bulk").await;

    let pushed: Vec<Arc<AtomicU64>> = (0..2).map(|_| Arc::default()).collect();
    let duplicates = Arc::new(AtomicU64::new(0));
    let mut sinks = Vec::new();
    for p in &pushed {
        sinks.push(Counting {
            inner: redis_sink(&ns, TTL).await,
            pushed: p.clone(),
            duplicates: duplicates.clone(),
        });
    }
    let settings = RelaySettings {
        table: TableName::default(),
        batch: (*self::settings(250)).clone(),
        poll_interval: Duration::from_millis(200),
    };
    let tracker = TaskTracker::new();
    let shutdown = CancellationToken::new();
    jobrelay::relay::spawn(
        &tracker,
        &settings,
        pool.clone(),
        sinks,
        Arc::new(Health::default()),
        shutdown.clone(),
    );
    wait_until("table drained", Duration::from_secs(60), || async {
        pending_count(&pool).await == 0
    })
    .await;
    shutdown.cancel();
    tracker.close();
    tokio::time::timeout(Duration::from_secs(30), tracker.wait())
        .await
        .expect("workers stop");

    assert_exactly_once(&queue_uuids(&ns, "queue:bulk").await, &expected);
    assert_eq!(ns.marker_count().await, MANY as usize);
    let per_worker: Vec<u64> = pushed.iter().map(|p| p.load(Ordering::Relaxed)).collect();
    assert_eq!(
        per_worker.iter().sum::<u64>(),
        MANY as u64,
        "{per_worker:?}"
    );
    assert!(
        per_worker.iter().all(|&n| n > 0),
        "both workers took a share: {per_worker:?}"
    );
    assert_eq!(
        duplicates.load(Ordering::Relaxed),
        0,
        "no row was claimed twice"
    );
}

#[sqlx::test]
async fn two_processes_deliver_each_row_once(pool: PgPool) {
    let ns = Namespace::new();
    let db = database_url_of(&pool).await;
    let args = [
        "--workers",
        "1",
        "--batch-size",
        "250",
        "--poll-interval",
        "200ms",
    ];
    let a = RelayChild::start(&db, &ns.url, &ns.prefix, &args);
    let b = RelayChild::start(&db, &ns.url, &ns.prefix, &args);
    // Both running (and listening) before the rows arrive, so they compete for them.
    wait_until("both relays listen", Duration::from_secs(20), || async {
        listening_relays(&pool).await == 2
    })
    .await;
    let expected = insert_many(&pool, MANY, "bulk").await;
    wait_until("table drained", Duration::from_secs(60), || async {
        pending_count(&pool).await == 0
    })
    .await;
    stop(a).await;
    stop(b).await;
    assert_exactly_once(&queue_uuids(&ns, "queue:bulk").await, &expected);
    assert_eq!(ns.marker_count().await, MANY as usize);
}

// ---------------------------------------------------------------------------------------------
// 5. NOTIFY wakes an idle relay; rolled-back rows never reach Redis
// ---------------------------------------------------------------------------------------------

/// A daemon polling every 30 s, idle: listening, and its first row already relayed.
async fn idle_daemon(pool: &PgPool, ns: &Namespace) -> RelayChild {
    let db = database_url_of(pool).await;
    let child = RelayChild::start(
        &db,
        &ns.url,
        &ns.prefix,
        &["--workers", "1", "--poll-interval", "30s"],
    );
    wait_until("relay listens", Duration::from_secs(20), || async {
        listening_relays(pool).await == 1
    })
    .await;
    let first = insert_job(
        pool,
        &NewRow {
            queue: Some("first"),
            ..NewRow::default()
        },
    )
    .await;
    wait_until("first row relayed", Duration::from_secs(10), || async {
        get_raw(ns, &marker(first.uuid)).await.is_some()
    })
    .await;
    child
}

#[sqlx::test]
async fn notify_wakes_an_idle_relay(pool: PgPool) {
    let ns = Namespace::new();
    let child = idle_daemon(&pool, &ns).await;
    for i in 0..3 {
        let row = insert_job(&pool, &NewRow::default()).await;
        // Far sooner than the 30 s poll interval.
        wait_until(
            &format!("row {i} relayed"),
            Duration::from_secs(5),
            || async { ns.llen("queue:billing").await == i + 1 },
        )
        .await;
        let jobs = ns.list_jobs("queue:billing").await;
        assert_job_is_row(&jobs[i], &row);
    }
    wait_until("rows deleted", Duration::from_secs(5), || async {
        pending_count(&pool).await == 0
    })
    .await;
    stop(child).await;
}

#[sqlx::test]
async fn rolled_back_rows_never_reach_redis(pool: PgPool) {
    let ns = Namespace::new();
    let child = idle_daemon(&pool, &ns).await;

    let ghost = Uuid::new_v4();
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("INSERT INTO pending_jobs (uuid, queue, job_type) VALUES ($1, 'billing', 'Ghost')")
        .bind(ghost)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();

    let sentinel = insert_job(&pool, &NewRow::default()).await;
    wait_until("sentinel relayed", Duration::from_secs(5), || async {
        ns.llen("queue:billing").await == 1
    })
    .await;
    stop(child).await;
    assert_eq!(
        queue_uuids(&ns, "queue:billing").await,
        vec![sentinel.uuid.to_string()]
    );
    assert_eq!(
        get_raw(&ns, &marker(ghost)).await,
        None,
        "no marker for the rolled-back row"
    );
    assert_eq!(
        ns.marker_count().await,
        2,
        "markers: the first row and the sentinel"
    );
    assert_eq!(pending_count(&pool).await, 0);
}

// ---------------------------------------------------------------------------------------------
// 6. One worker delivers a queue in id order
// ---------------------------------------------------------------------------------------------

#[sqlx::test]
async fn one_worker_delivers_in_id_order(pool: PgPool) {
    let ns = Namespace::new();
    // Ids are a permutation of 1..=100 inserted out of order, so the table's physical order is
    // not the id order: only an ORDER BY id claim (and an ordered push) delivers in id order.
    sqlx::query(
        "INSERT INTO pending_jobs (id, queue, job_type, payload)
         SELECT (i * 37) % 101, 'ordered', 'Step', convert_to(lpad(((i * 37) % 101)::text, 3, '0'), 'UTF8')
         FROM generate_series(1, 100) AS i",
    )
    .execute(&pool)
    .await
    .unwrap();
    let physical: Vec<i64> = sqlx::query_scalar("SELECT id FROM pending_jobs")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert!(
        physical.windows(2).any(|w| w[0] > w[1]),
        "heap order differs from id order"
    );

    let db = database_url_of(&pool).await;
    let child = RelayChild::start(
        &db,
        &ns.url,
        &ns.prefix,
        &["--workers", "1", "--batch-size", "7"],
    );
    wait_until("all relayed", Duration::from_secs(30), || async {
        ns.llen("queue:ordered").await == 100
    })
    .await;
    stop(child).await;
    let payloads: Vec<String> = ns
        .list_jobs("queue:ordered")
        .await
        .into_iter()
        .map(|j| String::from_utf8(j.payload).unwrap())
        .collect();
    let want: Vec<String> = (1..=100).map(|i| format!("{i:03}")).collect();
    assert_eq!(payloads, want, "BRPOP order is id order");
    assert_eq!(pending_count(&pool).await, 0);
}

// ---------------------------------------------------------------------------------------------
// 7. The sweep
// ---------------------------------------------------------------------------------------------

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

#[sqlx::test]
async fn smoke_plain_row_reaches_the_queue(pool: PgPool) {
    let ns = Namespace::new();
    insert_rows(&pool, 3, "default").await;
    let db = database_url_of(&pool).await;
    let (code, out, err) =
        run_relay(&["--sweep", "--older-than", "0s"], &relay_env(&db, &ns)).await;
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    assert_eq!(ns.llen("queue:default").await, 3);
    assert_eq!(pending_count(&pool).await, 0);
}
