//! The sidekiq layout: with `--layout sidekiq` the relay writes what Sidekiq's own client
//! writes, and the real, unmodified Sidekiq worker (Debian's `ruby-sidekiq`) runs it, exactly
//! once, with its arguments, no earlier than `run_at`; Sidekiq's API sees the jobs as its own.
//!
//! - `a_real_sidekiq_runs_relayed_jobs_exactly_once`: the acceptance test, against a private
//!   redis-server and the worker of tests/it/common/sidekiq.rs;
//! - `the_script_writes_sidekiqs_keys`: the enqueue script alone, on the shared Redis.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use crate::common::batch::{stop, sweep_report};
use crate::common::child::RelayChild;
use crate::common::redis_server::RedisServer;
use crate::common::sidekiq::{Run, Sidekiq};
use crate::common::*;
use chrono::{DateTime, Utc};
use jobrelay::{Enqueuer, Error, Job, LayoutKind, Outcome};
use serde_json::{json, Value};
use sqlx::PgPool;
use uuid::Uuid;

const QUEUES: [&str; 4] = ["a", "b", "c", "d"];
const CLASSES: [&str; 2] = ["HardJob", "Billing::ChargeCard"];
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// The statement docs/layouts.md gives a Rails application (the SQL block after the marker
/// `<!-- sidekiq-insert -->`), word for word.
fn documented_insert() -> String {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/layouts.md"))
        .expect("docs/layouts.md");
    let after = doc
        .split_once("<!-- sidekiq-insert -->")
        .expect("the marker <!-- sidekiq-insert --> in docs/layouts.md")
        .1;
    let block = after
        .split_once("```sql\n")
        .expect("a sql block after the marker")
        .1;
    block
        .split_once("```")
        .expect("the block's end")
        .0
        .to_owned()
}

/// The jid of a relayed job: its uuid's 32 hex digits.
fn jid(u: Uuid) -> String {
    u.simple().to_string()
}

/// One job's arguments: JSON of every kind, escapes, non-ASCII, a NUL, a large integer.
fn args_of(i: usize) -> Value {
    json!([
        i,
        format!("é\"\\\n\u{0}{i}"),
        {"nested": [true, false, null, 1.5, -2e-3], "empty": {}},
        [],
        12_345_678_901_234_567_u64,
    ])
}

/// A relayed job as the test expects it to run.
struct Expected {
    uuid: Uuid,
    queue: String,
    class: String,
    args: Value,
    run_at: Option<f64>,
}

/// Epoch seconds with the microseconds, as the worker's clock and Sidekiq's scores are.
fn epoch(t: DateTime<Utc>) -> f64 {
    t.timestamp() as f64 + f64::from(t.timestamp_subsec_micros()) / 1e6
}

