//! The acceptance test: 1,000 jobs over 4 queues in 10 transactions, behind a malformed row and
//! two flow rows, the SQL of docs/layouts/rq.md, 20 delayed jobs beside 20 scheduled by RQ's own
//! client (`Queue.enqueue_at`), and a replay of 50 relayed rows (after RQ's job hash was
//! deleted, for some): the real worker runs each job once, with its args, kwargs and meta, no
//! earlier than its run_at, and nothing twice; RQ's API agrees at each step.

use super::*;
use crate::common::http_relay::HttpRelay;
use crate::common::redis_server::RedisServer;
use crate::common::rq::RqWorker;
use chrono::{DateTime, Utc};
use uuid::Uuid;

#[sqlx::test]
async fn an_rq_worker_runs_relayed_jobs_exactly_once(pool: PgPool) {
    let redis = RedisServer::start();
    let url = redis.url();
    let relay = HttpRelay::start(&pool, &url, "", &["--layout", "rq"]).await;
    let app = RqApp::new(&url);

    // The backlog, committed and relayed before any worker starts; RQ's API sees it.
    let (mut rows, unfit) = commit_the_backlog(&pool).await;
    assert_dead_letters(&pool, "rq", &unfit).await;
    assert_rq_sees_the_queued_jobs(&app);
    // A burst worker runs the backlog and exits.
    let mut queues = QUEUES.to_vec();
    queues.push("emails");
    let backlog = rows.len() + 1;
    let burst = run_the_backlog_in_a_burst(&app, &url, &queues, backlog).await;

    // 20 jobs due a few seconds from now, and 20 from RQ's client with the same time, to an
    // idle worker with its scheduler.
    let due = due_in(chrono::Duration::milliseconds(4_500));
    let delayed = delayed_rows(FUNC, due, |i| format!("[\"delayed\", {i}]"));
    insert(&pool, &delayed).await;
    let script = scripts::py(
        &[("DUE", json!(epoch(due)))],
        include_str!("enqueue_at_baseline.py"),
    );
    let baseline: Vec<String> = app.python(&script).lines().map(str::to_owned).collect();
    assert_eq!(baseline.len(), 20);
    relayed(&pool, "the delayed rows relayed").await;
    assert_scheduled_before_due(&app, due);
    let worker = app.worker("scheduler", &queues, &["--with-scheduler"]);
    let expected_runs = backlog + delayed.len() + baseline.len();
    let runs = app
        .wait_runs(expected_runs, Duration::from_secs(30), || worker.logs())
        .await;

    let by_id = RunsById::new(&runs, |r| r.id.as_str());
    for r in rows.iter().chain(&delayed) {
        let got = by_id.once(&r.uuid.to_string());
        let (args, kwargs) = args_and_kwargs(&r.payload);
        assert_eq!((&got.args, &got.kwargs), (&args, &kwargs), "{}", r.payload);
        assert_eq!(got.func, FUNC);
        assert_eq!(got.meta, r.headers, "meta");
    }
    let doc_runs = runs.iter().filter(|r| r.func == DOC_FUNC);
    assert_the_docs_example_ran(&doc_runs.map(|r| (&r.args, &r.kwargs)).collect::<Vec<_>>());
    by_id.assert_none_ran(unfit.map(|(u, _)| u.to_string()));
    assert_eq!(runs.len(), expected_runs, "runs");
    let relayed_at = by_id.times(delayed.iter().map(|r| r.uuid.to_string()));
    let baseline_at = by_id.times(&baseline);
    assert_delays("RQ's enqueue_at", due, &relayed_at, &baseline_at);

    // A replay of 50 relayed rows after they ran: duplicates, nothing queued, nothing run.
    let replay = replay_of(&mut rows);
    replay_after_they_ran(&pool, &redis, &relay, &app, &replay).await;
    // Then a sentinel per queue; RQ's worker runs one job at a time, each queue in order.
    let sentinels = commit_sentinels(&pool, FUNC, payload).await;
    let after = expected_runs + sentinels.len();
    let runs = app
        .wait_runs(after, Duration::from_secs(30), || worker.logs())
        .await;
    let by_id = RunsById::new(&runs, |r| r.id.as_str());
    for s in &sentinels {
        by_id.once(&s.uuid.to_string());
    }
    assert_eq!(runs.len(), after, "runs after the replay");
    for log in [burst.logs(), worker.logs()] {
        let errors: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("ERROR") || l.contains("Traceback"))
            .collect();
        assert!(errors.is_empty(), "worker errors: {errors:#?}");
    }
}

