//! The bullmq layout: with `--layout bullmq` the relay writes what BullMQ's `Queue.add` writes
//! (job hash, `id` counter, wait list, delayed set, marker, events stream), and a real,
//! unmodified BullMQ `Worker` (tests/it/common/bullmq.rs, on a private redis-server) runs each
//! job exactly once with its data, while `QueueEvents` and `Queue.getJobCounts` see the jobs as
//! their own.
//!
//! `the_script_writes_what_queue_add_writes` holds the script's keys to what BullMQ's own
//! `Queue.add` writes beside them; the worker test checks everything against the worker.

use std::collections::HashMap;
use std::time::Duration;

use crate::common::bullmq::{BullmqWorker, Run};
use crate::common::cluster::Cluster;
use crate::common::http_relay::HttpRelay;
use crate::common::redis_server::RedisServer;
use crate::common::*;
use chrono::{DateTime, Utc};
use jobrelay::producer::JobBuilder;
use jobrelay::{Enqueuer, Error, LayoutKind, Outcome};
use serde_json::{json, Value};
use sqlx::PgPool;
use uuid::Uuid;

const QUEUES: [&str; 4] = ["a", "b", "c", "d"];
/// The name every job has.
const NAME: &str = "record";
/// BullMQ's default prefix, and the relay's namespace for it.
const PREFIX: &str = "bull";
const NS: &str = "bull:";

/// One row to insert.
struct Row {
    uuid: Uuid,
    queue: &'static str,
    payload: String,
    run_at: Option<DateTime<Utc>>,
    parent: Option<Uuid>,
}

impl Row {
    fn new(queue: &'static str, payload: String) -> Row {
        Row {
            uuid: Uuid::new_v4(),
            queue,
            payload,
            run_at: None,
            parent: None,
        }
    }
}

async fn insert<'e, E: sqlx::PgExecutor<'e>>(ex: E, rows: &[Row]) {
    let uuids: Vec<Uuid> = rows.iter().map(|r| r.uuid).collect();
    let queues: Vec<&str> = rows.iter().map(|r| r.queue).collect();
    let payloads: Vec<Vec<u8>> = rows
        .iter()
        .map(|r| r.payload.clone().into_bytes())
        .collect();
    let run_ats: Vec<Option<DateTime<Utc>>> = rows.iter().map(|r| r.run_at).collect();
    let parents: Vec<Option<Uuid>> = rows.iter().map(|r| r.parent).collect();
    sqlx::query(
        "INSERT INTO pending_jobs (uuid, queue, job_type, payload, run_at, parent_uuid)
         SELECT u, q, $6, p, r, pa
         FROM unnest($1::uuid[], $2::text[], $3::bytea[], $4::timestamptz[], $5::uuid[])
              AS t(u, q, p, r, pa)",
    )
    .bind(&uuids)
    .bind(&queues)
    .bind(&payloads)
    .bind(&run_ats)
    .bind(&parents)
    .bind(NAME)
    .execute(ex)
    .await
    .expect("rows inserted");
}