async fn insert(
    tx: &mut sqlx::PgConnection,
    uuid: Uuid,
    queue: &str,
    class: &str,
    payload: &[u8],
    headers: Value,
    run_at: Option<DateTime<Utc>>,
) {
    sqlx::query(
        "INSERT INTO pending_jobs (uuid, queue, job_type, payload, headers, run_at)
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(uuid)
    .bind(queue)
    .bind(class)
    .bind(payload)
    .bind(headers)
    .bind(run_at)
    .execute(tx)
    .await
    .expect("row inserted");
}

fn runs_by_jid(runs: &[Run]) -> HashMap<String, Vec<&Run>> {
    let mut map: HashMap<String, Vec<&Run>> = HashMap::new();
    for r in runs {
        map.entry(r.jid().to_owned()).or_default().push(r);
    }
    map
}

/// The acceptance test (docs/layouts.md#sidekiq): 1,000 jobs over 4 queues in 10
/// transactions (one of them through the statement the docs give a Rails app), 20 jobs due a
/// few seconds later, a flow row and two payloads that are no JSON array. Relayed by the daemon
/// before the worker starts: Sidekiq's API counts them as its own. Then the worker runs each
/// job exactly once with its class, queue and arguments; the scheduled ones no earlier than
/// `run_at` and no later than 2 s after 20 jobs Sidekiq's own client scheduled for the same
/// instant; the three unfit rows are dead-lettered with reasons naming the layout. Finally 50
/// rows replaying relayed uuids are duplicates (the sweep's report) and run nothing again.
#[sqlx::test]
async fn a_real_sidekiq_runs_relayed_jobs_exactly_once(pool: PgPool) {
    let redis = RedisServer::start();
    let mut sidekiq = Sidekiq::new(&redis.url());
    let db = database_url_of(&pool).await;
    let mut expected: Vec<Expected> = Vec::new();

    // The unfit rows come first (lowest ids): the rows behind them must still go out.
    let flow = Uuid::new_v4();
    let not_array = Uuid::new_v4();
    let not_json = Uuid::new_v4();
    {
        let mut tx = pool.begin().await.unwrap();
        sqlx::query(
            "INSERT INTO pending_jobs (uuid, queue, job_type, payload, parent_uuid)
             VALUES ($1, 'a', 'HardJob', '[1]', $2)",
        )
        .bind(flow)
        .bind(Uuid::new_v4())
        .execute(&mut *tx)
        .await
        .unwrap();
        insert(
            &mut tx,
            not_array,
            "a",
            "HardJob",
            br#"{"id":1}"#,
            json!({}),
            None,
        )
        .await;
        insert(&mut tx, not_json, "b", "HardJob", b"[1, 2", json!({}), None).await;
        tx.commit().await.unwrap();
    }

    // 1,000 jobs in 10 transactions; the last one through the documented statement.
    let doc_sql = documented_insert();
    for t in 0..10 {
        let mut tx = pool.begin().await.unwrap();
        for k in 0..100 {
            let i = t * 100 + k;
            let (queue, class, args) = (QUEUES[i % 4], CLASSES[i % 2], args_of(i));
            let uuid = if t == 9 {
                // gen_random_uuid(): the uuid is read back below.
                let headers = json!({ "traceparent": TRACEPARENT }).to_string();
                sqlx::query(&format!("{doc_sql} RETURNING uuid"))
                    .bind(queue)
                    .bind(class)
                    .bind(args.to_string())
                    .bind(headers)
                    .fetch_one(&mut *tx)
                    .await
                    .map(|row| sqlx::Row::get::<Uuid, _>(&row, 0))
                    .expect("the documented statement runs")
            } else {
                let uuid = Uuid::new_v4();
                // Reserved names never override the job's own keys.
                let headers = json!({ "traceparent": TRACEPARENT, "jid": "x", "retry": "false" });
                let payload = serde_json::to_vec(&args).unwrap();
                insert(&mut tx, uuid, queue, class, &payload, headers, None).await;
                uuid
            };
            expected.push(Expected {
                uuid,
                queue: queue.to_owned(),
                class: class.to_owned(),
                args,
                run_at: None,
            });
        }
        tx.commit().await.unwrap();
    }

    // 20 jobs due in 10 s, and 20 more that Sidekiq's own client schedules for the same instant.
    let due = DateTime::from_timestamp(Utc::now().timestamp() + 10, 654_321_000).unwrap();
    let mut tx = pool.begin().await.unwrap();
    for k in 0..20 {
        let uuid = Uuid::new_v4();
        let args = json!(["scheduled", k]);
        let payload = serde_json::to_vec(&args).unwrap();
        insert(
            &mut tx,
            uuid,
            "a",
            "HardJob",
            &payload,
            json!({}),
            Some(due),
        )
        .await;
        expected.push(Expected {
            uuid,
            queue: "a".into(),
            class: "HardJob".into(),
            args,
            run_at: Some(epoch(due)),
        });
    }
    tx.commit().await.unwrap();
    sidekiq
        .ruby(&format!(
            "20.times {{ |k| HardJob.set(queue: 'a').perform_at({}, 'baseline', k) }}",
            epoch(due)
        ))
        .await;

    // The relay, before any worker runs.
    let relay = RelayChild::start(&db, &redis.url(), "", &["--layout", "sidekiq"]);
    wait_until(
        "every row relayed or dead",
        Duration::from_secs(30),
        || async { pending_count(&pool).await == 0 },
    )
    .await;

    // Dead letters: the reason names the layout and what is wrong.
    let dead: BTreeMap<Uuid, String> =
        sqlx::query_as::<_, (Uuid, String)>("SELECT uuid, last_error FROM pending_jobs_dead")
            .fetch_all(&pool)
            .await
            .unwrap()
            .into_iter()
            .collect();
    assert_eq!(dead.len(), 3, "{dead:#?}");
    for (uuid, says) in [
        (
            flow,
            "the sidekiq layout has no flows: the row names parent_uuid",
        ),
        (not_array, "an object, not an array"),
        (not_json, "not JSON"),
    ] {
        let e = &dead[&uuid];
        assert!(
            e.contains("does not fit the sidekiq layout") && e.contains(says),
            "{uuid}: {e}"
        );
    }

    // Sidekiq's API, worker not started: the queues, their counts, the scheduled set, a job.
    let probe = expected[7].uuid;
    let api: Value = serde_json::from_str(
        &sidekiq
            .ruby(&format!(
                r#"
                j = Sidekiq::Queue.new("{queue}").find_job("{jid}")
                s = Sidekiq::ScheduledSet.new
                puts JSON.generate({{
                  "queues" => Sidekiq::Queue.all.map {{ |q| [q.name, q.size] }},
                  "enqueued" => Sidekiq::Stats.new.enqueued,
                  "scheduled" => s.size,
                  "at" => s.select {{ |e| e.args[0] == "scheduled" }}.map {{ |e| e.at.to_f }}.uniq,
                  "job" => {{ "jid" => j.jid, "class" => j.klass, "args" => j.args, "queue" => j["queue"],
                             "enqueued_at" => j.enqueued_at.to_f, "created_at" => j.created_at.to_f }}
                }})
                "#,
                queue = expected[7].queue,
                jid = jid(probe),
            ))
            .await,
    )
    .unwrap();
    assert_eq!(
        api["queues"],
        json!([["a", 250], ["b", 250], ["c", 250], ["d", 250]])
    );
    assert_eq!(api["enqueued"], 1000);
    assert_eq!(api["scheduled"], 40);
    let at = api["at"][0].as_f64().unwrap();
    assert!((at - epoch(due)).abs() < 1e-5, "scheduled at {at}");
    assert_eq!(api["at"].as_array().unwrap().len(), 1, "{}", api["at"]);
    assert_eq!(api["job"]["jid"], jid(probe));
    assert_eq!(api["job"]["class"], expected[7].class);
    assert_eq!(api["job"]["args"], expected[7].args);
    assert_eq!(api["job"]["queue"], expected[7].queue.as_str());
    let now = epoch(Utc::now());
    for k in ["enqueued_at", "created_at"] {
        let t = api["job"][k].as_f64().unwrap();
        assert!(now - 120.0 < t && t <= now, "{k} {t}, now {now}");
    }

    // The worker runs everything.
    sidekiq.start(&QUEUES, 5).await;
    let runs = sidekiq
        .wait_for_runs(expected.len() + 20, Duration::from_secs(60))
        .await;
    let by_jid = runs_by_jid(&runs);
    for e in &expected {
        let ran = by_jid
            .get(&jid(e.uuid))
            .unwrap_or_else(|| panic!("job {} never ran", e.uuid));
        assert_eq!(ran.len(), 1, "job {} ran {} times", e.uuid, ran.len());
        let job = &ran[0].job;
        assert_eq!(job["class"], e.class.as_str(), "{job}");
        assert_eq!(job["queue"], e.queue.as_str(), "{job}");
        assert_eq!(job["args"], e.args, "arguments of {}", e.uuid);
        assert_eq!(job["retry"], true, "{job}");
        assert_eq!(
            job["traceparent"].as_str().is_some(),
            e.run_at.is_none(),
            "{job}"
        );
        assert!(
            job["created_at"].is_f64() && job["enqueued_at"].is_f64(),
            "{job}"
        );
    }
    let baseline: Vec<f64> = runs
        .iter()
        .filter(|r| r.job["args"][0] == "baseline")
        .map(|r| r.at)
        .collect();
    assert_eq!(baseline.len(), 20);
    let baseline_last = baseline.iter().copied().fold(f64::MIN, f64::max);
    for e in expected.iter().filter(|e| e.run_at.is_some()) {
        let ran_at = by_jid[&jid(e.uuid)][0].at;
        let due = e.run_at.unwrap();
        assert!(
            ran_at >= due,
            "job {} ran at {ran_at}, before {due}",
            e.uuid
        );
        assert!(
            ran_at <= baseline_last + 2.0,
            "job {} ran at {ran_at}; Sidekiq's own scheduled jobs by {baseline_last}",
            e.uuid
        );
    }
    for u in [flow, not_array, not_json] {
        assert!(!by_jid.contains_key(&jid(u)), "dead-lettered {u} ran");
    }

    // A replay of 50 relayed rows, then one new job per queue, by a sweep (the daemon stopped
    // first, so that the sweep's report counts every row).
    stop(relay).await;
    let sentinels: Vec<Uuid> = QUEUES.iter().map(|_| Uuid::new_v4()).collect();
    let mut tx = pool.begin().await.unwrap();
    for e in expected.iter().step_by(20).take(50) {
        let payload = serde_json::to_vec(&e.args).unwrap();
        insert(
            &mut tx,
            e.uuid,
            &e.queue,
            &e.class,
            &payload,
            json!({}),
            None,
        )
        .await;
    }
    for (q, u) in QUEUES.iter().zip(&sentinels) {
        insert(
            &mut tx,
            *u,
            q,
            "HardJob",
            b"[\"sentinel\"]",
            json!({}),
            None,
        )
        .await;
    }
    tx.commit().await.unwrap();
    let url = redis.url();
    let (code, out, err) = run_relay(
        &["--sweep", "--older-than", "0s", "--layout", "sidekiq"],
        &[("DATABASE_URL", db.as_str()), ("REDIS_URL", url.as_str())],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let report = sweep_report(&out);
    assert_eq!(report["duplicates"], 50, "{out}");
    assert_eq!(report["queued"], 4, "{out}");
    let runs = sidekiq
        .wait_for_runs(expected.len() + 20 + 4, Duration::from_secs(30))
        .await;
    let by_jid = runs_by_jid(&runs);
    for u in &sentinels {
        assert_eq!(by_jid[&jid(*u)].len(), 1, "sentinel {u}");
    }
    let twice: Vec<&String> = by_jid
        .iter()
        .filter(|(_, r)| r.len() > 1)
        .map(|(j, _)| j)
        .collect();
    assert!(twice.is_empty(), "jobs that ran twice: {twice:?}");
    assert_eq!(runs.len(), expected.len() + 20 + 4);
    sidekiq.stop();
}

fn job(queue: &str, payload: &str) -> Job {
    Job {
        uuid: Uuid::new_v4(),
        queue: queue.into(),
        job_type: "HardJob".into(),
        payload: payload.as_bytes().to_vec(),
        parent_uuid: None,
        predecessor_uuid: None,
        dead_parent: false,
        run_at: None,
        created_at: DateTime::from_timestamp(1_700_000_000, 123_456_000).unwrap(),
        headers: BTreeMap::from([("wrapped".to_owned(), "ChargeJob".to_owned())]),
    }
}

/// The enqueue script alone (docs/layouts.md#sidekiq): `queue:<q>` and `queues` for a job
/// without `run_at` or with one that has passed (which gets Redis's time as `enqueued_at`),
/// `schedule` scored with `run_at` for a future one, all under the namespace; the marker
/// `jobrelay:sidekiq:<uuid>` with the TTL; a second push, or the same uuid twice in a batch, is
/// a duplicate; a key of another type refuses the job without writing; an unfit job is refused
/// before anything is sent.
#[tokio::test]
async fn the_script_writes_sidekiqs_keys() {
    let ns = Namespace::new();
    let mut con = ns.con().await;
    let enqueuer =
        Enqueuer::new(ns.prefix.clone(), Duration::from_secs(60)).with_layout(LayoutKind::Sidekiq);
    let plain = job("q1", "[1]");
    let mut future = job("q1", "[2]");
    future.run_at =
        Some(DateTime::from_timestamp(Utc::now().timestamp() + 3600, 250_000_000).unwrap());
    let mut past = job("q2", "[3]");
    past.run_at = Some(DateTime::from_timestamp(1_600_000_000, 0).unwrap());
    let mut flow = job("q1", "[4]");
    flow.predecessor_uuid = Some(plain.uuid);
    let batch = [
        plain.clone(),
        future.clone(),
        past.clone(),
        plain.clone(),
        flow.clone(),
    ];
    let before = epoch(Utc::now()) - 1.0;
    let results = enqueuer.enqueue_batch(&mut con, &batch).await.unwrap();
    let after = epoch(Utc::now()) + 1.0;
    assert!(matches!(results[0], Ok(Outcome::Queued)), "{results:?}");
    assert!(matches!(results[1], Ok(Outcome::Scheduled)), "{results:?}");
    assert!(matches!(results[2], Ok(Outcome::Queued)), "{results:?}");
    assert!(matches!(results[3], Ok(Outcome::Duplicate)), "{results:?}");
    match &results[4] {
        Err(Error::Unfit { layout, reason, .. }) => {
            assert_eq!(*layout, LayoutKind::Sidekiq);
            assert!(reason.0.contains("no flows"), "{reason}");
        }
        other => panic!("{other:?}"),
    }

    let list_con = ns.con().await;
    let list = |key: &str| {
        let key = ns.key(key);
        let mut con = list_con.clone();
        async move {
            let raw: Vec<String> = redis::cmd("LRANGE")
                .arg(key)
                .arg(0)
                .arg(-1)
                .query_async(&mut con)
                .await
                .unwrap();
            raw.iter()
                .map(|s| serde_json::from_str::<Value>(s).unwrap())
                .collect::<Vec<_>>()
        }
    };
    let q1 = list("queue:q1").await;
    assert_eq!(q1.len(), 1);
    assert_eq!(q1[0]["jid"], jid(plain.uuid));
    assert_eq!(q1[0]["args"], json!([1]));
    assert_eq!(q1[0]["wrapped"], "ChargeJob");
    assert_eq!(q1[0]["created_at"], json!(1_700_000_000.123456));
    let enqueued = q1[0]["enqueued_at"].as_f64().unwrap();
    assert!(before < enqueued && enqueued < after, "{enqueued}");
    let q2 = list("queue:q2").await;
    assert_eq!(q2.len(), 1);
    assert_eq!(q2[0]["jid"], jid(past.uuid));
    let enqueued = q2[0]["enqueued_at"].as_f64().unwrap();
    assert!(
        before < enqueued && enqueued < after,
        "past run_at: Redis's time {enqueued}"
    );
    let mut queues: Vec<String> = redis::cmd("SMEMBERS")
        .arg(ns.key("queues"))
        .query_async(&mut con)
        .await
        .unwrap();
    queues.sort();
    assert_eq!(queues, ["q1", "q2"]);
    let scheduled: Vec<(String, f64)> = redis::cmd("ZRANGE")
        .arg(ns.key("schedule"))
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(scheduled.len(), 1);
    let member: Value = serde_json::from_str(&scheduled[0].0).unwrap();
    assert_eq!(member["jid"], jid(future.uuid));
    assert!(member.get("enqueued_at").is_none(), "{member}");
    assert!((scheduled[0].1 - epoch(future.run_at.unwrap())).abs() < 1e-5);

    let marker = ns.key(&format!("jobrelay:sidekiq:{}", plain.uuid));
    let (value, ttl): (String, i64) = redis::pipe()
        .cmd("GET")
        .arg(&marker)
        .cmd("PTTL")
        .arg(&marker)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(serde_json::from_str::<Value>(&value).unwrap(), q1[0]);
    assert!(ttl > 50_000 && ttl <= 60_000, "{ttl}");

    // Pushed again: duplicates, nothing written.
    let again = enqueuer
        .enqueue_batch(&mut con, &[plain.clone(), future.clone()])
        .await
        .unwrap();
    assert!(
        again.iter().all(|r| matches!(r, Ok(Outcome::Duplicate))),
        "{again:?}"
    );
    assert_eq!(list("queue:q1").await.len(), 1);

    // `queues` of another type: the job is refused, nothing written, no marker.
    let _: () = redis::cmd("SET")
        .arg(ns.key("queues"))
        .arg("x")
        .query_async(&mut con)
        .await
        .unwrap();
    let other = job("q3", "[5]");
    let r = enqueuer.enqueue(&mut con, &other).await;
    match r {
        Err(Error::Refused { message, .. }) => {
            assert!(
                message.contains("queues holds a string, not a set"),
                "{message}"
            )
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(list("queue:q3").await.len(), 0);
    let marker_left: bool = redis::cmd("EXISTS")
        .arg(ns.key(&format!("jobrelay:sidekiq:{}", other.uuid)))
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(!marker_left);
}
