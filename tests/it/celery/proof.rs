//! The acceptance test: 1,000 jobs over 4 queues in 10 transactions, a flow row and a
//! malformed row among them, the SQL of docs/layouts/celery.md, 20 delayed jobs beside 20 sent by
//! celery's own client with an ETA, and a replay of 50 relayed rows: the real worker runs each
//! job once, with its args and kwargs, no earlier than its run_at, and nothing twice.

use super::*;
use crate::common::celery::CeleryWorker;
use crate::common::http_relay::HttpRelay;
use crate::common::redis_server::RedisServer;
use uuid::Uuid;

#[sqlx::test]
async fn a_celery_worker_runs_relayed_jobs_exactly_once(pool: PgPool) {
    let redis = RedisServer::start();
    let url = redis.url();
    let relay = HttpRelay::start(&pool, &url, "", &["--layout", "celery"]).await;

    // The backlog, committed and relayed before the worker starts: the broker's queues hold
    // the jobs before any worker runs.
    let (mut rows, unfit) = commit_the_backlog(&pool).await;
    let mut con = redis.con();
    let llen = |con: &mut redis::Connection, q: &str| -> usize {
        redis::cmd("LLEN").arg(q).query(con).unwrap()
    };
    let lens: Vec<usize> = QUEUES.iter().map(|q| llen(&mut con, q)).collect();
    assert_eq!(lens, vec![250; 4], "LLEN a b c d");
    assert_eq!(
        llen(&mut con, "emails"),
        1,
        "LLEN emails (the docs' example)"
    );
    assert_dead_letters(&pool, "celery", &unfit).await;

    let mut queues = QUEUES.to_vec();
    queues.push("emails");
    let worker = CeleryWorker::start(&url, "", &queues, &[TASK, DOC_TASK]).await;
    let backlog = rows.len() + 1;
    worker.wait_runs(backlog, Duration::from_secs(30)).await;

    // 20 jobs due a few seconds from now, and 20 tasks with the same ETA from celery's client,
    // to an idle worker.
    let due = due_in(chrono::Duration::seconds(4));
    let delayed = delayed_rows(TASK, due, |i| format!("[\"delayed\", {i}]"));
    insert(&pool, &delayed).await;
    let script = scripts::py(
        &[("DUE", json!(epoch(due))), ("TASK", json!(TASK))],
        include_str!("eta_baseline.py"),
    );
    let baseline: Vec<String> = worker.python(&script).lines().map(str::to_owned).collect();
    assert_eq!(baseline.len(), 20);

    let expected_runs = backlog + delayed.len() + baseline.len();
    let runs = worker
        .wait_runs(expected_runs, Duration::from_secs(30))
        .await;
    let by_id = RunsById::new(&runs, |r| r.id.as_str());
    for r in rows.iter().chain(&delayed) {
        let got = by_id.once(&r.uuid.to_string());
        let (args, kwargs) = args_and_kwargs(&r.payload);
        assert_eq!((&got.args, &got.kwargs), (&args, &kwargs), "{}", r.payload);
        assert_eq!(got.task, TASK);
        let traceparent = r.headers.get("traceparent").and_then(Value::as_str);
        assert_eq!(got.traceparent, traceparent.unwrap_or(""), "traceparent");
    }
    let doc_runs = runs.iter().filter(|r| r.task == DOC_TASK);
    assert_the_docs_example_ran(&doc_runs.map(|r| (&r.args, &r.kwargs)).collect::<Vec<_>>());
    by_id.assert_none_ran(unfit.map(|(u, _)| u.to_string()));
    assert_eq!(runs.len(), expected_runs, "runs");
    let relayed_at = by_id.times(delayed.iter().map(|r| r.uuid.to_string()));
    let baseline_at = by_id.times(&baseline);
    assert_delays("celery's eta", due, &relayed_at, &baseline_at);

    // A replay of 50 relayed rows after they ran: duplicates, nothing queued, nothing run.
    let replay = replay_of(&mut rows);
    replay_after_they_ran(&pool, &redis, &relay, &replay).await;
    assert_eq!(worker.runs().len(), expected_runs, "runs after the replay");
    let logs = worker.logs();
    let errors: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("ERROR") || l.contains("CRITICAL"))
        .collect::<Vec<_>>();
    assert!(errors.is_empty(), "worker errors: {errors:#?}");
}

/// Commits 10 transactions of 100 jobs (one in ten with a traceparent and another header),
/// behind a transaction opening with a flow row and a malformed row, then the docs' example
/// (as a Django app would run it in its transaction), and waits until all are relayed;
/// returns the jobs, and the unfit rows with what their dead letters must say.
async fn commit_the_backlog(pool: &PgPool) -> (Vec<Row>, [(Uuid, &'static str); 2]) {
    let flow = Row {
        parent: Some(Uuid::new_v4()),
        ..Row::new("a", TASK, "[1]")
    };
    let malformed = Row::new("a", TASK, "{\"args\": 1}");
    let unfit = [
        (flow.uuid, "no parent or predecessor"),
        (malformed.uuid, "\"args\" is not an array"),
    ];
    let rows = backlog_rows(TASK, payload, true);
    commit_backlog(pool, &[flow, malformed], &rows).await;
    run_doc_sql(pool, "celery.md", "\n## From a Django app").await;
    relayed(pool, "the backlog relayed").await;
    (rows, unfit)
}

/// The length of the list `key`.
fn llen(redis: &RedisServer, key: &str) -> usize {
    redis::cmd("LLEN").arg(key).query(&mut redis.con()).unwrap()
}

/// Inserts `replay` (rows relayed before, whose jobs ran) again: duplicates, nothing queued.
async fn replay_after_they_ran(
    pool: &PgPool,
    redis: &RedisServer,
    relay: &HttpRelay,
    replay: &[Row],
) {
    insert(pool, replay).await;
    relayed(pool, "the replay relayed").await;
    assert_eq!(relay.count("duplicate").await, 50.0, "duplicates");
    // A push lands in Redis before its row goes: nothing may be waiting now.
    for q in QUEUES {
        assert_eq!(llen(redis, q), 0, "LLEN {q} after the replay");
    }
}
