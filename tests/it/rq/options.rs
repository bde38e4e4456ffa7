//! Job options (docs/layouts/rq.md#job-options), proven by a real `rq worker --with-scheduler`
//! (JSON serializer): a job with `timeout: 1` that sleeps 3 s fails with RQ's
//! `JobTimeoutException`, and with `retry: {"max": 1}` it runs twice first; `retry: {"max": 2,
//! "interval": [2, 4]}` runs a failing job 3 times, the retries 2 and 4 s apart (less RQ's
//! rounding of the due second down); `result_ttl: 0` leaves no job hash after the run,
//! `result_ttl: "2m"` one that expires in 120 s where a job without options keeps its 500;
//! `failure_ttl: 300` keeps a failed job 300 s (RQ's default: a year); a `ttl: 1` job expires
//! before a worker comes and never runs; an `at_front` job inserted last runs first; `meta` (with
//! the row's headers) and `description` reach the job. A row with a fractional `timeout` is
//! dead-lettered naming the option, the rows behind it flow.
//!
//! Each relayed job hash equals the one RQ's own client writes for the same job and options
//! (`Queue.enqueue` / `Queue.enqueue_at`, options_baseline.py), field by field, but for
//! `created_at` and `enqueued_at` (each the clock of its own enqueue), `origin` (RQ's jobs go to
//! a queue of their own, `client`, which no worker reads, so that they are not run) and `data`,
//! compared inflated and parsed (the relay writes zlib's stored form, RQ deflates); the hash's
//! TTL agrees within 10 s.

use super::*;
use crate::common::batch::stop;
use crate::common::child::RelayChild;
use crate::common::redis_server::RedisServer;
use chrono::{DateTime, Utc};
use uuid::Uuid;

/// One row: a name (its first arg), its function, payload, options, headers and run_at.
struct Case {
    name: &'static str,
    func: &'static str,
    payload: Value,
    options: Value,
    headers: Value,
    run_at: Option<DateTime<Utc>>,
}

fn case(name: &'static str, func: &'static str, options: Value) -> Case {
    Case {
        name,
        func,
        payload: json!([name]),
        options,
        headers: json!({}),
        run_at: None,
    }
}

/// The rows, in insertion order. `ttl_short` is left out of the comparison with RQ's client
/// (its hash may have expired by then: `ttl_long` compares the same field), `misfit` is
/// refused.
fn cases() -> Vec<Case> {
    vec![
        Case {
            payload: json!([3]),
            ..case("timeout", "jobs.nap", json!({"timeout": 1}))
        },
        Case {
            payload: json!([3]),
            ..case(
                "timeout_retried",
                "jobs.nap",
                json!({"job_timeout": "1s", "retry": {"max": 1}}),
            )
        },
        case(
            "retried",
            "jobs.fail",
            json!({"retry": {"max": 2, "interval": [2, 4]}}),
        ),
        case("result_gone", "jobs.record", json!({"result_ttl": 0})),
        case("result_kept", "jobs.record", json!({"result_ttl": "2m"})),
        case("failure_kept", "jobs.fail", json!({"failure_ttl": 300})),
        Case {
            payload: json!({"args": ["meta"], "kwargs": {"lang": "de"}}),
            headers: json!({"traceparent": TRACEPARENT}),
            ..case(
                "meta",
                "jobs.record",
                json!({
                    "meta": {"tenant": 7, "flags": [true, null], "city": "Zürich"},
                    "description": "welcome mail",
                }),
            )
        },
        case("plain", "jobs.record", json!({})),
        case(
            "ttl_long",
            "jobs.record",
            json!({"ttl": "1h", "at_front": false}),
        ),
        Case {
            run_at: Some(Utc::now() + chrono::Duration::hours(1)),
            ..case(
                "scheduled_front",
                "jobs.record",
                json!({
                    "at_front": true,
                    "retry": {"max": 3, "interval": 10, "enqueue_at_front": true},
                }),
            )
        },
        case("ttl_short", "jobs.record", json!({"ttl": 1})),
        case("misfit", "jobs.record", json!({"timeout": "1.5"})),
        case("front", "jobs.record", json!({"at_front": true})),
    ]
}

