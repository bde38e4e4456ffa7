//! The relay's batch step in-process against the real Redis: settings, the batcher and a drain;
//! rows inserted with SQL (as any producer would) and compared field for field with the jobs read
//! back raw from Redis; uuid sets, the sweep's report, relay environments.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use super::child::RelayChild;
use super::*;
use chrono::{DateTime, Utc};
use jobrelay::broker::redis_sink::RedisSink;
use jobrelay::proto::v1;
use jobrelay::relay::{BatchSettings, Batcher, JobSink, Queries, Report};
use jobrelay::{Enqueuer, TableName};
use sqlx::types::Json;
use sqlx::PgPool;
use uuid::Uuid;

/// Dedup TTL of the in-process relays.
pub const TTL: Duration = Duration::from_secs(600);
/// A payload with zero bytes (and a byte that is not UTF-8).
pub const PAYLOAD: &[u8] = b"\x00{\"id\":1}\x00\x00\xff\x01tail\x00";

pub fn settings(batch_size: usize) -> Arc<BatchSettings> {
    Arc::new(BatchSettings {
        batch_size,
        max_attempts: 25,
        statement_timeout: Duration::from_secs(15),
        ..BatchSettings::default()
    })
}

pub fn queries() -> Arc<Queries> {
    Arc::new(Queries::new(&TableName::default()))
}

pub async fn redis_sink(ns: &Namespace, ttl: Duration) -> RedisSink {
    RedisSink::new(
        Enqueuer::new(ns.prefix.clone(), ttl),
        ns.manager().await.into(),
        Duration::from_secs(5),
    )
}

/// An in-process batcher on `pending_jobs` pushing to `ns` for real.
pub async fn batcher(
    pool: &PgPool,
    ns: &Namespace,
    ttl: Duration,
    batch: usize,
) -> Batcher<RedisSink> {
    Batcher::new(
        pool.clone(),
        queries(),
        settings(batch),
        redis_sink(ns, ttl).await,
    )
}

/// Runs batches until one claims nothing and says no more waits (as a relay's worker goes on
/// at once after an empty claim that says more may wait); the sum of their reports.
pub async fn drain<S: JobSink>(b: &Batcher<S>) -> Report {
    let mut total = Report::default();
    loop {
        let r = b.run_once(None).await.expect("batch succeeds");
        if r.claimed == 0 && !r.more {
            return total;
        }
        total.add(&r);
    }
}

/// A row as Postgres stored it (the ground truth the job in Redis is compared with).
#[derive(Debug, sqlx::FromRow)]
pub struct Row {
    pub uuid: Uuid,
    pub queue: String,
    pub job_type: String,
    pub payload: Vec<u8>,
    pub parent_uuid: Option<Uuid>,
    pub predecessor_uuid: Option<Uuid>,
    pub run_at: Option<DateTime<Utc>>,
    pub headers: Json<BTreeMap<String, String>>,
    pub created_at: DateTime<Utc>,
}

/// What to insert; the rest (job type, payload with zero bytes, headers) is fixed.
#[derive(Debug, Clone, Default)]
pub struct NewRow {
    pub uuid: Option<Uuid>,
    pub queue: Option<&'static str>,
    pub payload: Option<Vec<u8>>,
    pub parent: Option<Uuid>,
    pub pred: Option<Uuid>,
    pub dead_parent: bool,
    pub run_at: Option<DateTime<Utc>>,
}