/// Commits a transaction with a malformed row and two flow rows, then 10 transactions of 100
/// jobs (one in ten with a traceparent and another header), then the docs' example (as a
/// Python app would run it in its transaction), and waits until all are relayed; returns the
/// jobs, and the unfit rows with what their dead letters must say.
async fn commit_the_backlog(pool: &PgPool) -> (Vec<Row>, [(Uuid, &'static str); 3]) {
    let malformed = Row::new("a", FUNC, "{\"args\": 1}");
    let heir = Row {
        predecessor: Some(Uuid::new_v4()),
        ..Row::new("a", FUNC, "[1]")
    };
    let child = Row {
        parent: Some(Uuid::new_v4()),
        ..Row::new("a", FUNC, "[2]")
    };
    let unfit = [
        (malformed.uuid, "\"args\" is not an array"),
        (heir.uuid, "predecessor_uuid"),
        (child.uuid, "parent_uuid"),
    ];
    let rows = backlog_rows(FUNC, payload, true);
    commit_backlog(pool, &[malformed, heir, child], &rows).await;
    run_doc_sql(pool, "rq.md", "\n## Producing an RQ job").await;
    relayed(pool, "the backlog relayed").await;
    (rows, unfit)
}

/// Before any worker runs, RQ's API counts the queued jobs, and reads each job hash as its own
/// (tests/it/rq/job_hashes.py).
fn assert_rq_sees_the_queued_jobs(app: &RqApp) {
    let api = rq_api(app);
    for q in QUEUES {
        assert_eq!(api[q]["count"], 250, "Queue({q}).count: {api}");
    }
    assert_eq!(api["emails"]["count"], 1, "{api}");
    let check: Value = serde_json::from_str(&app.python(include_str!("job_hashes.py"))).unwrap();
    assert_eq!(check["n"], 1001, "{check}");
    assert_eq!(check["nbad"], 0, "{check}");
    assert_eq!(check["with_meta"], 100, "{check}");
}

/// A burst worker runs the `backlog` and exits; RQ's API and `rq info` count them finished.
async fn run_the_backlog_in_a_burst(
    app: &RqApp,
    url: &str,
    queues: &[&str],
    backlog: usize,
) -> RqWorker {
    let burst = app.worker("burst", queues, &["--burst"]);
    let status = burst.wait_exit(Duration::from_secs(120)).await;
    assert!(
        status.success(),
        "rq worker: {status}; its log:\n{}",
        burst.logs()
    );
    let runs = app
        .wait_runs(backlog, Duration::from_secs(5), || burst.logs())
        .await;
    assert_eq!(runs.len(), backlog, "runs of the backlog");
    let api = rq_api(app);
    for q in QUEUES {
        assert_eq!(
            (&api[q]["count"], &api[q]["finished"], &api[q]["failed"]),
            (&json!(0), &json!(250), &json!(0)),
            "{q}: {api}"
        );
    }
    let info = std::process::Command::new(crate::common::rq::rq_bin())
        .args(["info", "--raw", "--only-queues", "--url", url])
        .output()
        .unwrap();
    let info = String::from_utf8_lossy(&info.stdout).into_owned();
    for q in QUEUES {
        let line = format!("queue {q} 0, 0 executing, 250 finished, 0 failed");
        assert!(info.lines().any(|l| l == line), "rq info: {info}");
    }
    burst
}

/// Before `due`, the scheduled registries hold the 20 relayed and the 20 of RQ's own client.
fn assert_scheduled_before_due(app: &RqApp, due: DateTime<Utc>) {
    let api = rq_api(app);
    let scheduled: i64 = QUEUES
        .iter()
        .map(|q| api[q]["scheduled"].as_i64().unwrap())
        .sum();
    assert!(
        Utc::now() < due,
        "the test was too slow to look at the scheduled registries before run_at"
    );
    assert_eq!(scheduled, 40, "ScheduledJobRegistry counts: {api}");
}

/// Inserts `replay` (rows relayed before, whose jobs ran) again: for 20 of them RQ's job hash
/// is gone (as after its result_ttl), for 10 jobrelay's marker is (RQ's finished job hash
/// answers), the rest have both. Duplicates, nothing queued, no job hash written again.
async fn replay_after_they_ran(
    pool: &PgPool,
    redis: &RedisServer,
    relay: &HttpRelay,
    app: &RqApp,
    replay: &[Row],
) {
    let mut con = redis.con();
    let mut acon = redis.async_con().await;
    for (i, r) in replay.iter().enumerate() {
        let n: i64 = match i {
            0..20 => redis::cmd("DEL")
                .arg(format!("rq:job:{}", r.uuid))
                .query(&mut con)
                .unwrap(),
            20..30 => marks::unmark(&mut acon, "", LayoutKind::Rq, r.uuid).await,
            _ => continue,
        };
        assert_eq!(n, 1, "row {i}'s job hash or marker");
    }
    insert(pool, replay).await;
    relayed(pool, "the replay relayed").await;
    assert_eq!(relay.count("duplicate").await, 50.0, "duplicates");
    // A push lands in Redis before its row goes: nothing may be waiting now.
    let api = rq_api(app);
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
}
