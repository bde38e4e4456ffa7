//! Limits: bounded batches and jobs.
//!
//! - One script call never carries more than the byte cap (`--batch-max-bytes`), measured on the
//!   wire by a connection that records every packed command.
//! - A batch is capped in bytes as well as rows, yet always claims at least one row; a row's
//!   headers and options count with its payload.
//! - A job larger than `--max-job-size` is dead-lettered as permanent with its size in
//!   `last_error`: by the claim itself when its payload is over the limit, through
//!   `Error::TooLarge` when only its marshalled form is.
//! - A job that makes Redis drop the connection (over `proto-max-bulk-len`) fails alone, as
//!   that job's failure, not as an outage.
//! - 200 rows of 2 MiB at default settings: the relay's peak RSS stays under 512 MiB
//!   (`FIGURES test=rss_200x2MiB peak_rss_kib=<n>`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::child::RelayChild;
use crate::common::redis_server::RedisServer;
use crate::common::*;
use chrono::Utc;
use jobrelay::broker::redis_sink::RedisSink;
use jobrelay::relay::queries::ROW_OVERHEAD_BYTES;
use jobrelay::relay::{BatchSettings, Batcher, Queries, Report};
use jobrelay::{Enqueuer, Job, Outcome, TableName};
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{Cmd, Pipeline, RedisFuture, Value};
use sqlx::PgPool;
use uuid::Uuid;

const TTL: Duration = Duration::from_secs(600);
const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// One command as it went on the wire: its name, argument count (name included), packed size,
/// and whether Redis answered it without an error (a NOSCRIPT answer is retried by redis-rs).
#[derive(Debug, Clone)]
struct Sent {
    name: String,
    args: usize,
    bytes: usize,
    answered: bool,
}

/// A connection that records every command sent through it.
struct Recording {
    inner: MultiplexedConnection,
    sent: Arc<Mutex<Vec<Sent>>>,
}

