//! The celery layout: with `--layout celery` the relay writes kombu's message envelope (task
//! protocol 2, JSON) onto the queues' lists, and a real, unmodified Celery worker
//! (tests/it/common/celery.rs, on a private redis-server) runs each job exactly once, with its
//! args, kwargs and headers.
//!
//! `the_script_writes_kombus_list_and_a_marker_of_its_own` needs no worker; the worker test
//! starts one worker (Celery starts slowly) and checks everything against it.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use crate::common::celery::{CeleryWorker, Run};
use crate::common::http_relay::HttpRelay;
use crate::common::redis_server::RedisServer;
use crate::common::*;
use base64::Engine as _;
use chrono::{DateTime, Utc};
use jobrelay::producer::{JobBuilder, Producer};
use jobrelay::{Enqueuer, Error, LayoutKind, Outcome};
use serde_json::{json, Value};
use sqlx::PgPool;
use uuid::Uuid;

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const QUEUES: [&str; 4] = ["a", "b", "c", "d"];
/// The task every job names, and the one of the SQL example in docs/layouts.md.
const TASK: &str = "jobs.record";
const DOC_TASK: &str = "app.tasks.send_welcome";

/// One row to insert.
struct Row {
    uuid: Uuid,
    queue: &'static str,
    payload: String,
    headers: Value,
    run_at: Option<DateTime<Utc>>,
    parent: Option<Uuid>,
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
    let headers: Vec<&Value> = rows.iter().map(|r| &r.headers).collect();
    let run_ats: Vec<Option<DateTime<Utc>>> = rows.iter().map(|r| r.run_at).collect();
    let parents: Vec<Option<Uuid>> = rows.iter().map(|r| r.parent).collect();
    sqlx::query(
        "INSERT INTO pending_jobs (uuid, queue, job_type, payload, headers, run_at, parent_uuid)
         SELECT u, q, $7, p, h, r, pa
         FROM unnest($1::uuid[], $2::text[], $3::bytea[], $4::jsonb[], $5::timestamptz[],
                     $6::uuid[]) AS t(u, q, p, h, r, pa)",
    )
    .bind(&uuids)
    .bind(&queues)
    .bind(&payloads)
    .bind(headers.iter().map(|h| (*h).clone()).collect::<Vec<Value>>())
    .bind(&run_ats)
    .bind(&parents)
    .bind(TASK)
    .execute(ex)
    .await
    .expect("rows inserted");
}

