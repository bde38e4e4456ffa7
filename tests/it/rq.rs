//! The rq layout: with `--layout rq` the relay writes what RQ 2.x's client writes (the job hash
//! `rq:job:<uuid>`, the id on `rq:queue:<q>`, `rq:queues`, the scheduled registry), and a real,
//! unmodified `rq worker` (tests/it/common/rq.rs, JSON serializer, on a private redis-server)
//! runs each job exactly once, with its args, kwargs and headers (as the job's `meta`).
//!
//! `the_script_writes_rqs_keys_and_a_marker_of_its_own` needs no worker; the worker test starts
//! the workers and checks everything against them and RQ's own API.

use std::collections::HashMap;
use std::time::Duration;

use crate::common::http_relay::HttpRelay;
use crate::common::redis_server::RedisServer;
use crate::common::rq::{RqApp, Run};
use crate::common::*;
use chrono::{DateTime, Utc};
use jobrelay::producer::JobBuilder;
use jobrelay::{Enqueuer, Error, LayoutKind, Outcome};
use serde_json::{json, Value};
use sqlx::PgPool;
use uuid::Uuid;

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const QUEUES: [&str; 4] = ["a", "b", "c", "d"];
/// The function every job names, and the one of the SQL example in docs/layouts.md.
const FUNC: &str = "jobs.record";
const DOC_FUNC: &str = "app.tasks.send_welcome";

/// One row to insert.
struct Row {
    uuid: Uuid,
    queue: &'static str,
    payload: String,
    headers: Value,
    run_at: Option<DateTime<Utc>>,
    parent: Option<Uuid>,
    predecessor: Option<Uuid>,
}

impl Row {
    fn new(queue: &'static str, payload: String) -> Row {
        Row {
            uuid: Uuid::new_v4(),
            queue,
            payload,
            headers: json!({}),
            run_at: None,
            parent: None,
            predecessor: None,
        }
    }