impl ConnectionLike for Recording {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let name = match cmd.args_iter().next() {
            Some(redis::Arg::Simple(n)) => String::from_utf8_lossy(n).to_uppercase(),
            _ => String::new(),
        };
        let (args, bytes) = (cmd.args_iter().len(), cmd.get_packed_command().len());
        Box::pin(async move {
            let reply = self.inner.req_packed_command(cmd).await;
            let answered = matches!(&reply, Ok(v) if !matches!(v, Value::ServerError(_)));
            let sent = Sent {
                name,
                args,
                bytes,
                answered,
            };
            self.sent.lock().unwrap().push(sent);
            reply
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        p: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        panic!(
            "the enqueuer pipelined {} bytes ({offset}, {count})",
            p.get_packed_pipeline().len()
        )
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}

/// What an `EVALSHA` costs besides its jobs: the name, the sha1, the key count, the namespace
/// and TTL arguments, and up to three more digits in the array header (`*5` to `*4005` for
/// 1,000 jobs of 4 arguments each).
fn fixed_call_overhead(ns: &str) -> usize {
    let empty = redis::cmd("EVALSHA")
        .arg("0".repeat(40))
        .arg(0)
        .arg(ns)
        .arg(TTL.as_millis() as u64)
        .get_packed_command();
    empty.len() + 3
}

/// A job with `size` bytes of payload; `routed` fills every routing field (the longest script
/// arguments a job can have) with a dead parent, so it still lands in its queue.
fn job(queue: &str, size: usize, routed: bool) -> Job {
    Job {
        uuid: Uuid::new_v4(),
        queue: queue.into(),
        job_type: "Sized".into(),
        payload: (0..size).map(|i| (i % 251) as u8).collect(),
        parent_uuid: routed.then(Uuid::new_v4),
        predecessor_uuid: routed.then(Uuid::new_v4),
        dead_parent: routed,
        run_at: routed.then(|| Utc::now() - chrono::Duration::hours(1)),
        created_at: Utc::now(),
        headers: Default::default(),
        options: Default::default(),
        ordering_key: None,
    }
}

/// Inserts one row per size into `queue` (payloads of exactly that many bytes, distinct per
/// row); their uuids in `id` order.
async fn insert_sized(pool: &PgPool, queue: &str, sizes: &[i64]) -> Vec<Uuid> {
    sqlx::query_scalar(
        "WITH ins AS (
             INSERT INTO pending_jobs (queue, job_type, payload)
             SELECT $1, 'Sized',
                    substring(convert_to(repeat(md5(n::text), (s / 32 + 1)::int), 'UTF8')
                              FROM 1 FOR s::int)
             FROM unnest($2::int8[]) WITH ORDINALITY AS t(s, n) ORDER BY n
             RETURNING id, uuid)
         SELECT uuid FROM ins ORDER BY id",
    )
    .bind(queue)
    .bind(sizes)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// A batcher on `pending_jobs` with these limits, pushing to `ns` through the same limits.
async fn batcher(
    pool: &PgPool,
    ns: &Namespace,
    batch_size: usize,
    max_batch_bytes: usize,
    max_job_bytes: usize,
) -> Batcher<RedisSink> {
    let enqueuer =
        Enqueuer::new(ns.prefix.clone(), TTL).with_limits(max_job_bytes, max_batch_bytes);
    let sink = RedisSink::new(enqueuer, ns.manager().await.into(), Duration::from_secs(5));
    let settings = BatchSettings {
        batch_size,
        max_batch_bytes,
        max_job_bytes,
        ..BatchSettings::default()
    };
    let queries = Arc::new(Queries::new(&TableName::default()));
    Batcher::new(pool.clone(), queries, Arc::new(settings), sink)
}

/// Runs batches until one claims nothing; each batch's report.
async fn drain(b: &Batcher<RedisSink>) -> Vec<Report> {
    let mut reports = Vec::new();
    loop {
        let r = b.run_once(None).await.expect("batch succeeds");
        if r.claimed == 0 {
            return reports;
        }
        reports.push(r);
    }
}

async fn queue_uuids(ns: &Namespace, queue: &str) -> Vec<Uuid> {
    let jobs = ns.list_jobs(&format!("queue:{queue}")).await;
    jobs.iter().map(|j| j.uuid.parse().unwrap()).collect()
}

async fn dead_count(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM pending_jobs_dead")
        .fetch_one(pool)
        .await
        .unwrap()
}

// ---------------------------------------------------------------------------------------------
// 1. One script call never carries more than the cap.
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn one_script_call_never_carries_more_than_the_cap() {
    let redis = RedisServer::start();
    let ns = Namespace::on(&redis.url());
    let (cap, max_job) = (MIB, 2 * MIB);
    // 300 jobs of 100 KiB with one of 1.5 MiB (over the cap alone) among them; then 2,000
    // small jobs with every routing field: the most bytes of script arguments per job.
    let mut jobs: Vec<Job> = (0..300)
        .map(|i| job("big", if i == 150 { 3 * MIB / 2 } else { 100 * KIB }, false))
        .collect();
    jobs.extend((0..2000).map(|_| job("routed", KIB, true)));
    let sent = Arc::new(Mutex::new(Vec::new()));
    let mut con = Recording {
        inner: ns.con().await,
        sent: sent.clone(),
    };
    let enqueuer = Enqueuer::new(ns.prefix.clone(), TTL).with_limits(max_job, cap);
    let results = enqueuer.enqueue_batch(&mut con, &jobs).await.unwrap();
    assert!(results.iter().all(|r| matches!(r, Ok(Outcome::Queued))));

    let fixed = fixed_call_overhead(&ns.prefix);
    let calls: Vec<Sent> = sent.lock().unwrap().clone();
    let calls: Vec<&Sent> = calls
        .iter()
        .filter(|c| c.name.starts_with("EVAL") && c.answered)
        .collect();
    let (mut carried, mut largest) = (0, 0);
    for c in &calls {
        let n = (c.args - 5) / 4;
        carried += n;
        if n > 1 {
            largest = largest.max(c.bytes);
            assert!(c.bytes <= cap + fixed, "{n} jobs in {} bytes", c.bytes);
        }
    }
    println!(
        "FIGURES test=call_cap cap={cap} fixed_overhead={fixed} calls={} largest_multi_job_call={largest}",
        calls.len()
    );
    assert_eq!(
        carried,
        jobs.len(),
        "every job was carried by exactly one call"
    );
    assert!(calls.len() > 30, "split by bytes: {} calls", calls.len());
    let alone = |c: &&&Sent| c.args == 9 && c.bytes > cap;
    assert_eq!(
        calls.iter().filter(alone).count(),
        1,
        "the 1.5 MiB job went alone"
    );
    // Every job landed exactly once.
    let mut got = queue_uuids(&ns, "big").await;
    got.extend(queue_uuids(&ns, "routed").await);
    let want: Vec<Uuid> = jobs.iter().map(|j| j.uuid).collect();
    assert_eq!(got, want);
}

// ---------------------------------------------------------------------------------------------
// 2. A batch is capped in bytes, but claims at least one row.
// ---------------------------------------------------------------------------------------------

/// The batches a byte cap makes of `sizes`: greedy, in order, at least one row each.
fn expected_batches(sizes: &[i64], cap: i64) -> Vec<u64> {
    let mut batches = vec![];
    let (mut n, mut bytes) = (0, 0);
    for s in sizes {
        if n > 0 && bytes + s + ROW_OVERHEAD_BYTES > cap {
            batches.push(n);
            (n, bytes) = (0, 0);
        }
        (n, bytes) = (n + 1, bytes + s + ROW_OVERHEAD_BYTES);
    }
    batches.push(n);
    batches
}

#[sqlx::test]
async fn a_batch_is_capped_in_bytes_but_claims_at_least_one_row(pool: PgPool) {
    let ns = Namespace::new();
    let cap = 35_000;
    // Three 10 kB rows fit (30,600 bytes with their overhead), a fourth does not; the 50 kB
    // row is over the cap on its own.
    let mut sizes = vec![10_000; 7];
    sizes.push(50_000);
    sizes.extend([10_000; 5]);
    let uuids = insert_sized(&pool, "capped", &sizes).await;
    let b = batcher(&pool, &ns, 100, cap as usize, 100 * KIB).await;

    let first = b.run_once(None).await.unwrap();
    assert_eq!(first.claimed, 3);
    assert_eq!(
        pending_count(&pool).await,
        sizes.len() as i64 - 3,
        "the rest stay pending"
    );
    let mut claimed = vec![first.claimed];
    claimed.extend(drain(&b).await.iter().map(|r| r.claimed));
    assert_eq!(claimed, expected_batches(&sizes, cap));
    assert_eq!(claimed, [3, 3, 1, 1, 3, 2]);
    assert_eq!(
        queue_uuids(&ns, "capped").await,
        uuids,
        "delivered in id order"
    );
    assert_eq!(dead_count(&pool).await, 0);
}

#[sqlx::test]
async fn headers_and_options_count_against_the_byte_cap(pool: PgPool) {
    let ns = Namespace::new();
    let cap = 35_000;
    // One-byte payloads whose headers carry 8,000 characters of hex each: the cap is reached by
    // the headers, which the claim returns and the relay holds as much as any payload.
    let uuids: Vec<Uuid> = sqlx::query_scalar(
        "WITH ins AS (
             INSERT INTO pending_jobs (queue, job_type, payload, headers)
             SELECT 'weighty', 'Sized', '\\x00'::bytea,
                    jsonb_build_object('trace', (SELECT string_agg(md5(n || ':' || i), '')
                                                 FROM generate_series(1, 250) i))
             FROM generate_series(1, 12) n ORDER BY n
             RETURNING id, uuid)
         SELECT uuid FROM ins ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let sizes: Vec<i64> = sqlx::query_scalar(
        "SELECT (octet_length(payload) + pg_column_size(headers) + pg_column_size(options))::int8
         FROM pending_jobs ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(
        sizes.iter().all(|&s| s > 8_000),
        "stored uncompressed: {sizes:?}"
    );
    let b = batcher(&pool, &ns, 100, cap as usize, 100 * KIB).await;

    let claimed: Vec<u64> = drain(&b).await.iter().map(|r| r.claimed).collect();
    assert_eq!(claimed, expected_batches(&sizes, cap));
    assert_eq!(claimed, [4, 4, 4]);
    assert_eq!(queue_uuids(&ns, "weighty").await, uuids);
    assert_eq!(dead_count(&pool).await, 0);
}

#[sqlx::test]
async fn a_sweep_relays_past_a_batch_capped_in_bytes(pool: PgPool) {
    let ns = Namespace::new();
    let uuids = insert_sized(&pool, "swept", &[20_000; 12]).await;
    let b = batcher(&pool, &ns, 100, 64 * KIB, 32 * KIB).await;
    let (report, result) = jobrelay::relay::sweep(&b, 100, Duration::ZERO).await;
    result.unwrap();
    assert_eq!(report.delivered(), 12, "{report}");
    assert_eq!(pending_count(&pool).await, 0);
    assert_eq!(queue_uuids(&ns, "swept").await, uuids);
}

// ---------------------------------------------------------------------------------------------
// 3. Jobs over --max-job-size are dead-lettered, with their size.
// ---------------------------------------------------------------------------------------------

#[sqlx::test]
async fn jobs_over_the_size_limit_are_dead_lettered_with_their_size(pool: PgPool) {
    let ns = Namespace::new();
    let max_job = 64 * KIB;
    let uuids = insert_sized(&pool, "sized", &[1000, 100_000, 1000, 70_000, 1000]).await;
    // A payload under the limit whose headers take the marshalled job over it.
    let padded: Uuid = sqlx::query_scalar(
        "INSERT INTO pending_jobs (queue, job_type, payload, headers)
         VALUES ('sized', 'Padded', convert_to(repeat('p', 60000), 'UTF8'),
                 jsonb_build_object('pad', repeat('h', 10000)))
         RETURNING uuid",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let md5 = "SELECT uuid, md5(payload) FROM pending_jobs ORDER BY id";
    let before: Vec<(Uuid, String)> = sqlx::query_as(md5).fetch_all(&pool).await.unwrap();

    let b = batcher(&pool, &ns, 100, 16 * MIB, max_job).await;
    let reports = drain(&b).await;
    let delivered: u64 = reports.iter().map(|r| r.delivered()).sum();
    let dead: u64 = reports.iter().map(|r| r.dead_lettered).sum();
    assert_eq!((delivered, dead), (3, 3), "{reports:?}");
    assert_eq!(
        queue_uuids(&ns, "sized").await,
        [uuids[0], uuids[2], uuids[4]]
    );

    let rows: Vec<(Uuid, i32, String, String)> = sqlx::query_as(
        "SELECT uuid, attempts, last_error, md5(payload) FROM pending_jobs_dead ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let want = [(uuids[1], 100_000), (uuids[3], 70_000)];
    for ((uuid, attempts, error, md5), (want_uuid, size)) in rows.iter().zip(want) {
        assert_eq!((*uuid, *attempts), (want_uuid, 1));
        assert!(
            error.contains(&format!("payload of {size} bytes")),
            "{error}"
        );
        assert!(error.contains(&format!("({max_job} bytes)")), "{error}");
        assert!(before.contains(&(*uuid, md5.clone())), "payload intact");
    }
    let (uuid, attempts, error, md5) = &rows[2];
    assert_eq!((*uuid, *attempts), (padded, 1));
    let size: usize = error
        .strip_prefix("job too large: ")
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{error}"));
    assert!(size > 70_000, "{error}");
    assert!(error.contains(&format!(
        "bytes marshalled, over --max-job-size ({max_job} bytes)"
    )));
    assert!(before.contains(&(*uuid, md5.clone())), "payload intact");
}

// ---------------------------------------------------------------------------------------------
// 4. A job Redis drops the connection on fails alone.
// ---------------------------------------------------------------------------------------------

#[sqlx::test]
async fn a_job_redis_will_not_take_fails_alone_not_as_an_outage(pool: PgPool) {
    let redis = RedisServer::start_with(&["--proto-max-bulk-len", "1mb"]);
    let ns = Namespace::on(&redis.url());
    let mut sizes = vec![100; 5];
    sizes.extend([2 * MIB as i64, 7 * MIB as i64]);
    sizes.extend([100; 5]);
    let uuids = insert_sized(&pool, "mixed", &sizes).await;
    let db = database_url_of(&pool).await;
    let env = [
        ("DATABASE_URL", db.as_str()),
        ("REDIS_URL", &redis.url()),
        ("JOBRELAY_NAMESPACE", &ns.prefix),
    ];
    let (code, out, err) = run_relay(&["--sweep", "--older-than", "0s"], &env).await;
    assert_eq!(code, 1, "a row was not delivered\n{out}\n{err}");

    let small: Vec<Uuid> = [&uuids[..5], &uuids[7..]].concat();
    assert_eq!(queue_uuids(&ns, "mixed").await, small);
    let left: Vec<(Uuid, i32, String)> =
        sqlx::query_as("SELECT uuid, attempts, last_error FROM pending_jobs ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(left.len(), 2, "{left:?}");
    for ((uuid, attempts, error), want) in left.iter().zip(&uuids[5..7]) {
        assert_eq!((uuid, *attempts), (want, 1));
        assert!(
            error.starts_with(&format!("redis refused job {uuid}: ")),
            "{error}"
        );
    }
    // The 7 MiB job cannot even be written: Redis resets the connection instead of answering.
    let closed = format!("closed the connection on this job alone ({} bytes", 7 * MIB);
    assert!(left[1].2.contains(&closed), "{}", left[1].2);
    assert_eq!(dead_count(&pool).await, 0);
    assert!(err.contains("pushing its jobs one by one"), "{err}");
    for outage in [
        "unavailable",
        "not reachable",
        "batch failed",
        "partly acknowledged",
    ] {
        assert!(!err.contains(outage), "{outage}:\n{err}");
    }
}

// ---------------------------------------------------------------------------------------------
// 5. Peak RSS with 200 rows of 2 MiB at default settings.
// ---------------------------------------------------------------------------------------------

/// `VmHWM` (peak resident set) of process `pid`, in KiB.
fn peak_rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[sqlx::test]
async fn peak_rss_with_200_rows_of_2mib_stays_under_512mib(pool: PgPool) {
    // A private Redis: it holds 800 MB (jobs and markers) until the test ends.
    let redis = RedisServer::start();
    let ns = Namespace::on(&redis.url());
    sqlx::query(
        "INSERT INTO pending_jobs (queue, job_type, payload)
         SELECT 'rss', 'Big', convert_to(repeat(md5(i::text), 65536), 'UTF8')
         FROM generate_series(1, 200) AS i",
    )
    .execute(&pool)
    .await
    .unwrap();
    let db = database_url_of(&pool).await;
    let mut relay = RelayChild::start(&db, &redis.url(), &ns.prefix, &[]);
    wait_until("200 jobs in redis", Duration::from_secs(180), || async {
        ns.llen("queue:rss").await == 200
    })
    .await;
    let peak = peak_rss_kib(relay.pid());
    relay.signal("TERM");
    assert_eq!(relay.wait(Duration::from_secs(30)).await, Some(0));
    println!("FIGURES test=rss_200x2MiB peak_rss_kib={peak}");
    assert!(peak < 512 * 1024, "peak RSS {peak} KiB");
    assert_eq!(pending_count(&pool).await, 0);
}