/// A payload of its own for job `i`: args alone (an array) or args and kwargs (an object),
/// with strings, unicode, nesting, large and fractional numbers.
fn payload(i: usize) -> String {
    match i % 4 {
        0 => format!("[{i}, \"job {i}\", null, true]"),
        1 => format!(
            r#"{{"args": [{i}, 2.50, -17, 12345678901234567], "kwargs": {{"name": "z\u00fcrich \"{i}\"", "n": {{"deep": [1, [2, [3]]]}}}}}}"#
        ),
        2 => format!(r#"{{"kwargs": {{"only": {i}, "it's": "quote'd"}}}}"#),
        _ => format!(r#"[[{i}], {{"x": 1e3}}, "\ud83d\ude00 {i}"]"#),
    }
}

/// The ```sql block of docs/layouts.md's celery section.
fn doc_sql() -> String {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/layouts.md")).unwrap();
    let section = doc.split("\n## celery").nth(1).expect("a celery section");
    let block = section
        .split("```sql\n")
        .nth(1)
        .expect("a sql block in the celery section");
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

/// 1,000 jobs over 4 queues in 10 transactions, a flow row and a malformed row among them,
/// the SQL of docs/layouts.md, 20 delayed jobs beside 20 sent by celery's own client with an
/// ETA, and a replay of 50 relayed rows: the real worker runs each job once, with its args and
/// kwargs, no earlier than its run_at, and nothing twice.
#[sqlx::test]
async fn a_celery_worker_runs_relayed_jobs_exactly_once(pool: PgPool) {
    let redis = RedisServer::start();
    let url = redis.url();
    let relay = HttpRelay::start(&pool, &url, "", &["--layout", "celery"]).await;

    // The backlog, committed before the worker starts: 10 transactions of 100 jobs, the first
    // one opening with a flow row and a malformed row.
    let flow = Row {
        parent: Some(Uuid::new_v4()),
        ..Row::new("a", "[1]".into())
    };
    let malformed = Row::new("a", "{\"args\": 1}".into());
    let dead = [flow.uuid, malformed.uuid];
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
    insert(&mut *tx, &[flow, malformed]).await;
    tx.commit().await.unwrap();
    for chunk in rows.chunks(100) {
        let mut tx = pool.begin().await.unwrap();
        insert(&mut *tx, chunk).await;
        tx.commit().await.unwrap();
    }
    // The docs' example, as a Django app would run it in its transaction.
    let mut tx = pool.begin().await.unwrap();
    sqlx::raw_sql(&doc_sql()).execute(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
    relayed(&pool, "the backlog relayed").await;

    // The broker's queues hold the jobs before any worker runs.
    let mut con = redis.con();
    let lens: Vec<usize> = QUEUES
        .iter()
        .map(|q| redis::cmd("LLEN").arg(q).query(&mut con).unwrap())
        .collect();
    let emails: usize = redis::cmd("LLEN").arg("emails").query(&mut con).unwrap();
    assert_eq!(lens, vec![250; 4], "LLEN a b c d");
    assert_eq!(emails, 1, "LLEN emails (the docs' example)");
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
        dead_rows[0].1.contains("does not fit the celery layout")
            && dead_rows[0].1.contains("no parent or predecessor"),
        "{}",
        dead_rows[0].1
    );
    assert!(
        dead_rows[1].1.contains("does not fit the celery layout")
            && dead_rows[1].1.contains("\"args\" is not an array"),
        "{}",
        dead_rows[1].1
    );

    let mut queues = QUEUES.to_vec();
    queues.push("emails");
    let worker = CeleryWorker::start(&url, "", &queues, &[TASK, DOC_TASK]);
    let backlog = rows.len() + 1;
    worker.wait_runs(backlog, Duration::from_secs(30)).await;

    // 20 jobs due a few seconds from now, and 20 tasks with the same ETA from celery's client,
    // to an idle worker.
    let due = DateTime::from_timestamp_micros(
        (Utc::now() + chrono::Duration::seconds(4)).timestamp_micros(),
    )
    .unwrap();
    let delayed: Vec<Row> = (0..20)
        .map(|i| Row {
            run_at: Some(due),
            ..Row::new(QUEUES[i % 4], format!("[\"delayed\", {i}]"))
        })
        .collect();
    insert(&pool, &delayed).await;
    let baseline: Vec<String> = worker
        .python(&format!(
            "import datetime\nfrom app import app\n\
             eta = datetime.datetime.fromtimestamp({}, datetime.timezone.utc)\n\
             for i in range(20):\n    \
                 print(app.tasks['{TASK}'].apply_async(args=['baseline', i], queue='abcd'[i % 4], eta=eta).id)\n",
            epoch(due)
        ))
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(baseline.len(), 20);

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
        let (args, kwargs) = r.expected();
        assert_eq!(
            (&got[0].args, &got[0].kwargs),
            (&args, &kwargs),
            "{}",
            r.payload
        );
        assert_eq!(got[0].task, TASK);
        let traceparent = r.headers.get("traceparent").and_then(Value::as_str);
        assert_eq!(got[0].traceparent, traceparent.unwrap_or(""), "traceparent");
    }
    let doc_runs: Vec<&Run> = runs.iter().filter(|r| r.task == DOC_TASK).collect();
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

    // Delays: not before run_at; at most 2 s behind celery's own ETA handling.
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
        "run_at delays: relayed {:.3}..{:.3} s, celery's eta {:.3}..{:.3} s",
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
        "relayed {relayed_delays:?}, celery's eta {baseline_delays:?}"
    );

    // A replay of 50 relayed rows after they ran: duplicates, nothing queued, nothing run.
    let replay: Vec<Row> = rows
        .drain(..50)
        .map(|r| Row {
            headers: json!({}),
            ..r
        })
        .collect();
    insert(&pool, &replay).await;
    relayed(&pool, "the replay relayed").await;
    assert_eq!(relay.count("duplicate").await, 50.0, "duplicates");
    // A push lands in Redis before its row goes: nothing may be waiting now.
    for q in QUEUES {
        let n: usize = redis::cmd("LLEN").arg(q).query(&mut con).unwrap();
        assert_eq!(n, 0, "LLEN {q} after the replay");
    }
    assert_eq!(worker.runs().len(), expected_runs, "runs after the replay");
    let logs = worker.logs();
    let errors: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("ERROR") || l.contains("CRITICAL"))
        .collect::<Vec<_>>();
    assert!(errors.is_empty(), "worker errors: {errors:#?}");
}