    /// The args and kwargs the worker must receive, as JSON values.
    fn expected(&self) -> (Value, Value) {
        let v: Value = serde_json::from_str(&self.payload).unwrap();
        match v {
            Value::Array(_) => (v, json!({})),
            Value::Object(mut o) => (
                o.remove("args").unwrap_or(json!([])),
                o.remove("kwargs").unwrap_or(json!({})),
            ),
            other => panic!("not a fitting payload: {other}"),
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
    let headers: Vec<Value> = rows.iter().map(|r| r.headers.clone()).collect();
    let run_ats: Vec<Option<DateTime<Utc>>> = rows.iter().map(|r| r.run_at).collect();
    let parents: Vec<Option<Uuid>> = rows.iter().map(|r| r.parent).collect();
    let predecessors: Vec<Option<Uuid>> = rows.iter().map(|r| r.predecessor).collect();
    sqlx::query(
        "INSERT INTO pending_jobs (uuid, queue, job_type, payload, headers, run_at, parent_uuid,
                                   predecessor_uuid)
         SELECT u, q, $8, p, h, r, pa, pr
         FROM unnest($1::uuid[], $2::text[], $3::bytea[], $4::jsonb[], $5::timestamptz[],
                     $6::uuid[], $7::uuid[]) AS t(u, q, p, h, r, pa, pr)",
    )
    .bind(&uuids)
    .bind(&queues)
    .bind(&payloads)
    .bind(&headers)
    .bind(&run_ats)
    .bind(&parents)
    .bind(&predecessors)
    .bind(FUNC)
    .execute(ex)
    .await
    .expect("rows inserted");
}

/// A payload of its own for job `i`: args alone (an array) or args and kwargs (an object),
/// with strings, quotes, unicode, nesting, large and fractional numbers, and long values (for
/// the description's cut).
fn payload(i: usize) -> String {
    match i % 5 {
        0 => format!("[{i}, \"job {i}\", null, true]"),
        1 => format!(
            r#"{{"args": [{i}, 2.50, -17, 12345678901234567, 1e16, 1e-5], "kwargs": {{"name": "z\u00fcrich \"{i}\"", "n": {{"deep": [1, [2, [3]]]}}}}}}"#
        ),
        2 => format!(r#"{{"kwargs": {{"only": {i}, "it's": "quote'd", "z": "a\tb\\c"}}}}"#),
        3 => format!(r#"[[{i}], {{"x": 1e3, "y": false}}, "\ud83d\ude00 {i}", "it's \"both\""]"#),
        _ => format!(
            r#"{{"args": ["{}"], "kwargs": {{"long": [{}], "b": 0.1}}}}"#,
            "w".repeat(80 + i % 7),
            (0..40)
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The ```sql block of docs/layouts.md's rq section.
fn doc_sql() -> String {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/layouts.md")).unwrap();
    let section = doc.split("\n## rq").nth(1).expect("an rq section");
    let block = section
        .split("```sql\n")
        .nth(1)
        .expect("a sql block in the rq section");
    block.split("```").next().unwrap().to_owned()
}

/// Waits until `pool` has no pending row.
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

fn epoch(t: DateTime<Utc>) -> f64 {
    t.timestamp_micros() as f64 / 1e6
}

/// What RQ's API says of the queues and their registries, as JSON: per queue `count`
/// (`Queue.count`), `scheduled`, `finished`, `failed`, `deferred` (the registries' `count`).
const RQ_API: &str = r#"
import json, os
from redis import Redis
from rq import Queue
from rq.registry import FinishedJobRegistry, FailedJobRegistry, ScheduledJobRegistry, DeferredJobRegistry
from rq.serializers import JSONSerializer
r = Redis.from_url(os.environ["JOBRELAY_TEST_REDIS"])
out = {}
for q in Queue.all(connection=r, serializer=JSONSerializer):
    out[q.name] = {
        "count": q.count,
        "scheduled": ScheduledJobRegistry(queue=q).count,
        "finished": FinishedJobRegistry(queue=q).count,
        "failed": FailedJobRegistry(queue=q).count,
        "deferred": DeferredJobRegistry(queue=q).count,
    }
print(json.dumps(out, sort_keys=True))
"#;

fn rq_api(app: &RqApp) -> Value {
    serde_json::from_str(&app.python(RQ_API)).unwrap()
}

/// 1,000 jobs over 4 queues in 10 transactions, behind a malformed row and two flow rows, the
/// SQL of docs/layouts.md, 20 delayed jobs beside 20 scheduled by RQ's own client
/// (`Queue.enqueue_at`), and a replay of 50 relayed rows (after RQ's job hash was deleted, for
/// some): the real worker runs each job once, with its args, kwargs and meta, no earlier than
/// its run_at, and nothing twice; RQ's API agrees at each step.
#[sqlx::test]
async fn an_rq_worker_runs_relayed_jobs_exactly_once(pool: PgPool) {
    let redis = RedisServer::start();
    let url = redis.url();
    let relay = HttpRelay::start(&pool, &url, "", &["--layout", "rq"]).await;
    let app = RqApp::new(&url);

    // The backlog, committed before any worker starts: a transaction with a malformed row and
    // two flow rows, then 10 transactions of 100 jobs.
    let malformed = Row::new("a", "{\"args\": 1}".into());
    let heir = Row {
        predecessor: Some(Uuid::new_v4()),
        ..Row::new("a", "[1]".into())
    };
    let child = Row {
        parent: Some(Uuid::new_v4()),
        ..Row::new("a", "[2]".into())
    };
    let dead = [malformed.uuid, heir.uuid, child.uuid];
    let mut rows: Vec<Row> = (0..1000)
        .map(|i| {
            let mut r = Row::new(QUEUES[i % 4], payload(i));
            if i % 10 == 0 {
                r.headers = json!({"traceparent": TRACEPARENT, "tenant": "acme"});
            }
            r
        })
        .collect();
    let mut tx = pool.begin().await.unwrap();
    insert(&mut *tx, &[malformed, heir, child]).await;
    tx.commit().await.unwrap();
    for chunk in rows.chunks(100) {
        let mut tx = pool.begin().await.unwrap();
        insert(&mut *tx, chunk).await;
        tx.commit().await.unwrap();
    }
    // The docs' example, as a Python app would run it in its transaction.
    let mut tx = pool.begin().await.unwrap();
    sqlx::raw_sql(&doc_sql()).execute(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
    relayed(&pool, "the backlog relayed").await;

    let dead_rows: Vec<(Uuid, String)> =
        sqlx::query_as("SELECT uuid, last_error FROM pending_jobs_dead ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        dead_rows.iter().map(|(u, _)| *u).collect::<Vec<_>>(),
        dead.to_vec()
    );
    for ((_, e), want) in dead_rows.iter().zip([
        "\"args\" is not an array",
        "predecessor_uuid",
        "parent_uuid",
    ]) {
        assert!(
            e.contains("does not fit the rq layout") && e.contains(want),
            "{e}"
        );
    }

    // RQ's API sees the queued jobs before any worker runs.
    let api = rq_api(&app);
    for q in QUEUES {
        assert_eq!(api[q]["count"], 250, "Queue({q}).count: {api}");
    }
    assert_eq!(api["emails"]["count"], 1, "{api}");
    // The job hashes, read by RQ: function, args, kwargs, meta, status, origin, and a
    // description as RQ's own get_call_string makes it; and the same hash fields as a job
    // that RQ's client enqueues.
    let check = app.python(
        r#"
import json, os
from redis import Redis
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer
from rq.utils import get_call_string
r = Redis.from_url(os.environ["JOBRELAY_TEST_REDIS"])
own = Queue("shape", connection=r, serializer=JSONSerializer).enqueue("jobs.record", 1, meta={"k": "v"})
own_fields = sorted(k.decode() for k in r.hkeys(own.key))
own.delete()
bad, n, with_meta = [], 0, 0
for name in ["a", "b", "c", "d", "emails"]:
    q = Queue(name, connection=r, serializer=JSONSerializer)
    for job in q.get_jobs():
        n += 1
        want = get_call_string(job.func_name, job.args, job.kwargs, max_length=75)
        if job.description != want:
            bad.append([job.description, want])
        if job.get_status() != "queued" or job.origin != name or job.enqueued_at is None:
            bad.append([job.id, job.get_status(), job.origin])
        keys = sorted(k.decode() for k in r.hkeys(job.key))
        if job.meta:
            with_meta += 1
            if keys != own_fields:
                bad.append([keys, own_fields])
print(json.dumps({"n": n, "bad": bad[:5], "nbad": len(bad), "with_meta": with_meta}))
"#,
    );
    let check: Value = serde_json::from_str(&check).unwrap();
    assert_eq!(check["n"], 1001, "{check}");
    assert_eq!(check["nbad"], 0, "{check}");
    assert_eq!(check["with_meta"], 100, "{check}");

    // A burst worker runs the backlog and exits.
    let mut queues = QUEUES.to_vec();
    queues.push("emails");
    let mut burst = app.worker("burst", &queues, &["--burst"]);
    burst.wait_exit(Duration::from_secs(120)).await;
    let backlog = rows.len() + 1;
    let runs = app
        .wait_runs(backlog, Duration::from_secs(5), || burst.logs())
        .await;
    assert_eq!(runs.len(), backlog, "runs of the backlog");
    let api = rq_api(&app);
    for q in QUEUES {
        assert_eq!(
            (&api[q]["count"], &api[q]["finished"], &api[q]["failed"]),
            (&json!(0), &json!(250), &json!(0)),
            "{q}: {api}"
        );
    }
    let info = std::process::Command::new(crate::common::rq::rq_bin())
        .args(["info", "--raw", "--only-queues", "--url", &url])
        .output()
        .unwrap();
    let info = String::from_utf8_lossy(&info.stdout).into_owned();
    for q in QUEUES {
        let line = format!("queue {q} 0, 0 executing, 250 finished, 0 failed");
        assert!(info.lines().any(|l| l == line), "rq info: {info}");
    }

    // 20 jobs due a few seconds from now, and 20 from RQ's client with the same time, to an
    // idle worker with its scheduler.
    let due = DateTime::from_timestamp_micros(
        (Utc::now() + chrono::Duration::milliseconds(4_500)).timestamp_micros(),
    )
    .unwrap();
    let delayed: Vec<Row> = (0..20)
        .map(|i| Row {
            run_at: Some(due),
            ..Row::new(QUEUES[i % 4], format!("[\"delayed\", {i}]"))
        })
        .collect();
    insert(&pool, &delayed).await;
    let baseline: Vec<String> = app
        .python(&format!(
            "import datetime, os\nfrom redis import Redis\nfrom rq import Queue\n\
             from rq.serializers import JSONSerializer\n\
             r = Redis.from_url(os.environ['JOBRELAY_TEST_REDIS'])\n\
             due = datetime.datetime.fromtimestamp({}, datetime.timezone.utc)\n\
             for i in range(20):\n    \
                 q = Queue('abcd'[i % 4], connection=r, serializer=JSONSerializer)\n    \
                 print(q.enqueue_at(due, 'jobs.record', 'baseline', i).id)\n",
            epoch(due)
        ))
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(baseline.len(), 20);
    relayed(&pool, "the delayed rows relayed").await;
    let api = rq_api(&app);
    let scheduled: i64 = QUEUES
        .iter()
        .map(|q| api[q]["scheduled"].as_i64().unwrap())
        .sum();
    assert!(
        Utc::now() < due,
        "the test was too slow to look at the scheduled registries before run_at"
    );
    assert_eq!(scheduled, 40, "ScheduledJobRegistry counts: {api}");
    let worker = app.worker("scheduler", &queues, &["--with-scheduler"]);
    let expected_runs = backlog + delayed.len() + baseline.len();
    let runs = app
        .wait_runs(expected_runs, Duration::from_secs(30), || worker.logs())
        .await;

    let runs_by_id = by_id(&runs);
    for r in rows.iter().chain(&delayed) {
        let got = runs_by_id
            .get(r.uuid.to_string().as_str())
            .unwrap_or_else(|| panic!("job {} did not run", r.uuid));
        assert_eq!(got.len(), 1, "job {} ran {} times", r.uuid, got.len());
        let (args, kwargs) = r.expected();
        assert_eq!(
            (&got[0].args, &got[0].kwargs),
            (&args, &kwargs),
            "{}",
            r.payload
        );
        assert_eq!(got[0].func, FUNC);
        assert_eq!(got[0].meta, r.headers, "meta");
    }
    let doc_runs: Vec<&Run> = runs.iter().filter(|r| r.func == DOC_FUNC).collect();
    assert_eq!(doc_runs.len(), 1, "the docs' example");
    assert_eq!(doc_runs[0].args, json!([42]));
    assert_eq!(doc_runs[0].kwargs, json!({"lang": "de"}));
    for d in &dead {
        assert!(
            !runs_by_id.contains_key(d.to_string().as_str()),
            "dead {d} ran"
        );
    }
    assert_eq!(runs.len(), expected_runs, "runs");

    // Delays: not before run_at; at most 2 s behind RQ's own scheduling.
    let due_s = epoch(due);
    let delay = |ids: &mut dyn Iterator<Item = String>| -> Vec<f64> {
        ids.map(|id| runs_by_id[id.as_str()][0].at - due_s)
            .collect()
    };
    let relayed_delays = delay(&mut delayed.iter().map(|r| r.uuid.to_string()));
    let baseline_delays = delay(&mut baseline.iter().cloned());
    let max = |v: &[f64]| v.iter().cloned().fold(f64::MIN, f64::max);
    let min = |v: &[f64]| v.iter().cloned().fold(f64::MAX, f64::min);
    eprintln!(
        "run_at delays: relayed {:.3}..{:.3} s, RQ's enqueue_at {:.3}..{:.3} s",
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
        "relayed {relayed_delays:?}, RQ's enqueue_at {baseline_delays:?}"
    );

    // A replay of 50 relayed rows after they ran: for 20 of them RQ's job hash is gone (as
    // after its result_ttl), for 10 jobrelay's marker is (RQ's finished job hash answers),
    // the rest have both. Duplicates, nothing queued, nothing run.
    let mut con = redis.con();
    let replay: Vec<Row> = rows
        .drain(..50)
        .map(|r| Row {
            headers: json!({}),
            ..r
        })
        .collect();
    for (i, r) in replay.iter().enumerate() {
        let key = match i {
            0..20 => format!("rq:job:{}", r.uuid),
            20..30 => format!("jobrelay:rq:{}", r.uuid),
            _ => continue,
        };
        let n: i64 = redis::cmd("DEL").arg(&key).query(&mut con).unwrap();
        assert_eq!(n, 1, "{key}");
    }
    insert(&pool, &replay).await;
    relayed(&pool, "the replay relayed").await;
    assert_eq!(relay.count("duplicate").await, 50.0, "duplicates");
    // A push lands in Redis before its row goes: nothing may be waiting now.
    let api = rq_api(&app);
    for q in QUEUES {
        assert_eq!(api[q]["count"], 0, "{q} after the replay: {api}");
    }
    for r in &replay[..20] {
        let exists: bool = redis::cmd("EXISTS")
            .arg(format!("rq:job:{}", r.uuid))
            .query(&mut con)
            .unwrap();
        assert!(!exists, "no job hash written for the replayed {}", r.uuid);
    }
    // The worker polls its queues every second or so: give it time to run a stray job.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(app.runs().len(), expected_runs, "runs after the replay");
    for log in [burst.logs(), worker.logs()] {
        let errors: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("ERROR") || l.contains("Traceback"))
            .collect();
        assert!(errors.is_empty(), "worker errors: {errors:#?}");
    }
}

/// The script alone, on the shared Redis under a namespace: the job hash, the id on the queue
/// (RPUSH: FIFO from the left, as RQ pops), `rq:queues`, the scheduled registry (score rounded
/// up), the marker `<ns>jobrelay:rq:<uuid>` (queue key, dedup TTL), duplicates by marker and by
/// job hash, and refusals that write nothing.
#[sqlx::test]
async fn the_script_writes_rqs_keys_and_a_marker_of_its_own(_pool: PgPool) {
    let ns = Namespace::new();
    let enqueuer =
        Enqueuer::new(ns.prefix.clone(), Duration::from_secs(60)).with_layout(LayoutKind::Rq);
    let mut con = ns.con().await;
    // The first job has headers (RQ's meta), the second none: the script's field table for
    // queued jobs is reused from job to job.
    let job = |n: i32| {
        let b = JobBuilder::new("mail.q", "app.tasks.send")
            .args_kwargs(&(n, "x"), &json!({"k": [true]}));
        let b = if n == 1 {
            b.header("traceparent", TRACEPARENT)
        } else {
            b
        };
        b.build().unwrap()
    };
    let (first, second) = (job(1), job(2));
    let later_at = Utc::now() + chrono::Duration::seconds(3600);
    let later = JobBuilder::new("mail.q", "app.tasks.send")
        .payload("[]")
        .run_at(later_at)
        .build()
        .unwrap();
    let jobs = [first.clone(), second.clone(), first.clone(), later.clone()];
    let results = enqueuer.enqueue_batch(&mut con, &jobs).await.unwrap();
    let outcomes: Vec<Outcome> = results.into_iter().map(|r| r.unwrap()).collect();
    assert_eq!(
        outcomes,
        vec![
            Outcome::Queued,
            Outcome::Queued,
            Outcome::Duplicate,
            Outcome::Scheduled
        ]
    );
    let mut want_keys = vec![
        format!("jobrelay:rq:{}", first.uuid),
        format!("jobrelay:rq:{}", second.uuid),
        format!("jobrelay:rq:{}", later.uuid),
        format!("rq:job:{}", first.uuid),
        format!("rq:job:{}", second.uuid),
        format!("rq:job:{}", later.uuid),
        "rq:queue:mail.q".to_owned(),
        "rq:queues".to_owned(),
        "rq:scheduled:mail.q".to_owned(),
    ];
    want_keys.sort();
    assert_eq!(ns.keys().await, want_keys);
    let ids: Vec<String> = redis::cmd("LRANGE")
        .arg(ns.key("rq:queue:mail.q"))
        .arg(0)
        .arg(-1)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(ids, vec![first.uuid.to_string(), second.uuid.to_string()]);
    let queues: Vec<String> = redis::cmd("SMEMBERS")
        .arg(ns.key("rq:queues"))
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(queues, vec![ns.key("rq:queue:mail.q")]);
    let scheduled: Vec<(String, f64)> = redis::cmd("ZRANGE")
        .arg(ns.key("rq:scheduled:mail.q"))
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(&mut con)
        .await
        .unwrap();
    let ceil = (later_at.timestamp_micros() as f64 / 1e6).ceil();
    assert_eq!(scheduled, vec![(later.uuid.to_string(), ceil)]);
    let hash: HashMap<String, Vec<u8>> = redis::cmd("HGETALL")
        .arg(ns.key(&format!("rq:job:{}", first.uuid)))
        .query_async(&mut con)
        .await
        .unwrap();
    let text = |k: &str| String::from_utf8(hash[k].clone()).unwrap();
    assert_eq!(text("status"), "queued");
    assert_eq!(text("origin"), "mail.q");
    assert_eq!(text("timeout"), "180");
    assert_eq!(text("description"), "app.tasks.send(1, 'x', k=[True])");
    assert_eq!(
        text("meta"),
        format!("{{\"traceparent\": \"{TRACEPARENT}\"}}")
    );
    assert_eq!(hash["data"][..2], [0x78, 0x01], "a zlib stream");
    assert!(
        text("enqueued_at").ends_with('Z'),
        "{}",
        text("enqueued_at")
    );
    let second_has_meta: bool = redis::cmd("HEXISTS")
        .arg(ns.key(&format!("rq:job:{}", second.uuid)))
        .arg("meta")
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(!second_has_meta, "the first job's meta stayed behind");
    let later_hash: HashMap<String, Vec<u8>> = redis::cmd("HGETALL")
        .arg(ns.key(&format!("rq:job:{}", later.uuid)))
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(later_hash["status"], b"scheduled");
    assert!(!later_hash.contains_key("enqueued_at"));
    assert!(!later_hash.contains_key("meta"));
    let marker = ns.key(&format!("jobrelay:rq:{}", first.uuid));
    let (value, ttl): (String, i64) = redis::pipe()
        .get(&marker)
        .pttl(&marker)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(value, ns.key("rq:queue:mail.q"));
    assert!((50_000..=60_000).contains(&ttl), "{ttl}");

    // Without its marker, RQ's job hash of the same id makes a job a duplicate.
    let _: () = redis::cmd("DEL")
        .arg(&marker)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(
        enqueuer.enqueue(&mut con, &first).await.unwrap(),
        Outcome::Duplicate
    );
    // A key of another type: the queue's list, rq:queues, or the job's own key refuses the
    // job, writing nothing.
    let third = job(3);
    let fourth = job(4);
    let refused = |key: String, j: jobrelay::Job, enqueuer: Enqueuer| {
        let ns = &ns;
        async move {
            let mut con = ns.con().await;
            let _: () = redis::cmd("SET")
                .arg(&key)
                .arg("x")
                .query_async(&mut con)
                .await
                .unwrap();
            match enqueuer.enqueue(&mut con, &j).await {
                Err(Error::Refused { message, .. }) => {
                    assert!(
                        message.contains("WRONGTYPE") && message.contains(&key),
                        "{message}"
                    )
                }
                other => panic!("{key}: {other:?}"),
            }
            let exists: i64 = redis::cmd("EXISTS")
                .arg(ns.key(&format!("jobrelay:rq:{}", j.uuid)))
                .arg(ns.key(&format!("rq:job:{}", j.uuid)))
                .query_async(&mut con)
                .await
                .unwrap();
            let job_key_is_ours = key.ends_with(&j.uuid.to_string());
            assert_eq!(exists, i64::from(job_key_is_ours), "{key}: nothing written");
            let _: () = redis::cmd("DEL")
                .arg(&key)
                .query_async(&mut con)
                .await
                .unwrap();
        }
    };
    let _: () = redis::cmd("DEL")
        .arg(ns.key("rq:queue:mail.q"))
        .arg(ns.key("rq:queues"))
        .query_async(&mut con)
        .await
        .unwrap();
    refused(ns.key("rq:queue:mail.q"), third.clone(), enqueuer.clone()).await;
    refused(ns.key("rq:queues"), third.clone(), enqueuer.clone()).await;
    refused(
        ns.key(&format!("rq:job:{}", fourth.uuid)),
        fourth,
        enqueuer.clone(),
    )
    .await;
    assert_eq!(
        enqueuer.enqueue(&mut con, &third).await.unwrap(),
        Outcome::Queued
    );
}

/// RQ has no Redis Cluster support: a Cluster URL in the rq layout is refused at start, one
/// line naming --layout, exit 2, before anything connects.
#[tokio::test]
async fn the_rq_layout_refuses_a_cluster_url() {
    let nowhere = format!("redis+cluster://127.0.0.1:{}", free_port());
    let (code, out, err) = run_relay(
        &["check"],
        &[
            ("DATABASE_URL", "postgres://nobody@127.0.0.1:1/x"),
            ("REDIS_URL", &nowhere),
            ("JOBRELAY_NAMESPACE", "{jobs}:"),
            ("JOBRELAY_LAYOUT", "rq"),
        ],
    )
    .await;
    assert_eq!(code, 2, "{out}{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {err}");
    assert!(
        lines[0].contains("--layout") && lines[0].contains("Cluster") && lines[0].contains("rq"),
        "{err}"
    );
}

/// The job hash's `description` and `data`, the relay's against RQ's own: 2,000 random payloads
/// (nesting, repeated keys, quotes, escapes, non-ASCII and non-printable characters, numbers of
/// every form, values on both sides of the 75-character cut) enqueued in the rq layout, then
/// read by RQ 2.12's Python: `data` through `zlib.decompress` and `json.loads`, the description
/// against `rq.utils.get_call_string(func, args, kwargs, max_length=75)`.
#[sqlx::test]
async fn descriptions_and_data_are_what_rq_makes_of_them(_pool: PgPool) {
    use rand::{Rng, SeedableRng};
    let ns = Namespace::new();
    let enqueuer =
        Enqueuer::new(ns.prefix.clone(), Duration::from_secs(60)).with_layout(LayoutKind::Rq);
    let mut con = ns.con().await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(23);
    let mut jobs = Vec::new();
    let mut payloads = Vec::new();
    for _ in 0..2000 {
        let size = [4, 40, 200][rng.random_range(0..3)];
        let args = random_container(&mut rng, b'[', 0, size);
        let kwargs = random_container(&mut rng, b'{', 0, size);
        let payload = format!(r#"{{"args": {args}, "kwargs": {kwargs}}}"#);
        jobs.push(
            JobBuilder::new("desc", "app.tasks.f")
                .payload(payload.clone())
                .build()
                .unwrap(),
        );
        payloads.push(payload);
    }
    for r in enqueuer.enqueue_batch(&mut con, &jobs).await.unwrap() {
        assert_eq!(r.unwrap(), Outcome::Queued);
    }
    let ids: Vec<String> = jobs.iter().map(|j| j.uuid.to_string()).collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ids.json");
    std::fs::write(&path, serde_json::to_string(&(&ids, &payloads)).unwrap()).unwrap();
    let app = RqApp::new(&ns.url);
    let out = app.python(&format!(
        r#"
import json, os, zlib
from redis import Redis
from rq.utils import get_call_string
r = Redis.from_url(os.environ["JOBRELAY_TEST_REDIS"])
ids, payloads = json.load(open({path:?}))
bad = []
for id, p in zip(ids, payloads):
    h = r.hgetall({prefix:?} + "rq:job:" + id)
    f, inst, args, kwargs = json.loads(zlib.decompress(h[b"data"]))
    want = json.loads(p)
    if (f, inst, args, kwargs) != ("app.tasks.f", None, want["args"], want["kwargs"]):
        bad.append(["data", p])
    d = h[b"description"].decode()
    rq = get_call_string(f, args, kwargs, max_length=75)
    if d != rq:
        bad.append([d, rq])
print(json.dumps({{"n": len(ids), "bad": bad[:5], "nbad": len(bad)}}))
"#,
        path = path.display().to_string(),
        prefix = ns.prefix,
    ));
    let out: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(out["n"], 2000, "{out}");
    assert_eq!(out["nbad"], 0, "{out:#}");
}

/// A random JSON array (`open` `[`) or object (`{`) of about `size` characters, as text.
fn random_container(rng: &mut impl rand::Rng, open: u8, depth: usize, size: usize) -> String {
    let n = match rng.random_range(0..10) {
        0 => 0,
        1 => size / 3 + 1,
        _ => rng.random_range(1..6),
    };
    let mut s = String::new();
    s.push(open as char);
    let mut keys: Vec<String> = Vec::new();
    for i in 0..n {
        if i > 0 {
            s.push_str(if rng.random_bool(0.5) { ", " } else { "," });
        }
        if rng.random_range(0..4) == 0 {
            s.push_str(" \n");
        }
        if open == b'{' {
            // Now and then a key given before.
            let key = match keys.len() {
                k if k > 0 && rng.random_range(0..6) == 0 => keys[rng.random_range(0..k)].clone(),
                _ => random_string(rng, size / (n + 1)),
            };
            keys.push(key.clone());
            s.push_str(&key);
            s.push_str(if rng.random_bool(0.5) { ": " } else { ":" });
        }
        s.push_str(&random_value(rng, depth + 1, size / (n + 1)));
    }
    s.push(if open == b'[' { ']' } else { '}' });
    s
}

fn random_value(rng: &mut impl rand::Rng, depth: usize, size: usize) -> String {
    const NUMBERS: &[&str] = &[
        "0",
        "7",
        "-17",
        "2.50",
        "-0.0",
        "0.1",
        "1e5",
        "1E-7",
        "1e16",
        "1.5e+16",
        "123456789.123",
        "1e-5",
        "0.0001",
        "9007199254740993",
        "-9223372036854775808",
        "18446744073709551615",
        "5e-324",
        "1e308",
    ];
    match rng.random_range(0..10) {
        0 if depth < 6 => random_container(rng, b'[', depth, size),
        1 if depth < 6 => random_container(rng, b'{', depth, size),
        2 => NUMBERS[rng.random_range(0..NUMBERS.len())].to_owned(),
        3 => rng.random_range(-1_000_000i64..1_000_000).to_string(),
        4 => ["true", "false", "null"][rng.random_range(0..3)].to_owned(),
        _ => random_string(rng, size),
    }
}

/// A JSON string of up to about `size` characters, some of them escaped.
fn random_string(rng: &mut impl rand::Rng, size: usize) -> String {
    const PIECES: &[&str] = &[
        "a",
        "b",
        "word",
        " ",
        "'",
        "\\\"",
        "\\\\",
        "\\n",
        "\\t",
        "\\r",
        "\\/",
        "é",
        "\\u00e9",
        "😀",
        "\\ud83d\\ude00",
        "\\u0027",
        "ü",
        "x",
        "\\u0001",
        "\\u007f",
        "\\u00a0",
        "\\u00ad",
        "\\u0085",
        "\\u2028",
        "\\u200b",
        "\\ufeff",
        "\\u3000",
        "€",
        "日本",
    ];
    let len = rng.random_range(0..=size.max(1));
    let mut s = String::from("\"");
    let mut chars = 0;
    while chars < len {
        let p = PIECES[rng.random_range(0..PIECES.len())];
        s.push_str(p);
        chars += 1;
    }
    s.push('"');
    s
}