/// Inserts the cases, each with its options; their uuids, in order.
async fn insert_cases(pool: &PgPool, cases: &[Case]) -> Vec<Uuid> {
    let column = |f: &dyn Fn(&Case) -> Value| cases.iter().map(f).collect::<Vec<Value>>();
    sqlx::query_scalar(
        "INSERT INTO pending_jobs (queue, job_type, payload, options, headers, run_at)
         SELECT 'opts', t, convert_to(p::text, 'UTF8'), o, h, r
         FROM unnest($1::text[], $2::jsonb[], $3::jsonb[], $4::jsonb[], $5::timestamptz[])
              WITH ORDINALITY AS x(t, p, o, h, r, n)
         ORDER BY n
         RETURNING uuid",
    )
    .bind(cases.iter().map(|c| c.func).collect::<Vec<_>>())
    .bind(column(&|c| c.payload.clone()))
    .bind(column(&|c| c.options.clone()))
    .bind(column(&|c| c.headers.clone()))
    .bind(cases.iter().map(|c| c.run_at).collect::<Vec<_>>())
    .fetch_all(pool)
    .await
    .unwrap()
}

#[sqlx::test]
async fn rq_options_reach_the_job_and_the_worker_obeys_them(pool: PgPool) {
    let redis = RedisServer::start();
    let url = redis.url();
    let app = RqApp::new(&url);
    let cases = cases();
    let uuids = insert_cases(&pool, &cases).await;
    let id = |name: &str| {
        let i = cases.iter().position(|c| c.name == name).unwrap();
        uuids[i].to_string()
    };
    let db = database_url_of(&pool).await;
    let relay = RelayChild::start(&db, &url, "", &["--layout", "rq"]);
    relayed(&pool, "every row relayed or refused").await;
    stop(relay).await;
    assert_dead_letters(
        &pool,
        "rq",
        &[(
            uuids[cases.iter().position(|c| c.name == "misfit").unwrap()],
            "option \"timeout\" for the rq layout; must be -1 (no limit) or 1 or more",
        )],
    )
    .await;

    the_job_hashes_are_rqs_own(&app, &cases, &uuids);

    // The short ttl expires before any worker comes.
    let mut con = redis.con();
    wait_until(
        "the ttl: 1 job hash expired",
        Duration::from_secs(10),
        || {
            let exists: bool = redis::cmd("EXISTS")
                .arg(format!("rq:job:{}", id("ttl_short")))
                .query(&mut con)
                .unwrap();
            async move { !exists }
        },
    )
    .await;

    let worker = app.worker("opts", &["opts"], &["--with-scheduler"]);
    let expected = 13;
    let runs = app
        .wait_runs(expected, Duration::from_secs(60), || worker.logs())
        .await;
    // Once the four failing jobs are in the failed registry, no retry is left to run.
    let failing = ["timeout", "timeout_retried", "retried", "failure_kept"].map(&id);
    let api_of = || -> Value {
        let ids: Vec<String> = cases.iter().map(|c| id(c.name)).collect();
        let script = scripts::py(&[("IDS", json!(ids))], include_str!("options_api.py"));
        serde_json::from_str(&app.python(&script)).unwrap()
    };
    wait_until(
        "the failing jobs failed for good",
        Duration::from_secs(30),
        || {
            let api = api_of();
            let done = failing.iter().all(|f| api[f]["failed"] == json!(true));
            async move { done }
        },
    )
    .await;
    let runs_now = app.runs();
    assert_eq!(runs_now.len(), expected, "runs: {runs_now:#?}");
    let api = api_of();
    let of = |name: &str| -> Vec<&crate::common::rq::Run> {
        runs.iter().filter(|r| r.id == id(name)).collect()
    };
    assert_eq!(runs[0].id, id("front"), "the at_front job first: {runs:#?}");
    for (name, n) in [
        ("timeout", 1),
        ("timeout_retried", 2),
        ("retried", 3),
        ("result_gone", 1),
        ("result_kept", 1),
        ("failure_kept", 1),
        ("meta", 1),
        ("plain", 1),
        ("ttl_long", 1),
        ("scheduled_front", 0),
        ("ttl_short", 0),
        ("misfit", 0),
        ("front", 1),
    ] {
        assert_eq!(of(name).len(), n, "runs of {name}: {runs:#?}");
    }

    // Timeouts, retries, failure_ttl.
    for name in ["timeout", "timeout_retried"] {
        let job = &api[id(name)];
        assert_eq!(job["status"], "failed", "{name}: {job}");
        let exc = job["exc_info"].as_str().unwrap();
        assert!(exc.contains("JobTimeoutException"), "{name}: {exc}");
    }
    let retried = of("retried");
    let gaps: Vec<f64> = retried.windows(2).map(|w| w[1].at - w[0].at).collect();
    assert!(
        gaps[0] >= 1.0 && gaps[1] >= 3.0,
        "retry intervals 2 and 4 s (RQ rounds the due second down): gaps {gaps:?}"
    );
    let job = &api[id("retried")];
    assert!(
        job["exc_info"]
            .as_str()
            .unwrap()
            .contains("fails on purpose"),
        "{job}"
    );
    let ttl = |name: &str| api[id(name)]["ttl"].as_i64().unwrap();
    assert!(
        (250..=300).contains(&ttl("failure_kept")),
        "failure_ttl 300"
    );
    assert!(
        ttl("timeout") > 30_000_000,
        "RQ's default failure_ttl: a year"
    );

    // result_ttl, ttl.
    assert_eq!(api[id("result_gone")], Value::Null, "result_ttl 0: deleted");
    assert_eq!(api[id("result_kept")]["finished"], json!(true));
    assert!((60..=120).contains(&ttl("result_kept")), "result_ttl 2m");
    assert!(
        (440..=500).contains(&ttl("plain")),
        "RQ's default result_ttl"
    );
    assert_eq!(api[id("ttl_short")], Value::Null, "ttl 1: expired");

    // meta and description.
    let meta = &of("meta")[0];
    assert_eq!(
        meta.meta,
        json!({"traceparent": TRACEPARENT, "tenant": 7, "flags": [true, null], "city": "Zürich"})
    );
    assert_eq!(
        (&meta.args, &meta.kwargs),
        (&json!(["meta"]), &json!({"lang": "de"}))
    );
    assert_eq!(api[id("meta")]["description"], "welcome mail");
}

