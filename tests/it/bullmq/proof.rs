//! The acceptance test: 1,000 jobs over 4 queues in 10 transactions, a flow row and a
//! malformed row among them, the SQL of docs/layouts/bullmq.md, 20 delayed jobs beside 20 that
//! BullMQ's own `Queue.add` delays, and a replay of 50 relayed rows after their jobs completed
//! and were removed: the real worker runs each job once with its data, no earlier than its
//! run_at, nothing twice; `QueueEvents` and `Queue.getJobCounts` agree.

use std::collections::HashMap;

use super::*;
use crate::common::bullmq::Run;
use crate::common::http_relay::HttpRelay;
use chrono::DateTime;
use uuid::Uuid;

/// The states `Queue.getJobCounts` is asked for, but `waiting`.
const NOT_WAITING: [&str; 6] = [
    "active",
    "delayed",
    "completed",
    "failed",
    "paused",
    "prioritized",
];

#[sqlx::test]
async fn a_bullmq_worker_runs_relayed_jobs_exactly_once(pool: PgPool) {
    let redis = RedisServer::start();
    let url = redis.url();
    let relay = HttpRelay::start(&pool, &url, NS, &["--layout", "bullmq"]).await;

    // The backlog, committed and relayed before the worker starts.
    let (mut rows, unfit) = commit_the_backlog(&pool).await;
    assert_dead_letters(&pool, "bullmq", &unfit).await;
    let mut queues = QUEUES.to_vec();
    queues.push("emails");
    assert_waiting_before_any_worker(&redis, &queues).await;
    let worker = BullmqWorker::start(port_of(&url), PREFIX, &queues).await;
    let backlog = rows.len() + 1;
    let runs = worker.wait_runs(backlog, Duration::from_secs(60)).await;
    assert_eq!(runs.len(), backlog, "runs of the backlog");

    // 20 jobs due a few seconds from now, and 20 that BullMQ's own client delays to the same
    // moment, to idle workers.
    let due = due_in(chrono::Duration::seconds(4));
    let delayed = delayed_rows(NAME, due, |i| format!("{{\"delayed\":{i}}}"));
    insert(&pool, &delayed).await;
    let script = scripts::js(
        &[
            ("NAME", json!(NAME)),
            ("DUE_MS", json!(due.timestamp_millis())),
        ],
        include_str!("delay_baseline.js"),
    );
    let baseline: Vec<String> = worker.node(&script).lines().map(str::to_owned).collect();
    assert_eq!(baseline.len(), 20);
    relayed(&pool, "the delayed rows relayed").await;
    assert_delayed_while_not_due(&worker, due);

    let expected_runs = backlog + delayed.len() + baseline.len();
    let runs = worker
        .wait_runs(expected_runs, Duration::from_secs(30))
        .await;
    let by_id = RunsById::new(&runs, |r| r.id.as_str());
    assert_each_ran_once_with_its_data(&by_id, rows.iter().chain(&delayed));
    let doc_runs: Vec<&Run> = runs.iter().filter(|r| r.queue == "emails").collect();
    assert_eq!(doc_runs.len(), 1, "the docs' example");
    assert_eq!(doc_runs[0].name, "send-welcome");
    assert_eq!(doc_runs[0].data, r#"{"userId":42,"lang":"de"}"#);
    by_id.assert_none_ran(unfit.map(|(u, _)| u.to_string()));
    assert_eq!(runs.len(), expected_runs, "runs");
    let relayed_at = by_id.times(delayed.iter().map(|r| r.uuid.to_string()));
    let baseline_at = by_id.times(&baseline);
    assert_delays("Queue.add's delay", due, &relayed_at, &baseline_at);

    // QueueEvents saw each relayed job added, waiting (or delayed) and completed, once each.
    assert_events_once_each(&worker, &rows, &delayed, baseline.len()).await;
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
    let replay = replay_of(&mut rows);
    replay_completed_jobs(&pool, &redis, &relay, &replay).await;
    // Then a sentinel per queue: a wrongly queued job is taken before its queue's sentinel, and
    // once no queue has a job waiting or active, every job taken has been recorded.
    let sentinels = commit_sentinels(&pool, NAME, payload).await;
    let after = expected_runs + sentinels.len();
    worker.wait_runs(after, Duration::from_secs(30)).await;
    wait_until("the queues idle", Duration::from_secs(30), || async {
        let counts = job_counts(&worker, &QUEUES);
        QUEUES
            .iter()
            .all(|q| counts[q]["active"] == json!(0) && counts[q]["waiting"] == json!(0))
    })
    .await;
    let runs = worker.runs();
    let by_id = RunsById::new(&runs, |r| r.id.as_str());
    for s in &sentinels {
        by_id.once(&s.uuid.to_string());
    }
    assert_eq!(runs.len(), after, "runs after the replay");
    let logs = worker.logs();
    assert!(
        !logs.contains("error") && !logs.contains("failed"),
        "worker log: {logs}"
    );
}

/// Commits a flow row and a malformed row, then 10 transactions of 100 jobs, then the docs'
/// example, and waits until all are relayed; returns the jobs, and the unfit rows with what
/// their dead letters must say.
async fn commit_the_backlog(pool: &PgPool) -> (Vec<Row>, [(Uuid, &'static str); 2]) {
    let flow = Row {
        parent: Some(Uuid::new_v4()),
        ..Row::new("a", NAME, "{}")
    };
    let malformed = Row::new("a", NAME, "{\"data\": ");
    let unfit = [(flow.uuid, "no flows"), (malformed.uuid, "not JSON")];
    let rows = backlog_rows(NAME, payload, false);
    commit_backlog(pool, &[flow, malformed], &rows).await;
    run_doc_sql(pool, "bullmq.md", "\n## Producing a BullMQ job").await;
    relayed(pool, "the backlog relayed").await;
    (rows, unfit)
}

/// Before any worker runs: 250 jobs in each wait list, and BullMQ's own count of what waits
/// (the docs' example in `emails`).
async fn assert_waiting_before_any_worker(redis: &RedisServer, queues: &[&str]) {
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
    let client_only = BullmqWorker::start(redis.port, PREFIX, &[]).await;
    let counts = job_counts(&client_only, queues);
    for q in queues {
        let waiting = if *q == "emails" { 1 } else { 250 };
        assert_eq!(counts[q]["waiting"], json!(waiting), "{q}: {counts}");
        for state in NOT_WAITING {
            assert_eq!(counts[q][state], json!(0), "{q} {state}: {counts}");
        }
    }
}

/// While they are not due, BullMQ counts the relayed and its own delayed jobs as delayed (when
/// this machine was quick enough to ask in time).
fn assert_delayed_while_not_due(worker: &BullmqWorker, due: DateTime<Utc>) {
    let counts = job_counts(worker, &QUEUES);
    if Utc::now() + chrono::Duration::milliseconds(500) < due {
        for q in QUEUES {
            assert_eq!(counts[q]["delayed"], json!(10), "{q}: {counts}");
        }
    } else {
        eprintln!("delayed counts asked too late to hold: {counts}");
    }
}

/// Each of `rows` ran once, with its data byte for byte, its name and queue, and what
/// `Queue.add` gives a job by default.
fn assert_each_ran_once_with_its_data<'a>(
    by_id: &RunsById<Run>,
    rows: impl Iterator<Item = &'a Row>,
) {
    for r in rows {
        let got = by_id.once(&r.uuid.to_string());
        assert_eq!(got.data, r.payload, "data, byte for byte");
        assert_eq!(got.name, NAME);
        assert_eq!(got.queue, r.queue);
        assert_eq!(got.attempts, 0, "Queue.add's default attempts");
        // (A worker promoting a delayed job sets its delay to 0: the script's test checks it.)
        assert_eq!(got.delay, 0.0);
        if let Some(at) = r.run_at {
            assert!((got.timestamp as i64) < at.timestamp_millis(), "timestamp");
        }
    }
}

/// `QueueEvents` saw each of `rows` added, waiting and completed, and each of `delayed` added,
/// delayed and completed, once each (after the completions of them all and of `baseline`
/// BullMQ's own jobs).
async fn assert_events_once_each(
    worker: &BullmqWorker,
    rows: &[Row],
    delayed: &[Row],
    baseline: usize,
) {
    let relayed_jobs = rows.len() + delayed.len() + 1;
    wait_for_records(
        "completed events",
        relayed_jobs + baseline,
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
    for (jobs, states) in [
        (rows, ["added", "waiting", "completed"]),
        (delayed, ["added", "delayed", "completed"]),
    ] {
        for r in jobs {
            let id = r.uuid.to_string();
            for ev in states {
                let n = seen.get(&(r.queue, id.as_str(), ev));
                assert_eq!(n, Some(&1), "{ev} of {id}");
            }
        }
    }
}

/// Inserts `replay` (rows relayed before, whose jobs completed) again: duplicates, nothing
/// queued, no job hash written again.
async fn replay_completed_jobs(
    pool: &PgPool,
    redis: &RedisServer,
    relay: &HttpRelay,
    replay: &[Row],
) {
    let mut con = redis.con();
    let hash_exists = |con: &mut redis::Connection, r: &Row| -> bool {
        redis::cmd("EXISTS")
            .arg(format!("{NS}{}:{}", r.queue, r.uuid))
            .query(con)
            .unwrap()
    };
    for r in replay {
        let exists = hash_exists(&mut con, r);
        assert!(!exists, "the hash of {} was removed on completion", r.uuid);
    }
    insert(pool, replay).await;
    relayed(pool, "the replay relayed").await;
    assert_eq!(relay.count("duplicate").await, 50.0, "duplicates");
    for q in QUEUES {
        let n: usize = redis::cmd("LLEN")
            .arg(format!("{NS}{q}:wait"))
            .query(&mut con)
            .unwrap();
        assert_eq!(n, 0, "LLEN {q}:wait after the replay");
    }
    for r in replay {
        let exists = hash_exists(&mut con, r);
        assert!(!exists, "no job hash written again for {}", r.uuid);
    }
}
