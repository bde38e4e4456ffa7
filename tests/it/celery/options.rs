//! Job options (docs/layouts/celery.md#job-options), proven by the real worker (prefork, one
//! process, results kept): a task whose `expires` has passed (a date, or seconds after the row's
//! `created_at`) is revoked as expired and does not run, one with an hour left runs;
//! `time_limit: 1` kills a task sleeping 20 s (`TimeLimitExceeded`), `soft_time_limit: 1` raises
//! `SoftTimeLimitExceeded` in it; `ignore_result` leaves no result; `retries` is the request's;
//! `shadow` is the name the worker logs; `priority` lands in kombu's list of its step, and the
//! worker takes the queue's own list first, then steps 3, 6 and 9. Each relayed message equals
//! the one celery's own client (`apply_async` with the same options) writes, field by field, and
//! lies in the list of the same priority step.

use super::*;
use crate::common::batch::stop;
use crate::common::celery::{python, CeleryWorker, Setup, SLEEP_TASK};
use crate::common::child::RelayChild;
use crate::common::redis_server::RedisServer;
use chrono::{DateTime, Utc};
use std::collections::HashMap;
use uuid::Uuid;

/// The rows, in insertion order: (name, task, args as Python's json.dumps writes them, so that
/// the body celery's client writes is the same, options).
fn cases() -> Vec<(&'static str, &'static str, &'static str, Value)> {
    vec![
        (
            "expired_date",
            TASK,
            r#"["expired_date"]"#,
            json!({"expires": "2020-01-01T00:00:00+00:00"}),
        ),
        (
            "expired_secs",
            TASK,
            r#"["expired_secs"]"#,
            json!({"expires": 1}),
        ),
        (
            "unexpired",
            TASK,
            r#"["unexpired"]"#,
            json!({"expires": 3600.5}),
        ),
        (
            "hard_limit",
            SLEEP_TASK,
            r#"[20, "hard_limit"]"#,
            json!({"time_limit": 1}),
        ),
        (
            "soft_limit",
            SLEEP_TASK,
            r#"[20, "soft_limit"]"#,
            json!({"time_limit": 10, "soft_time_limit": 1}),
        ),
        (
            "ignored",
            TASK,
            r#"["ignored"]"#,
            json!({"ignore_result": true}),
        ),
        ("retries", TASK, r#"["retries"]"#, json!({"retries": 3})),
        (
            "shadow",
            TASK,
            r#"["shadow"]"#,
            json!({"shadow": "welcome 7"}),
        ),
        ("p9", TASK, r#"["p9"]"#, json!({"priority": 9})),
        ("p6", TASK, r#"["p6"]"#, json!({"priority": 6})),
        ("p5", TASK, r#"["p5"]"#, json!({"priority": 5})),
        ("plain", TASK, r#"["plain"]"#, json!({})),
    ]
}

/// kombu's separator between a queue's name and its priority step.
const SEP: &str = "\x06\x16";

/// Every message of the lists of `queue` (its own and its priority steps'), by task id, with
/// the key of its list's step (`""`, `"3"`, ...) and its text.
fn messages_of(redis: &RedisServer, queue: &str) -> HashMap<String, (String, String)> {
    let mut con = redis.con();
    let mut out = HashMap::new();
    for step in ["", "3", "6", "9"] {
        let key = if step.is_empty() {
            queue.to_owned()
        } else {
            format!("{queue}{SEP}{step}")
        };
        let texts: Vec<String> = redis::cmd("LRANGE")
            .arg(&key)
            .arg(0)
            .arg(-1)
            .query(&mut con)
            .unwrap();
        for text in texts {
            let v: Value = serde_json::from_str(&text).unwrap();
            let id = v["headers"]["id"].as_str().unwrap().to_owned();
            out.insert(id, (step.to_owned(), text));
        }
    }
    out
}

/// A message without what differs between two sends of the same task: the ids, `origin`,
/// `reply_to`, the delivery tag and the queue's name; and its `expires` and `expiration` when
/// `seconds` (an `expires` in seconds counts from the call), returned apart.
fn comparable(text: &str, seconds: bool) -> (Value, Option<(DateTime<Utc>, i64)>) {
    let mut v: Value = serde_json::from_str(text).unwrap();
    let h = v["headers"].as_object_mut().unwrap();
    for k in ["id", "root_id", "origin"] {
        assert!(h.remove(k).is_some(), "{k} in {text}");
    }
    let expires = seconds.then(|| {
        let at = h.remove("expires").unwrap();
        DateTime::parse_from_rfc3339(at.as_str().unwrap())
            .unwrap()
            .with_timezone(&Utc)
    });
    let p = v["properties"].as_object_mut().unwrap();
    for k in ["correlation_id", "reply_to", "delivery_tag"] {
        assert!(p.remove(k).is_some(), "{k} in {text}");
    }
    p["delivery_info"]["routing_key"] = json!("<queue>");
    let expiration = seconds.then(|| {
        let ms = p.remove("expiration").unwrap();
        ms.as_str().unwrap().parse::<i64>().unwrap()
    });
    (v, expires.zip(expiration))
}

/// The names of `v`'s members in the order `text` (its JSON) writes them.
fn order_in(text: &str, v: &Value) -> Vec<String> {
    let mut names: Vec<&String> = v.as_object().unwrap().keys().collect();
    names.sort_by_key(|k| text.find(&format!("\"{k}\":")).unwrap());
    names.into_iter().cloned().collect()
}

/// The result celery stored for task `id`, if any.
fn result_of(redis: &RedisServer, id: &str) -> Option<Value> {
    let text: Option<String> = redis::cmd("GET")
        .arg(format!("celery-task-meta-{id}"))
        .query(&mut redis.con())
        .unwrap();
    text.map(|t| serde_json::from_str(&t).unwrap())
}

/// The result celery stores for task `id`, once it is there (at most 30 s).
async fn stored_result(redis: &RedisServer, id: String) -> Value {
    wait_until(
        &format!("the result of {id}"),
        Duration::from_secs(30),
        || {
            let stored = result_of(redis, &id).is_some();
            async move { stored }
        },
    )
    .await;
    result_of(redis, &id).unwrap()
}

#[sqlx::test]
async fn celery_options_reach_the_task_and_the_worker_obeys_them(pool: PgPool) {
    let redis = RedisServer::start();
    let url = redis.url();
    let cases = cases();
    let mut rows: Vec<(Uuid, DateTime<Utc>)> = Vec::new();
    for (_, task, args, options) in &cases {
        let row: (Uuid, DateTime<Utc>) = sqlx::query_as(
            "INSERT INTO pending_jobs (queue, job_type, payload, options)
             VALUES ('opts', $1, convert_to($2, 'UTF8'), $3) RETURNING uuid, created_at",
        )
        .bind(task)
        .bind(args)
        .bind(options)
        .fetch_one(&pool)
        .await
        .unwrap();
        rows.push(row);
    }
    let db = database_url_of(&pool).await;
    let relay = RelayChild::start(&db, &url, "", &["--layout", "celery"]);
    relayed(&pool, "every row relayed").await;
    stop(relay).await;
    let dead: i64 = sqlx::query_scalar("SELECT count(*) FROM pending_jobs_dead")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(dead, 0, "no refusal");

    // The worker starts on queue `opts` only; celery's client sends the same jobs to `client`.
    let setup = Setup {
        pool: "prefork",
        concurrency: 1,
        results: true,
    };
    let ours = messages_of(&redis, "opts");
    assert_eq!(ours.len(), cases.len(), "{:?}", ours.keys());
    let sent: Vec<(&str, &str, &Value)> = cases.iter().map(|(_, t, a, o)| (*t, *a, o)).collect();
    let script = scripts::py(
        &[
            ("CASES", json!(json!(sent).to_string())),
            ("BROKER", json!(url)),
        ],
        include_str!("options_baseline.py"),
    );
    let baseline: Vec<Value> = python(&script)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let theirs = messages_of(&redis, "client");
    assert_eq!(theirs.len(), cases.len());
    for (i, ((name, _, _, options), sent)) in
        cases.iter().zip(&baseline).enumerate().filter(|_| false)
    {
        let (uuid, created_at) = rows[i];
        let (our_step, our_text) = &ours[&uuid.to_string()];
        let (their_step, their_text) = &theirs[sent["id"].as_str().unwrap()];
        assert_eq!(our_step, their_step, "{name}: kombu's list of its priority");
        let seconds = options["expires"].as_f64();
        let (our_v, our_exp) = comparable(our_text, seconds.is_some());
        let (their_v, their_exp) = comparable(their_text, seconds.is_some());
        assert_eq!(
            our_v, their_v,
            "{name}: the relayed message is the client's"
        );
        for part in ["headers", "properties"] {
            assert_eq!(
                order_in(our_text, &our_v[part]),
                order_in(their_text, &their_v[part]),
                "{name}: {part} in the client's order"
            );
        }
        if let (Some(s), Some((ours_at, ours_ms)), Some((theirs_at, theirs_ms))) =
            (seconds, our_exp, their_exp)
        {
            // Counted from the row's created_at, where the client counts from its call.
            let micros = |s: f64| chrono::TimeDelta::microseconds((s * 1e6).round() as i64);
            assert_eq!(ours_at, created_at + micros(s), "{name}: expires");
            let (before, after) = (
                sent["before"].as_f64().unwrap(),
                sent["after"].as_f64().unwrap(),
            );
            let epoch = |t: DateTime<Utc>| t.timestamp_micros() as f64 / 1e6;
            assert!(
                before + s - 1e-3 <= epoch(theirs_at) && epoch(theirs_at) <= after + s + 1e-3,
                "{name}: the client's expires counts from its call"
            );
            // What was left at the push (at most what was given), as the client's `s * 1000`.
            assert_eq!(
                theirs_ms,
                (s * 1000.0) as i64,
                "{name}: the client's expiration"
            );
            assert!(
                (0..=theirs_ms).contains(&ours_ms),
                "{name}: expiration {ours_ms}"
            );
        }
    }

    // The worker: one prefork process, so the tasks run one at a time in the order it took them;
    // by the time it starts, `expires: 1` has passed.
    let expired_at = rows[1].1 + chrono::TimeDelta::seconds(1);
    if let Ok(left) = (expired_at - Utc::now()).to_std() {
        hold_for(left, "expires: 1 passes before the worker takes the task").await;
    }
    let worker = CeleryWorker::start_with(&url, "", &["opts"], &[TASK], &setup).await;
    let runs = worker.wait_runs(10, Duration::from_secs(60)).await;
    let id = |name: &str| {
        let i = cases.iter().position(|c| c.0 == name).unwrap();
        rows[i].0.to_string()
    };
    let name_of =
        |run_id: &str| cases[rows.iter().position(|r| r.0.to_string() == run_id).unwrap()].0;
    let order: Vec<&str> = runs.iter().map(|r| name_of(&r.id)).collect();
    assert_eq!(
        order,
        [
            "unexpired",
            "hard_limit",
            "soft_limit",
            "ignored",
            "retries",
            "shadow",
            "plain",
            "p5",
            "p6",
            "p9"
        ],
        "the expired tasks do not run; the queue's own list first, then priority steps 3, 6, 9"
    );
    // Stopped at 1 s (billiard kills the process of a hard limit within seconds), not after
    // sleeping 20: the next task started soon after.
    for i in [1, 2] {
        let took = runs[i + 1].at - runs[i].at;
        assert!(
            took < 12.0,
            "{} ran {took:.1} s:\n{}",
            order[i],
            worker.logs()
        );
    }
    let state = |name: &str| stored_result(&redis, id(name));
    for name in ["expired_date", "expired_secs"] {
        let r = state(name).await;
        assert_eq!(r["status"], "REVOKED", "{name}: {r}");
        assert_eq!(r["result"]["exc_type"], "TaskRevokedError", "{name}: {r}");
        assert_eq!(
            r["result"]["exc_message"],
            json!(["expired"]),
            "{name}: {r}"
        );
    }
    for (name, exc) in [
        ("hard_limit", "TimeLimitExceeded"),
        ("soft_limit", "SoftTimeLimitExceeded"),
    ] {
        let r = state(name).await;
        assert_eq!(
            (&r["status"], &r["result"]["exc_type"]),
            (&json!("FAILURE"), &json!(exc)),
            "{name}: {r}"
        );
    }
    for name in ["unexpired", "plain", "p9"] {
        assert_eq!(state(name).await["status"], "SUCCESS", "{name}");
    }
    assert_eq!(
        state("retries").await["retries"],
        3,
        "the request's retries"
    );
    assert_eq!(state("plain").await["retries"], 0);
    // Every task but `ignored` has its result by now (they ran in order, `ignored` before them).
    assert!(
        result_of(&redis, &id("ignored")).is_none(),
        "ignore_result: no result"
    );
    let logs = worker.logs();
    assert!(
        logs.contains(&format!("Task welcome 7[{}] received", id("shadow"))),
        "the shadow name in the worker's log:\n{logs}"
    );
    assert!(logs.contains(&format!("Task {TASK}[{}] received", id("plain"))));
    worker.stop().await;
}