/// The script alone, on the shared Redis under a namespace: the message on `<ns><queue>`, the
/// marker `<ns>jobrelay:celery:<uuid>` (queue key, dedup TTL), duplicates, a refusal, and the
/// fast path leaving a job that is not due yet to the relay.
#[sqlx::test]
async fn the_script_writes_kombus_list_and_a_marker_of_its_own(pool: PgPool) {
    let ns = Namespace::new();
    let enqueuer =
        Enqueuer::new(ns.prefix.clone(), Duration::from_secs(60)).with_layout(LayoutKind::Celery);
    let mut con = ns.con().await;
    let job = JobBuilder::new("mail.q", "app.tasks.send")
        .args_kwargs(&(1, "x"), &json!({"k": [true]}))
        .header("traceparent", TRACEPARENT)
        .header("id", "not celery's id")
        .build()
        .unwrap();
    let jobs = [job.clone(), job.clone()];
    let results = enqueuer.enqueue_batch(&mut con, &jobs).await.unwrap();
    assert!(matches!(results[0], Ok(Outcome::Queued)), "{results:?}");
    assert!(matches!(results[1], Ok(Outcome::Duplicate)), "{results:?}");
    assert_eq!(
        ns.keys().await,
        vec![format!("jobrelay:celery:{}", job.uuid), "mail.q".to_owned()]
    );
    let marker = ns.key(&format!("jobrelay:celery:{}", job.uuid));
    let (value, ttl): (String, i64) = redis::pipe()
        .get(&marker)
        .pttl(&marker)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(value, ns.key("mail.q"));
    assert!((50_000..=60_000).contains(&ttl), "{ttl}");
    let raw: Vec<String> = redis::cmd("LRANGE")
        .arg(ns.key("mail.q"))
        .arg(0)
        .arg(-1)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(raw.len(), 1);
    let msg: Value = serde_json::from_str(&raw[0]).unwrap();
    let id = job.uuid.to_string();
    assert_eq!(msg["headers"]["id"], id.as_str(), "celery's id wins");
    assert_eq!(msg["headers"]["task"], "app.tasks.send");
    assert_eq!(msg["headers"]["traceparent"], TRACEPARENT);
    assert_eq!(msg["properties"]["delivery_info"]["routing_key"], "mail.q");
    let body = base64::engine::general_purpose::STANDARD
        .decode(msg["body"].as_str().unwrap())
        .unwrap();
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body[0], json!([1, "x"]));
    assert_eq!(body[1], json!({"k": [true]}));
    // With its marker gone, a key of another type under the queue's name refuses the job,
    // writing nothing.
    let _: () = redis::cmd("DEL")
        .arg(&marker)
        .arg(ns.key("mail.q"))
        .query_async(&mut con)
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg(ns.key("mail.q"))
        .arg("x")
        .query_async(&mut con)
        .await
        .unwrap();
    match enqueuer.enqueue(&mut con, &job).await {
        Err(Error::Refused { message, .. }) => {
            assert!(message.contains("WRONGTYPE"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    let exists: bool = redis::cmd("EXISTS")
        .arg(&marker)
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(!exists, "no marker for a refused job");

    // The fast path pushes a due job and leaves one whose run_at is ahead to the relay.
    let producer = Producer::new(ns.prefix.clone()).layout(LayoutKind::Celery);
    let mut pending = producer.pending();
    let now = pending
        .add(JobBuilder::new("fast.q", "t").args_kwargs(&[1], &BTreeMap::<String, i32>::new()))
        .unwrap();
    let later = pending
        .add(
            JobBuilder::new("fast.q", "t")
                .args_kwargs(&[2], &BTreeMap::<String, i32>::new())
                .delay(Duration::from_secs(3600)),
        )
        .unwrap();
    let mut tx = pool.begin().await.unwrap();
    pending.create_pending(&mut tx).await.unwrap();
    tx.commit().await.unwrap();
    let report = pending.push_and_delete(&mut con, &pool).await.unwrap();
    assert_eq!(report.pushed, vec![(now, Outcome::Queued)]);
    assert_eq!(report.skipped, vec![later]);
    let left: Vec<Uuid> = sqlx::query_scalar("SELECT uuid FROM pending_jobs")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(left, vec![later]);
    assert_eq!(ns.llen("fast.q").await, 1);
}

/// The celery layout's call is a transaction: the messages are LPUSHed natively, then the
/// script takes the duplicates' messages back out by their place (docs/layouts.md, "How the
/// celery layout pushes"). Against lists that already hold messages, a call mixing new jobs,
/// replays of an earlier call and a uuid twice over three lists leaves each uuid once, in the
/// order a worker's BRPOP meets them, and a list key of another type refuses only its jobs.
#[tokio::test]
async fn a_call_takes_its_duplicates_back_out_and_keeps_the_order() {
    let ns = Namespace::new();
    let enqueuer =
        Enqueuer::new(ns.prefix.clone(), Duration::from_secs(60)).with_layout(LayoutKind::Celery);
    let mut con = ns.con().await;
    let job = |queue: &str, i: i32| {
        JobBuilder::new(queue, TASK)
            .args_kwargs(&[i], &BTreeMap::<String, i32>::new())
            .build()
            .unwrap()
    };
    for list in ["a", "b"] {
        let _: () = redis::cmd("LPUSH")
            .arg(ns.key(list))
            .arg(format!("older message of {list}"))
            .query_async(&mut con)
            .await
            .unwrap();
    }
    let first: Vec<_> = (0..6).map(|i| job(["a", "b"][i as usize % 2], i)).collect();
    let results = enqueuer.enqueue_batch(&mut con, &first).await.unwrap();
    assert!(
        results.iter().all(|r| matches!(r, Ok(Outcome::Queued))),
        "{results:?}"
    );
    let (n1, n2, n3) = (job("a", 10), job("c", 11), job("b", 12));
    let second = vec![
        first[1].clone(),
        n1.clone(),
        first[3].clone(),
        n1.clone(),
        first[0].clone(),
        n2.clone(),
        first[5].clone(),
        n3.clone(),
        first[4].clone(),
    ];
    let results = enqueuer.enqueue_batch(&mut con, &second).await.unwrap();
    let outcomes: Vec<_> = results.iter().map(|r| r.as_ref().ok().copied()).collect();
    use Outcome::{Duplicate as D, Queued as Q};
    assert_eq!(
        outcomes,
        [D, Q, D, D, D, Q, D, Q, D].map(Some).to_vec(),
        "{results:?}"
    );
    // From the right (the end BRPOP pops): the older message, then the jobs in the order
    // they were first sent.
    let reader = con.clone();
    let ids = |list: &'static str| {
        let key = ns.key(list);
        let mut con = reader.clone();
        async move {
            let raw: Vec<String> = redis::cmd("LRANGE")
                .arg(key)
                .arg(0)
                .arg(-1)
                .query_async(&mut con)
                .await
                .unwrap();
            raw.iter()
                .rev()
                .map(|m| match serde_json::from_str::<Value>(m) {
                    Ok(msg) => msg["headers"]["id"].as_str().unwrap().to_owned(),
                    Err(_) => m.clone(),
                })
                .collect::<Vec<_>>()
        }
    };
    let id = |j: &jobrelay::Job| j.uuid.to_string();
    assert_eq!(
        ids("a").await,
        vec![
            "older message of a".to_owned(),
            id(&first[0]),
            id(&first[2]),
            id(&first[4]),
            id(&n1)
        ]
    );
    assert_eq!(
        ids("b").await,
        vec![
            "older message of b".to_owned(),
            id(&first[1]),
            id(&first[3]),
            id(&first[5]),
            id(&n3)
        ]
    );
    assert_eq!(ids("c").await, vec![id(&n2)]);

    // A list key of another type refuses the jobs bound for it (no marker, nothing pushed);
    // the call's other jobs go out, their duplicates taken back out as before.
    let _: () = redis::cmd("SET")
        .arg(ns.key("d"))
        .arg("not a list")
        .query_async(&mut con)
        .await
        .unwrap();
    let (r1, r2) = (job("d", 20), job("c", 21));
    let third = vec![r1.clone(), n2.clone(), r2.clone(), r1.clone()];
    let results = enqueuer.enqueue_batch(&mut con, &third).await.unwrap();
    assert!(
        matches!(&results[0], Err(Error::Refused { message, .. }) if message.contains("WRONGTYPE")),
        "{results:?}"
    );
    assert!(matches!(results[1], Ok(Outcome::Duplicate)), "{results:?}");
    assert!(matches!(results[2], Ok(Outcome::Queued)), "{results:?}");
    assert!(
        matches!(results[3], Err(Error::Refused { .. })),
        "{results:?}"
    );
    assert_eq!(ids("c").await, vec![id(&n2), id(&r2)]);
    let marker: bool = redis::cmd("EXISTS")
        .arg(enqueuer.marker_key(r1.uuid))
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(!marker, "no marker for a refused job");
    let value: String = redis::cmd("GET")
        .arg(ns.key("d"))
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(value, "not a list");
}

/// kombu's Redis transport has no Cluster support: a Cluster URL in the celery layout is
/// refused at start, one line naming --layout, exit 2, before anything connects.
#[tokio::test]
async fn the_celery_layout_refuses_a_cluster_url() {
    let nowhere = format!("redis+cluster://127.0.0.1:{}", free_port());
    let (code, out, err) = run_relay(
        &["check"],
        &[
            ("DATABASE_URL", "postgres://nobody@127.0.0.1:1/x"),
            ("REDIS_URL", &nowhere),
            ("JOBRELAY_NAMESPACE", "{jobs}:"),
            ("JOBRELAY_LAYOUT", "celery"),
        ],
    )
    .await;
    assert_eq!(code, 2, "{out}{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {err}");
    assert!(
        lines[0].contains("--layout") && lines[0].contains("Cluster"),
        "{err}"
    );
}

/// A row whose run_at is ahead does not wake the relay: while its workers are awake (they
/// just claimed), the wake-up lock's poll (every millisecond) counts only rows that are due,
/// so the workers do not claim again and again in vain until it is.
#[sqlx::test]
async fn a_row_not_yet_due_does_not_keep_the_workers_claiming(pool: PgPool) {
    let ns = Namespace::new();
    let relay = HttpRelay::start(&pool, &ns.url, &ns.prefix, &["--layout", "celery"]).await;
    let now = Row::new("a", "[1]".into());
    let later = Row {
        run_at: Some(Utc::now() + chrono::Duration::seconds(30)),
        ..Row::new("a", "[2]".into())
    };
    let commits = || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        n
    };
    let mut tx = pool.begin().await.unwrap();
    insert(&mut *tx, &[now, later]).await;
    tx.commit().await.unwrap();
    wait_until("the due row relayed", Duration::from_secs(10), || async {
        ns.llen("a").await == 1
    })
    .await;
    // Statistics reach pg_stat_database with a delay (up to a second): measure over 2 s.
    let before = commits().await;
    let start = Instant::now();
    wait_until("two seconds", Duration::from_secs(3), || async {
        start.elapsed() >= Duration::from_secs(2)
    })
    .await;
    let during = commits().await - before;
    eprintln!("{during} transactions in 2 s");
    assert_eq!(relay.count("queued").await, 1.0);
    assert_eq!(pending_count(&pool).await, 1, "the later row waits");
    assert!(during < 100, "{during} transactions in 2 s while idle");
}

/// argsrepr and kwargsrepr, the relay's against celery's own: 3,000 random payloads (nesting,
/// repeated keys, quotes, escapes, non-ASCII, integers and floats of every form, sizes on both
/// sides of the 1,024-character limit), each encoded by the layout and given to celery 5's
/// `AMQP.as_task_v2` with the args and kwargs `json.loads` reads from it.
#[test]
fn argsrepr_and_kwargsrepr_are_celerys() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(19);
    let cases: Vec<(String, String)> = (0..3000)
        .map(|_| {
            let size = [4, 40, 400, 1500][rng.random_range(0..4)];
            let args = random_container(&mut rng, b'[', 0, size);
            let kwargs = random_container(&mut rng, b'{', 0, size);
            (args, kwargs)
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cases.json");
    std::fs::write(&path, serde_json::to_string(&cases).unwrap()).unwrap();
    let out = crate::common::celery::python(&format!(
        "import json\nfrom celery import Celery\n\
         amqp = Celery('repr').amqp\n\
         out = []\n\
         for a, k in json.load(open({path:?})):\n    \
             h = amqp.as_task_v2('id', 'task', args=json.loads(a), kwargs=json.loads(k)).headers\n    \
             out.append([h['argsrepr'], h['kwargsrepr']])\n\
         print(json.dumps(out))\n",
        path = path.display().to_string()
    ));
    let celerys: Vec<(String, String)> = serde_json::from_str(&out).unwrap();
    assert_eq!(celerys.len(), cases.len());
    let layout = LayoutKind::Celery.layout();
    let mut cut = 0;
    for ((args, kwargs), want) in cases.iter().zip(&celerys) {
        let job = JobBuilder::new("q", "t")
            .payload(format!(r#"{{"args": {args}, "kwargs": {kwargs}}}"#))
            .build()
            .unwrap();
        let mut buf = Vec::new();
        layout.encode(&job, &mut buf).unwrap();
        let message: Value = serde_json::from_slice(&buf).unwrap();
        let got = (
            message["headers"]["argsrepr"].as_str().unwrap().to_owned(),
            message["headers"]["kwargsrepr"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
        assert_eq!(&got, want, "args {args}\nkwargs {kwargs}");
        cut += usize::from(want.0.chars().count() > 1000 || want.1.chars().count() > 1000);
    }
    eprintln!("{cut} of {} cut at the limit", cases.len());
    // The limit was met often enough to mean something.
    assert!(cut > 300, "{cut} cut");
}

/// A random JSON array (`open` `[`) or object (`{`) of about `size` characters, as text.
fn random_container(rng: &mut impl rand::Rng, open: u8, depth: usize, size: usize) -> String {
    let n = match rng.random_range(0..10) {
        0 => 0,
        1 => size / 3 + 1,
        _ => rng.random_range(1..6),
    };
    let ws = |rng: &mut dyn rand::RngCore| if rng.next_u32() % 4 == 0 { " \n" } else { "" };
    let mut s = String::new();
    s.push(open as char);
    let mut keys: Vec<String> = Vec::new();
    for i in 0..n {
        if i > 0 {
            s.push_str(if rng.random_bool(0.5) { ", " } else { "," });
        }
        s.push_str(ws(rng));
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
        s.push_str(ws(rng));
    }
    s.push(if open == b'[' { ']' } else { '}' });
    s
}

fn random_value(rng: &mut impl rand::Rng, depth: usize, size: usize) -> String {
    const NUMBERS: &[&str] = &[
        "0",
        "-0",
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
        "12345678901234567890123",
        "5e-324",
        "1e400",
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
        " ",
        "'",
        "\\\"",
        "\\\\",
        "\\n",
        "\\t",
        "\\/",
        "é",
        "\\u00e9",
        "😀",
        "\\ud83d\\ude00",
        "\\u0027",
        "ü",
        "x",
    ];
    let len = rng.random_range(0..=size.max(1));
    let mut s = String::from("\"");
    for _ in 0..len {
        s.push_str(PIECES[rng.random_range(0..PIECES.len())]);
    }
    s.push('"');
    s
}