/// Each relayed job hash (but `ttl_short`'s and `misfit`'s) against the one RQ's own client
/// writes for the same job and options: equal field by field but for the fields that must
/// differ (see the module).
fn the_job_hashes_are_rqs_own(app: &RqApp, cases: &[Case], uuids: &[Uuid]) {
    let compared: Vec<(usize, &Case)> = cases
        .iter()
        .enumerate()
        .filter(|(_, c)| !matches!(c.name, "ttl_short" | "misfit"))
        .collect();
    let json_cases: Vec<Value> = compared
        .iter()
        .map(|(_, c)| {
            let (args, kwargs) = args_and_kwargs(&c.payload.to_string());
            json!([
                c.func,
                args,
                kwargs,
                c.options,
                c.headers,
                c.run_at.map_or(0.0, epoch)
            ])
        })
        .collect();
    let relayed: Vec<String> = compared
        .iter()
        .map(|(i, _)| uuids[*i].to_string())
        .collect();
    let script = scripts::py(
        &[
            ("RELAYED", json!(relayed)),
            ("CASES_JSON", json!(Value::Array(json_cases).to_string())),
        ],
        include_str!("options_baseline.py"),
    );
    let pairs: Vec<(Value, Value)> = serde_json::from_str(&app.python(&script)).unwrap();
    assert_eq!(pairs.len(), compared.len());
    for ((_, c), (mut ours, mut theirs)) in compared.iter().zip(pairs) {
        let name = c.name;
        let (o, t) = (
            ours.as_object_mut().unwrap(),
            theirs.as_object_mut().unwrap(),
        );
        assert!(!o.is_empty(), "{name}: the relayed job hash exists");
        for f in ["created_at", "enqueued_at"] {
            assert_eq!(
                o.remove(f).is_some(),
                t.remove(f).is_some(),
                "{name}: {f} in both or neither"
            );
        }
        assert_eq!(
            (o.remove("origin"), t.remove("origin")),
            (Some(json!("opts")), Some(json!("client"))),
            "{name}"
        );
        let data = |m: &mut serde_json::Map<String, Value>| -> Value {
            serde_json::from_str(m.remove("data").unwrap().as_str().unwrap()).unwrap()
        };
        assert_eq!(data(o), data(t), "{name}: data");
        let (ttl_o, ttl_t) = (
            o.remove("__ttl__").unwrap().as_i64().unwrap(),
            t.remove("__ttl__").unwrap().as_i64().unwrap(),
        );
        assert!(
            (ttl_o == -1) == (ttl_t == -1) && (ttl_o - ttl_t).abs() <= 10,
            "{name}: TTL {ttl_o} against RQ's {ttl_t}"
        );
        assert_eq!(
            ours, theirs,
            "{name}: the job hash as RQ's client writes it"
        );
    }
}