/// A payload of its own for job `i`, written as `JSON.stringify` writes it (so that the data a
/// worker sees, stringified again, must equal it byte for byte): objects, arrays, strings with
/// unicode and escapes, nesting, fractions, large integers, a bare string and a number.
fn payload(i: usize) -> String {
    match i % 6 {
        0 => format!(r#"{{"i":{i},"s":"job {i}","n":null,"t":true}}"#),
        1 => format!(r#"[{i},2.5,-17,9007199254740991,"z√ºrich \"{i}\""]"#),
        2 => format!(r#"{{"deep":{{"a":[1,[2,[3,{{"b":"{i}"}}]]]}},"e":{{}},"l":[]}}"#),
        3 => format!(r#""a bare string {i} \\ \n 😀""#),
        4 => format!("{i}"),
        _ => format!(r#"{{"tab":"\t","q":"'","u":"\u0001","k{i}":-0.125}}"#),
    }
}

/// The ```sql block of docs/layouts.md's bullmq section.
fn doc_sql() -> String {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/layouts.md")).unwrap();
    let section = doc.split("\n## bullmq").nth(1).expect("a bullmq section");
    let block = section
        .split("```sql\n")
        .nth(1)
        .expect("a sql block in the bullmq section");
    block.split("```").next().unwrap().to_owned()
}

async fn relayed(pool: &PgPool, what: &str) {
    wait_until(what, Duration::from_secs(30), || async {
        pending_count(pool).await == 0
    })
    .await;
}

fn by_id(runs: &[Run]) -> HashMap<&str, Vec<&Run>> {
    let mut m: HashMap<&str, Vec<&Run>> = HashMap::new();
    for r in runs {
        m.entry(r.id.as_str()).or_default().push(r);
    }
    m
}

fn port_of(url: &str) -> u16 {
    url.rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .unwrap_or_else(|| panic!("a port in {url}"))
}

/// `Queue.getJobCounts()` of each queue, as JSON.
fn job_counts(worker: &BullmqWorker, queues: &[&str]) -> Value {
    let out = worker.node(&format!(
        "const {{ Queue }} = require('bullmq');\n\
         const connection = {{ host: '127.0.0.1', port: Number(process.env.JOBRELAY_TEST_PORT) }};\n\
         (async () => {{\n\
           const out = {{}};\n\
           for (const name of {queues}) {{\n\
             const q = new Queue(name, {{ connection, prefix: process.env.JOBRELAY_TEST_PREFIX }});\n\
             out[name] = await q.getJobCounts('waiting', 'active', 'delayed', 'completed', 'failed', 'paused', 'prioritized');\n\
             await q.close();\n\
           }}\n\
           console.log(JSON.stringify(out));\n\
         }})().catch((e) => {{ console.error(e); process.exit(1); }});\n",
        queues = serde_json::to_string(queues).unwrap()
    ));
    serde_json::from_str(out.trim()).unwrap()
}

/// 1,000 jobs over 4 queues in 10 transactions, a flow row and a malformed row among them,
/// the SQL of docs/layouts.md, 20 delayed jobs beside 20 that BullMQ's own `Queue.add` delays,
/// and a replay of 50 relayed rows after their jobs completed and were removed: the real worker
/// runs each job once with its data, no earlier than its run_at, nothing twice; `QueueEvents`
/// and `Queue.getJobCounts` agree.
#[sqlx::test]
async fn a_bullmq_worker_runs_relayed_jobs_exactly_once(pool: PgPool) {
    let redis = RedisServer::start();
    let url = redis.url();
    let relay = HttpRelay::start(&pool, &url, NS, &["--layout", "bullmq"]).await;

    // The backlog, committed before the worker starts: a flow row and a malformed row first,
    // then 10 transactions of 100 jobs.
    let flow = Row {
        parent: Some(Uuid::new_v4()),
        ..Row::new("a", "{}".into())
    };
    let malformed = Row::new("a", "{\"data\": ".into());
    let dead = [flow.uuid, malformed.uuid];
    let mut rows: Vec<Row> = (0..1000)
        .map(|i| Row::new(QUEUES[i % 4], payload(i)))
        .collect();
    let mut tx = pool.begin().await.unwrap();
    insert(&mut *tx, &[flow, malformed]).await;
    tx.commit().await.unwrap();
    for chunk in rows.chunks(100) {
        let mut tx = pool.begin().await.unwrap();
        insert(&mut *tx, chunk).await;
        tx.commit().await.unwrap();
    }
    let mut tx = pool.begin().await.unwrap();
    sqlx::raw_sql(&doc_sql()).execute(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
    relayed(&pool, "the backlog relayed").await;

    let mut con = redis.con();
    let lens: Vec<usize> = QUEUES
        .iter()
        .map(|q| {
            redis::cmd("LLEN")
                .arg(format!("{NS}{q}:wait"))
                .query(&mut con)
                .unwrap()
        })
        .collect();
    assert_eq!(lens, vec![250; 4], "LLEN bull:<q>:wait");
    let dead_rows: Vec<(Uuid, String)> =
        sqlx::query_as("SELECT uuid, last_error FROM pending_jobs_dead ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        dead_rows.iter().map(|(u, _)| *u).collect::<Vec<_>>(),
        dead.to_vec()
    );
    assert!(
        dead_rows[0].1.contains("does not fit the bullmq layout")
            && dead_rows[0].1.contains("no flows"),
        "{}",
        dead_rows[0].1
    );
    assert!(
        dead_rows[1].1.contains("does not fit the bullmq layout")
            && dead_rows[1].1.contains("not JSON"),
        "{}",
        dead_rows[1].1
    );

    let mut queues = QUEUES.to_vec();
    queues.push("emails");
    // BullMQ's own count of what waits, before any worker runs.
    let client_only = BullmqWorker::start(port_of(&url), PREFIX, &[]);
    let counts = job_counts(&client_only, &queues);
    for q in &queues {
        let waiting = if *q == "emails" { 1 } else { 250 };
        assert_eq!(counts[q]["waiting"], json!(waiting), "{q}: {counts}");
        for state in [
            "active",
            "delayed",
            "completed",
            "failed",
            "paused",
            "prioritized",
        ] {
            assert_eq!(counts[q][state], json!(0), "{q} {state}: {counts}");
        }
    }
    drop(client_only);
    let worker = BullmqWorker::start(port_of(&url), PREFIX, &queues);
    // BullMQ's own count of what waits, before any ran (the worker's QueueEvents are up, its
    // Workers may have started).
    let backlog = rows.len() + 1;
    let runs = worker.wait_runs(backlog, Duration::from_secs(60)).await;
    assert_eq!(runs.len(), backlog, "runs of the backlog");

    // 20 jobs due a few seconds from now, and 20 that BullMQ's own client delays to the same
    // moment, to idle workers.
    let due = DateTime::from_timestamp_micros(
        (Utc::now() + chrono::Duration::seconds(4)).timestamp_micros(),
    )
    .unwrap();
    let delayed: Vec<Row> = (0..20)
        .map(|i| Row {
            run_at: Some(due),
            ..Row::new(QUEUES[i % 4], format!("{{\"delayed\":{i}}}"))
        })
        .collect();
    insert(&pool, &delayed).await;
    let baseline: Vec<String> = worker
        .node(&format!(
            "const {{ Queue }} = require('bullmq');\n\
             const connection = {{ host: '127.0.0.1', port: Number(process.env.JOBRELAY_TEST_PORT) }};\n\
             (async () => {{\n\
               const qs = {{}};\n\
               for (const n of ['a', 'b', 'c', 'd']) qs[n] = new Queue(n, {{ connection, prefix: process.env.JOBRELAY_TEST_PREFIX }});\n\
               for (let i = 0; i < 20; i++) {{\n\
                 const job = await qs['abcd'[i % 4]].add('{NAME}', {{ baseline: i }}, {{ jobId: 'baseline-' + i, delay: Math.max(1, {due_ms} - Date.now()) }});\n\
                 console.log(job.id);\n\
               }}\n\
               for (const q of Object.values(qs)) await q.close();\n\
             }})().catch((e) => {{ console.error(e); process.exit(1); }});\n",
            due_ms = due.timestamp_millis()
        ))
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(baseline.len(), 20);
    relayed(&pool, "the delayed rows relayed").await;
    // While they are not due, BullMQ counts them as delayed (when this machine was quick
    // enough to ask in time).
    let counts = job_counts(&worker, &QUEUES);
    if Utc::now() + chrono::Duration::milliseconds(500) < due {
        for q in QUEUES {
            assert_eq!(counts[q]["delayed"], json!(10), "{q}: {counts}");
        }
    } else {
        eprintln!("delayed counts asked too late to hold: {counts}");
    }

    let expected_runs = backlog + delayed.len() + baseline.len();
    let runs = worker
        .wait_runs(expected_runs, Duration::from_secs(30))
        .await;
    let runs_by_id = by_id(&runs);
    for r in rows.iter().chain(&delayed) {
        let got = runs_by_id
            .get(r.uuid.to_string().as_str())
            .unwrap_or_else(|| panic!("job {} did not run", r.uuid));
        assert_eq!(got.len(), 1, "job {} ran {} times", r.uuid, got.len());
        assert_eq!(got[0].data, r.payload, "data, byte for byte");
        assert_eq!(got[0].name, NAME);
        assert_eq!(got[0].queue, r.queue);
        assert_eq!(got[0].attempts, 0, "Queue.add's default attempts");
        // (A worker promoting a delayed job sets its delay to 0: the script's test checks it.)
        assert_eq!(got[0].delay, 0.0);
        if let Some(at) = r.run_at {
            assert!(
                (got[0].timestamp as i64) < at.timestamp_millis(),
                "timestamp"
            );
        }
    }
    let doc_runs: Vec<&Run> = runs.iter().filter(|r| r.queue == "emails").collect();
    assert_eq!(doc_runs.len(), 1, "the docs' example");
    assert_eq!(doc_runs[0].name, "send-welcome");
    assert_eq!(doc_runs[0].data, r#"{"userId":42,"lang":"de"}"#);
    for d in &dead {
        assert!(
            !runs_by_id.contains_key(d.to_string().as_str()),
            "dead {d} ran"
        );
    }
    assert_eq!(runs.len(), expected_runs, "runs");

    // Delays: not before run_at; at most 2 s behind BullMQ's own delayed jobs.
    let due_s = due.timestamp_micros() as f64 / 1e6;
    let delay = |ids: &mut dyn Iterator<Item = String>| -> Vec<f64> {
        ids.map(|id| runs_by_id[id.as_str()][0].at - due_s)
            .collect()
    };
    let relayed_delays = delay(&mut delayed.iter().map(|r| r.uuid.to_string()));
    let baseline_delays = delay(&mut baseline.iter().cloned());
    let max = |v: &[f64]| v.iter().cloned().fold(f64::MIN, f64::max);
    let min = |v: &[f64]| v.iter().cloned().fold(f64::MAX, f64::min);
    eprintln!(
        "run_at delays: relayed {:.3}..{:.3} s, Queue.add's delay {:.3}..{:.3} s",
        min(&relayed_delays),
        max(&relayed_delays),
        min(&baseline_delays),
        max(&baseline_delays)
    );
    assert!(
        min(&relayed_delays) >= 0.0,
        "ran before run_at: {relayed_delays:?}"
    );
    assert!(
        max(&relayed_delays) <= max(&baseline_delays) + 2.0,
        "relayed {relayed_delays:?}, Queue.add's delay {baseline_delays:?}"
    );

    // QueueEvents saw each relayed job added, waiting (or delayed) and completed, once each.
    let relayed_jobs = rows.len() + delayed.len() + 1;
    wait_for_records(
        "completed events",
        relayed_jobs + baseline.len(),
        Duration::from_secs(30),
        || {
            let mut e = worker.events();
            e.retain(|e| e.event == "completed");
            e
        },
        || worker.logs(),
    )
    .await;
    let events = worker.events();
    let mut seen: HashMap<(&str, &str, &str), usize> = HashMap::new();
    for e in &events {
        *seen
            .entry((e.queue.as_str(), e.job_id.as_str(), e.event.as_str()))
            .or_default() += 1;
    }
    for r in &rows {
        let id = r.uuid.to_string();
        for ev in ["added", "waiting", "completed"] {
            assert_eq!(
                seen.get(&(r.queue, id.as_str(), ev)),
                Some(&1),
                "{ev} of {id}"
            );
        }
    }
    for r in &delayed {
        let id = r.uuid.to_string();
        for ev in ["added", "delayed", "completed"] {
            assert_eq!(
                seen.get(&(r.queue, id.as_str(), ev)),
                Some(&1),
                "{ev} of {id}"
            );
        }
    }

    // Everything completed and removed (removeOnComplete), as Queue.getJobCounts says.
    let counts = job_counts(&worker, &queues);
    for q in &queues {
        for (state, n) in counts[q].as_object().unwrap() {
            assert_eq!(n, &json!(0), "{q} {state}: {counts}");
        }
    }

    // A replay of 50 relayed rows after their jobs completed and their hashes were removed:
    // duplicates by jobrelay's marker (BullMQ's own check, the job hash, is gone), nothing
    // queued, nothing run.
    let replay: Vec<Row> = rows.drain(..50).collect();
    for r in &replay {
        let exists: bool = redis::cmd("EXISTS")
            .arg(format!("{NS}{}:{}", r.queue, r.uuid))
            .query(&mut con)
            .unwrap();
        assert!(!exists, "the hash of {} was removed on completion", r.uuid);
    }
    insert(&pool, &replay).await;
    relayed(&pool, "the replay relayed").await;
    assert_eq!(relay.count("duplicate").await, 50.0, "duplicates");
    for q in QUEUES {
        let n: usize = redis::cmd("LLEN")
            .arg(format!("{NS}{q}:wait"))
            .query(&mut con)
            .unwrap();
        assert_eq!(n, 0, "LLEN {q}:wait after the replay");
    }
    for r in &replay {
        let exists: bool = redis::cmd("EXISTS")
            .arg(format!("{NS}{}:{}", r.queue, r.uuid))
            .query(&mut con)
            .unwrap();
        assert!(!exists, "no job hash written again for {}", r.uuid);
    }
    // Give a wrongly queued job time to run, then count.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(worker.runs().len(), expected_runs, "runs after the replay");
    let logs = worker.logs();
    assert!(
        !logs.contains("error") && !logs.contains("failed"),
        "worker log: {logs}"
    );
}

/// `HGETALL` of `key` as a map.
fn hash(con: &mut redis::Connection, key: &str) -> HashMap<String, String> {
    redis::cmd("HGETALL").arg(key).query(con).unwrap()
}

/// The events stream of `queue` as (event, fields without the job id and the ids).
fn stream(con: &mut redis::Connection, key: &str) -> Vec<Vec<String>> {
    let v: Vec<(String, Vec<String>)> = redis::cmd("XRANGE")
        .arg(key)
        .arg("-")
        .arg("+")
        .query(con)
        .unwrap();
    v.into_iter().map(|(_, f)| f).collect()
}

/// The events stream, trimmed as BullMQ trims it: with `opts.maxLenEvents` at 150 (what a
/// `Queue` with `streams.events.maxLen: 150` writes into its meta hash), 300 jobs relayed in one
/// call leave the stream as long as 300 `Queue.add`s leave BullMQ's own, give or take one stream
/// node (an approximate trim drops whole nodes; the entries' ids differ).
#[sqlx::test]
async fn the_events_stream_is_trimmed_as_queue_add_trims_it(_pool: PgPool) {
    const JOBS: usize = 300;
    const MAX_EVENTS: usize = 150;
    let redis = RedisServer::start();
    let url = redis.url();
    let mut con = redis.con();
    for q in ["mine", "own"] {
        let _: () = redis::cmd("HSET")
            .arg(format!("{NS}{q}:meta"))
            .arg("opts.maxLenEvents")
            .arg(MAX_EVENTS)
            .query(&mut con)
            .unwrap();
    }
    let jobs: Vec<_> = (0..JOBS)
        .map(|i| {
            JobBuilder::new("mine", NAME)
                .payload(format!("{{\"i\":{i}}}"))
                .build()
                .unwrap()
        })
        .collect();
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut acon = client.get_multiplexed_async_connection().await.unwrap();
    let enqueuer =
        Enqueuer::new(NS.to_owned(), Duration::from_secs(60)).with_layout(LayoutKind::Bullmq);
    let results = enqueuer.enqueue_batch(&mut acon, &jobs).await.unwrap();
    assert!(results.iter().all(|r| matches!(r, Ok(Outcome::Queued))));
    let node = BullmqWorker::start(port_of(&url), PREFIX, &[]);
    node.node(&format!(
        "const {{ Queue }} = require('bullmq');\n\
         const connection = {{ host: '127.0.0.1', port: Number(process.env.JOBRELAY_TEST_PORT) }};\n\
         (async () => {{\n\
           const q = new Queue('own', {{ connection, prefix: process.env.JOBRELAY_TEST_PREFIX,\n\
             streams: {{ events: {{ maxLen: {MAX_EVENTS} }} }} }});\n\
           for (let i = 0; i < {JOBS}; i++) {{\n\
             await q.add('{NAME}', {{ i }}, {{ jobId: require('crypto').randomUUID() }});\n\
           }}\n\
           await q.close();\n\
         }})().catch((e) => {{ console.error(e); process.exit(1); }});\n"
    ));
    let len = |con: &mut redis::Connection, q: &str| -> usize {
        redis::cmd("XLEN")
            .arg(format!("{NS}{q}:events"))
            .query(con)
            .unwrap()
    };
    let (mine, own) = (len(&mut con, "mine"), len(&mut con, "own"));
    // Trimmed: at least maxLenEvents entries, less than one node (100 entries) more.
    for (q, n) in [("mine", mine), ("own", own)] {
        assert!(
            (MAX_EVENTS..MAX_EVENTS + 100).contains(&n),
            "{q}:events holds {n} of {} entries",
            2 * JOBS
        );
    }
    assert!(mine.abs_diff(own) < 100, "mine {mine}, BullMQ's own {own}");
    // The newest entry is the last job's `waiting`, as BullMQ's.
    let last: Vec<(String, Vec<String>)> = redis::cmd("XREVRANGE")
        .arg(format!("{NS}mine:events"))
        .arg("+")
        .arg("-")
        .arg("COUNT")
        .arg(1)
        .query(&mut con)
        .unwrap();
    let id = jobs[JOBS - 1].uuid.to_string();
    assert_eq!(last[0].1, ["event", "waiting", "jobId", id.as_str()]);
}

/// The script alone, on a private Redis, against BullMQ's own `Queue.add` of the same jobs in a
/// sibling queue: the same hash fields, events, id counter, marker and delayed score; dedup by
/// the marker and by BullMQ's own hash; a refusal; a paused queue.
#[sqlx::test]
async fn the_script_writes_what_queue_add_writes(_pool: PgPool) {
    let redis = RedisServer::start();
    let url = redis.url();
    let mut con = redis.con();
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut acon = client.get_multiplexed_async_connection().await.unwrap();
    let enqueuer =
        Enqueuer::new(NS.to_owned(), Duration::from_secs(60)).with_layout(LayoutKind::Bullmq);
    let worker_env_only = BullmqWorker::start(port_of(&url), PREFIX, &[]);

    let now_job = JobBuilder::new("mine", "send")
        .payload(r#"{"to":"a@b.c","n":[1,2.5]}"#)
        .header("traceparent", "00-ab-cd-01")
        .build()
        .unwrap();
    let later_job = JobBuilder::new("mine", "later")
        .payload("[1]")
        .delay(Duration::from_secs(3600))
        .build()
        .unwrap();
    let before = Utc::now().timestamp_millis();
    let results = enqueuer
        .enqueue_batch(
            &mut acon,
            &[now_job.clone(), later_job.clone(), now_job.clone()],
        )
        .await
        .unwrap();
    let after = Utc::now().timestamp_millis();
    assert!(matches!(results[0], Ok(Outcome::Queued)), "{results:?}");
    assert!(matches!(results[1], Ok(Outcome::Scheduled)), "{results:?}");
    assert!(matches!(results[2], Ok(Outcome::Duplicate)), "{results:?}");
    worker_env_only.node(&format!(
        "const {{ Queue }} = require('bullmq');\n\
         const connection = {{ host: '127.0.0.1', port: Number(process.env.JOBRELAY_TEST_PORT) }};\n\
         (async () => {{\n\
           const q = new Queue('own', {{ connection, prefix: process.env.JOBRELAY_TEST_PREFIX }});\n\
           await q.add('send', {{ to: 'a@b.c', n: [1, 2.5] }}, {{ jobId: '{a}' }});\n\
           await q.add('later', [1], {{ jobId: '{b}', delay: {delay} }});\n\
           await q.close();\n\
         }})().catch((e) => {{ console.error(e); process.exit(1); }});\n",
        a = now_job.uuid,
        b = later_job.uuid,
        delay = later_job.run_at.unwrap().timestamp_millis() - Utc::now().timestamp_millis(),
    ));

    // The job hashes: the same fields and values but for the moment and delay of the add.
    for (job, delayed) in [(&now_job, false), (&later_job, true)] {
        let mut mine = hash(&mut con, &format!("{NS}mine:{}", job.uuid));
        let mut own = hash(&mut con, &format!("{NS}own:{}", job.uuid));
        let ts: i64 = mine["timestamp"].parse().unwrap();
        assert!((before - 5..=after + 5).contains(&ts), "timestamp {ts}");
        if delayed {
            let d: i64 = mine["delay"].parse().unwrap();
            assert_eq!(
                ts + d,
                (job.run_at.unwrap().timestamp_micros() + 999) / 1000,
                "timestamp + delay = run_at (ms, rounded up)"
            );
            let opts: Value = serde_json::from_str(&mine["opts"]).unwrap();
            assert_eq!(
                opts,
                json!({"jobId": job.uuid.to_string(), "delay": d, "attempts": 0})
            );
            let own_opts: Value = serde_json::from_str(&own["opts"]).unwrap();
            assert_eq!(
                own_opts.as_object().unwrap().keys().collect::<Vec<_>>(),
                opts.as_object().unwrap().keys().collect::<Vec<_>>()
            );
            for h in [&mut mine, &mut own] {
                h.remove("delay");
                h.remove("opts");
            }
        }
        for h in [&mut mine, &mut own] {
            h.remove("timestamp");
        }
        assert_eq!(mine, own, "the job hash of {}", job.uuid);
    }
    // The id counter counts custom ids too; the meta hash has BullMQ's event limit.
    for q in ["mine", "own"] {
        let id: i64 = redis::cmd("GET")
            .arg(format!("{NS}{q}:id"))
            .query(&mut con)
            .unwrap();
        assert_eq!(id, 2, "{q}:id");
        let meta = hash(&mut con, &format!("{NS}{q}:meta"));
        assert_eq!(meta["opts.maxLenEvents"], "10000");
        let wait: Vec<String> = redis::cmd("LRANGE")
            .arg(format!("{NS}{q}:wait"))
            .arg(0)
            .arg(-1)
            .query(&mut con)
            .unwrap();
        assert_eq!(wait, vec![now_job.uuid.to_string()], "{q}:wait");
    }
    // The events: the same entries, but for the delayed event's due time.
    let strip = |mut s: Vec<Vec<String>>| {
        for e in &mut s {
            if e[1] == "delayed" {
                e.truncate(4);
            }
        }
        s
    };
    assert_eq!(
        strip(stream(&mut con, &format!("{NS}mine:events"))),
        strip(stream(&mut con, &format!("{NS}own:events")))
    );
    // The delayed set's score: the due millisecond times 0x1000; the marker: 0 for waiting
    // jobs, the next due time for delayed ones.
    let delayed: Vec<(String, f64)> = redis::cmd("ZRANGE")
        .arg(format!("{NS}mine:delayed"))
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(&mut con)
        .unwrap();
    let due_ms = (later_job.run_at.unwrap().timestamp_micros() + 999) / 1000;
    assert_eq!(
        delayed,
        vec![(later_job.uuid.to_string(), (due_ms * 4096) as f64)]
    );
    let marker: Vec<(String, f64)> = redis::cmd("ZRANGE")
        .arg(format!("{NS}mine:marker"))
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(&mut con)
        .unwrap();
    assert_eq!(
        marker,
        vec![("0".to_owned(), 0.0), ("1".to_owned(), due_ms as f64)]
    );
    // jobrelay's marker holds the job hash's key.
    let m: String = redis::cmd("GET")
        .arg(format!("{NS}jobrelay:bullmq:{}", now_job.uuid))
        .query(&mut con)
        .unwrap();
    assert_eq!(m, format!("{NS}mine:{}", now_job.uuid));

    // A job BullMQ already holds (its hash exists, no marker of ours): a duplicate, nothing
    // written, as BullMQ's own add.
    let theirs = JobBuilder::new("own", "send")
        .uuid(now_job.uuid)
        .payload("{}")
        .build()
        .unwrap();
    let r = enqueuer.enqueue(&mut acon, &theirs).await.unwrap();
    assert_eq!(r, Outcome::Duplicate);
    let own_wait: i64 = redis::cmd("LLEN")
        .arg(format!("{NS}own:wait"))
        .query(&mut con)
        .unwrap();
    assert_eq!(own_wait, 1, "nothing pushed");

    // A key of another type refuses the job and writes nothing for it.
    let _: () = redis::cmd("SET")
        .arg(format!("{NS}bad:events"))
        .arg("x")
        .query(&mut con)
        .unwrap();
    let bad = JobBuilder::new("bad", "send")
        .payload("{}")
        .build()
        .unwrap();
    match enqueuer.enqueue(&mut acon, &bad).await {
        Err(Error::Refused { message, .. }) => {
            assert!(
                message.contains("WRONGTYPE") && message.contains("bad:events"),
                "{message}"
            )
        }
        other => panic!("{other:?}"),
    }
    let keys: Vec<String> = redis::cmd("KEYS").arg("*bad*").query(&mut con).unwrap();
    assert_eq!(keys, vec![format!("{NS}bad:events")], "nothing written");
    // So does an id counter that is not an integer (INCRBY would fail mid-call).
    let _: () = redis::cmd("SET")
        .arg(format!("{NS}badid:id"))
        .arg("x1")
        .query(&mut con)
        .unwrap();
    let bad = JobBuilder::new("badid", "send")
        .payload("{}")
        .build()
        .unwrap();
    match enqueuer.enqueue(&mut acon, &bad).await {
        Err(Error::Refused { message, .. }) => {
            assert!(message.contains("not an integer"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    let keys: Vec<String> = redis::cmd("KEYS").arg("*badid*").query(&mut con).unwrap();
    assert_eq!(keys, vec![format!("{NS}badid:id")], "nothing written");
    let marker_exists: bool = redis::cmd("EXISTS")
        .arg(format!("{NS}jobrelay:bullmq:{}", bad.uuid))
        .query(&mut con)
        .unwrap();
    assert!(!marker_exists);

    // A paused queue: the job waits without the workers' marker (BullMQ 6); a paused queue of
    // BullMQ 5 (its meta's version) gets it in its paused list.
    for (q, version, list) in [
        ("p6", "bullmq:6.7.0", "wait"),
        ("p5", "bullmq:5.60.0", "paused"),
    ] {
        let _: () = redis::cmd("HSET")
            .arg(format!("{NS}{q}:meta"))
            .arg("paused")
            .arg(1)
            .arg("version")
            .arg(version)
            .query(&mut con)
            .unwrap();
        let job = JobBuilder::new(q, "send").payload("{}").build().unwrap();
        assert_eq!(
            enqueuer.enqueue(&mut acon, &job).await.unwrap(),
            Outcome::Queued
        );
        let items: Vec<String> = redis::cmd("LRANGE")
            .arg(format!("{NS}{q}:{list}"))
            .arg(0)
            .arg(-1)
            .query(&mut con)
            .unwrap();
        assert_eq!(items, vec![job.uuid.to_string()], "{q}:{list}");
        let marked: bool = redis::cmd("EXISTS")
            .arg(format!("{NS}{q}:marker"))
            .query(&mut con)
            .unwrap();
        assert!(!marked, "no marker for paused {q}");
    }
}

/// On a Redis Cluster, with BullMQ's prefix in a hash tag (`{bull}`, the relay's namespace
/// `{bull}:`): every key of the layout is in that one slot, and a BullMQ worker on ioredis's
/// Cluster client runs the relayed jobs, a delayed one too, once each with their data.
#[sqlx::test]
async fn a_bullmq_worker_on_a_redis_cluster_runs_relayed_jobs(pool: PgPool) {
    let cluster = Cluster::start().await;
    let _relay = HttpRelay::start(&pool, &cluster.url(), "{bull}:", &["--layout", "bullmq"]).await;
    let mut rows: Vec<Row> = (0..200)
        .map(|i| Row::new(QUEUES[i % 4], payload(i)))
        .collect();
    rows.push(Row {
        run_at: Some(Utc::now() + chrono::Duration::seconds(2)),
        ..Row::new("a", "{\"delayed\":true}".into())
    });
    insert(&pool, &rows).await;
    relayed(&pool, "the rows relayed").await;
    let slot = cluster.slot_of("{bull}:a:wait").await;
    for key in [
        "{bull}:b:events",
        "{bull}:c:meta",
        "{bull}:d:id",
        "{bull}:jobrelay:bullmq:x",
    ] {
        assert_eq!(cluster.slot_of(key).await, slot, "{key}");
    }
    let worker = BullmqWorker::start_on_cluster(cluster.nodes[0].port, "{bull}", &QUEUES);
    let runs = worker.wait_runs(rows.len(), Duration::from_secs(30)).await;
    let runs_by_id = by_id(&runs);
    for r in &rows {
        let got = runs_by_id
            .get(r.uuid.to_string().as_str())
            .unwrap_or_else(|| panic!("job {} did not run", r.uuid));
        assert_eq!(got.len(), 1, "job {} ran {} times", r.uuid, got.len());
        assert_eq!(got[0].data, r.payload);
        if let Some(at) = r.run_at {
            assert!(
                got[0].at >= at.timestamp_micros() as f64 / 1e6,
                "ran before run_at"
            );
        }
    }
    assert_eq!(runs.len(), rows.len());
}