/// Inserts one row with SQL (as a producer in any language would) and returns it as stored.
pub async fn insert_job(pool: &PgPool, r: &NewRow) -> Row {
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
pub fn at(offset_secs: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(Utc::now().timestamp() + offset_secs, 654_321_000).unwrap()
}

pub fn micros(t: &prost_types::Timestamp) -> (i64, i32) {
    (t.seconds, t.nanos)
}

pub fn pg_micros(t: DateTime<Utc>) -> (i64, i32) {
    (t.timestamp(), (t.timestamp_subsec_micros() * 1000) as i32)
}

/// Every field of the decoded job equals the row's, timestamps to the microsecond.
pub fn assert_job_is_row(job: &v1::Job, row: &Row) {
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

pub async fn get_raw(ns: &Namespace, key: &str) -> Option<Vec<u8>> {
    let mut con = ns.con().await;
    redis::cmd("GET")
        .arg(ns.key(key))
        .query_async(&mut con)
        .await
        .unwrap()
}

/// Raw elements of a list, oldest push first (BRPOP order).
pub async fn list_raw(ns: &Namespace, key: &str) -> Vec<Vec<u8>> {
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

pub async fn scheduled_raw(ns: &Namespace) -> Vec<(Vec<u8>, f64)> {
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

pub async fn smembers(ns: &Namespace, key: &str) -> Vec<String> {
    let mut con = ns.con().await;
    redis::cmd("SMEMBERS")
        .arg(ns.key(key))
        .query_async(&mut con)
        .await
        .unwrap()
}

pub async fn pttl(ns: &Namespace, key: &str) -> i64 {
    let mut con = ns.con().await;
    redis::cmd("PTTL")
        .arg(ns.key(key))
        .query_async(&mut con)
        .await
        .unwrap()
}

pub fn marker(u: Uuid) -> String {
    format!("jobs:{u}")
}

pub fn sorted(keys: &[String]) -> Vec<String> {
    let mut k = keys.to_vec();
    k.sort();
    k
}

/// The uuids of the jobs in a list, in BRPOP order.
pub async fn queue_uuids(ns: &Namespace, key: &str) -> Vec<String> {
    ns.list_jobs(key)
        .await
        .into_iter()
        .map(|j| j.uuid)
        .collect()
}

/// Every uuid of `expected` appears exactly once in `got`, and nothing else.
pub fn assert_exactly_once(got: &[String], expected: &BTreeSet<String>) {
    let distinct: HashSet<&String> = got.iter().collect();
    assert_eq!(distinct.len(), got.len(), "a uuid was delivered twice");
    assert_eq!(got.len(), expected.len(), "delivered count");
    assert!(
        got.iter().all(|u| expected.contains(u)),
        "unknown uuid delivered"
    );
}

/// Inserts `n` plain rows into `queue` with one statement; their uuids.
pub async fn insert_many(pool: &PgPool, n: i64, queue: &str) -> BTreeSet<String> {
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

pub async fn all_uuids(pool: &PgPool, table: &str) -> BTreeSet<String> {
    sqlx::query_scalar::<_, Uuid>(&format!("SELECT uuid FROM {table}"))
        .fetch_all(pool)
        .await
        .unwrap()
        .into_iter()
        .map(|u| u.hyphenated().to_string())
        .collect()
}

pub fn relay_env<'a>(db: &'a str, ns: &'a Namespace) -> Vec<(&'static str, &'a str)> {
    vec![
        ("DATABASE_URL", db),
        ("REDIS_URL", &ns.url),
        ("JOBRELAY_NAMESPACE", &ns.prefix),
    ]
}

/// The counts of the one line `sweep: claimed=.. queued=.. ...` on stdout.
pub fn sweep_report(stdout: &str) -> BTreeMap<String, u64> {
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

pub fn counts(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

/// Number of relay sessions (application_name `jobrelay`) that have run LISTEN on this database.
pub async fn listening_relays(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND application_name = 'jobrelay'
           AND query ILIKE 'LISTEN%'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

pub async fn stop(mut child: RelayChild) {
    child.signal("TERM");
    assert_eq!(
        child.wait(Duration::from_secs(30)).await,
        Some(0),
        "clean exit on SIGTERM"
    );
}

/// A daemon polling every 30 s, idle: listening, and its first row already relayed.
pub async fn idle_daemon(pool: &PgPool, ns: &Namespace) -> RelayChild {
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

/// Waits until the outbox of `pool` is empty (within `deadline`), then stops the in-process
/// relay of `tracker` and `shutdown` and waits for its tasks (within 30 s).
pub async fn drained_then_stopped(
    pool: &PgPool,
    deadline: Duration,
    tracker: tokio_util::task::TaskTracker,
    shutdown: tokio_util::sync::CancellationToken,
) {
    wait_until("the outbox drained", deadline, || async {
        pending_count(pool).await == 0
    })
    .await;
    shutdown.cancel();
    tracker.close();
    tokio::time::timeout(Duration::from_secs(30), tracker.wait())
        .await
        .expect("workers stop");
}
