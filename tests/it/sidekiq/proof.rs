//! The acceptance test (docs/layouts/sidekiq.md): 1,000 jobs over 4 queues in 10 transactions
//! (one of them through the statement the docs give a Rails app), 20 jobs due a few seconds
//! later, a flow row and two payloads that are no JSON array. Relayed by the daemon before the
//! worker starts: Sidekiq's API counts them as its own. Then the worker runs each job exactly
//! once with its class, queue and arguments; the scheduled ones no earlier than `run_at` and no
//! later than 2 s after 20 jobs Sidekiq's own client scheduled for the same instant; the three
//! unfit rows are dead-lettered with reasons naming the layout. Finally 50 rows replaying
//! relayed uuids are duplicates (the sweep's report) and run nothing again.

use super::*;
use crate::common::batch::{stop, sweep_report};
use crate::common::child::RelayChild;
use crate::common::redis_server::RedisServer;
use crate::common::sidekiq::{Run, Sidekiq};
use sqlx::PgPool;

const CLASSES: [&str; 2] = ["HardJob", "Billing::ChargeCard"];

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

#[sqlx::test]
async fn a_real_sidekiq_runs_relayed_jobs_exactly_once(pool: PgPool) {
    let redis = RedisServer::start();
    let mut sidekiq = Sidekiq::new(&redis.url());
    let db = database_url_of(&pool).await;
    let (backlog, unfit) = commit_the_backlog(&pool).await;

    // 20 jobs due in 10 s, and 20 more that Sidekiq's own client schedules for the same instant.
    let due = DateTime::from_timestamp(Utc::now().timestamp() + 10, 654_321_000).unwrap();
    let scheduled: Vec<Row> = (0..20)
        .map(|k| Row {
            run_at: Some(due),
            ..Row::new("a", "HardJob", json!(["scheduled", k]).to_string())
        })
        .collect();
    insert(&pool, &scheduled).await;
    let baseline = format!(
        "20.times {{ |k| HardJob.set(queue: 'a').perform_at({}, 'baseline', k) }}",
        epoch(due)
    );
    sidekiq.ruby(&baseline).await;

    // The relay, before any worker runs.
    let relay = RelayChild::start(&db, &redis.url(), "", &["--layout", "sidekiq"]);
    relayed(&pool, "every row relayed or dead").await;
    assert_dead_letters(&pool, "sidekiq", &unfit).await;
    assert_sidekiqs_api_counts_them(&sidekiq, &backlog[7], due).await;

    // The worker runs everything.
    sidekiq.start(&QUEUES, 5).await;
    let all: Vec<&Row> = backlog.iter().chain(&scheduled).collect();
    let runs = sidekiq
        .wait_for_runs(all.len() + 20, Duration::from_secs(60))
        .await;
    let by_jid = RunsById::new(&runs, Run::jid);
    for r in &all {
        let job = &by_jid.once(&jid(r.uuid)).job;
        assert_eq!(job["class"], r.job_type, "{job}");
        assert_eq!(job["queue"], r.queue, "{job}");
        let args: Value = serde_json::from_str(&r.payload).unwrap();
        assert_eq!(job["args"], args, "arguments of {}", r.uuid);
        assert_eq!(job["retry"], true, "{job}");
        assert_eq!(job["traceparent"], r.headers["traceparent"], "{job}");
        assert_eq!(
            job["traceparent"].as_str().is_some(),
            r.run_at.is_none(),
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
    let ran_at = by_jid.times(scheduled.iter().map(|r| jid(r.uuid)));
    assert_delays("Sidekiq's own scheduled jobs", due, &ran_at, &baseline);
    by_jid.assert_none_ran(unfit.map(|(u, _)| jid(u)));

    // A replay of 50 relayed rows, then one new job per queue, by a sweep (the daemon stopped
    // first, so that the sweep's report counts every row).
    stop(relay).await;
    replay_by_a_sweep(&pool, &db, &redis.url(), &sidekiq, &all).await;
    sidekiq.stop();
}

/// Commits the unfit rows (lowest ids: the rows behind them must still go out), then 1,000
/// jobs in 10 transactions, the last one through the documented statement; returns the jobs,
/// and the unfit rows with what their dead letters must say.
async fn commit_the_backlog(pool: &PgPool) -> (Vec<Row>, [(Uuid, &'static str); 3]) {
    let flow = Row {
        parent: Some(Uuid::new_v4()),
        ..Row::new("a", "HardJob", "[1]")
    };
    let not_array = Row::new("a", "HardJob", r#"{"id":1}"#);
    let not_json = Row::new("b", "HardJob", "[1, 2");
    let unfit = [
        (
            flow.uuid,
            "the sidekiq layout has no flows: the row names parent_uuid",
        ),
        (not_array.uuid, "an object, not an array"),
        (not_json.uuid, "not JSON"),
    ];
    let mut rows: Vec<Row> = (0..BACKLOG)
        .map(|i| Row {
            // Reserved names never override the job's own keys.
            headers: json!({ "traceparent": TRACEPARENT, "jid": "x", "retry": "false" }),
            ..Row::spread(i, CLASSES[i % 2], args_of(i).to_string())
        })
        .collect();
    let last = BACKLOG - PER_TRANSACTION;
    commit_backlog(pool, &[flow, not_array, not_json], &rows[..last]).await;
    // gen_random_uuid(): the uuid is read back.
    let doc_sql = doc_sql("sidekiq.md", "<!-- sidekiq-insert -->");
    let mut tx = pool.begin().await.unwrap();
    for r in &mut rows[last..] {
        r.headers = json!({ "traceparent": TRACEPARENT });
        r.uuid = sqlx::query(&format!("{doc_sql} RETURNING uuid"))
            .bind(r.queue)
            .bind(r.job_type)
            .bind(&r.payload)
            .bind(r.headers.to_string())
            .fetch_one(&mut *tx)
            .await
            .map(|row| sqlx::Row::get::<Uuid, _>(&row, 0))
            .expect("the documented statement runs");
    }
    tx.commit().await.unwrap();
    (rows, unfit)
}

/// Sidekiq's API, worker not started: the queues, their counts, the scheduled set, the job
/// `probe`.
async fn assert_sidekiqs_api_counts_them(sidekiq: &Sidekiq, probe: &Row, due: DateTime<Utc>) {
    let script = scripts::py(
        &[
            ("QUEUE", json!(probe.queue)),
            ("JID", json!(jid(probe.uuid))),
        ],
        include_str!("api.rb"),
    );
    let api: Value = serde_json::from_str(&sidekiq.ruby(&script).await).unwrap();
    assert_eq!(
        api["queues"],
        json!([["a", 250], ["b", 250], ["c", 250], ["d", 250]])
    );
    assert_eq!(api["enqueued"], 1000);
    assert_eq!(api["scheduled"], 40);
    let at = api["at"][0].as_f64().unwrap();
    assert!((at - epoch(due)).abs() < 1e-5, "scheduled at {at}");
    assert_eq!(api["at"].as_array().unwrap().len(), 1, "{}", api["at"]);
    assert_eq!(api["job"]["jid"], jid(probe.uuid));
    assert_eq!(api["job"]["class"], probe.job_type);
    let args: Value = serde_json::from_str(&probe.payload).unwrap();
    assert_eq!(api["job"]["args"], args);
    assert_eq!(api["job"]["queue"], probe.queue);
    let now = epoch(Utc::now());
    for k in ["enqueued_at", "created_at"] {
        let t = api["job"][k].as_f64().unwrap();
        assert!(now - 120.0 < t && t <= now, "{k} {t}, now {now}");
    }
}

/// Inserts 50 relayed rows again and one new job per queue, and sweeps them: 50 duplicates,
/// 4 queued; the 4 new jobs run, nothing runs twice.
async fn replay_by_a_sweep(pool: &PgPool, db: &str, url: &str, sidekiq: &Sidekiq, all: &[&Row]) {
    let replay: Vec<Row> = all
        .iter()
        .step_by(20)
        .take(50)
        .map(|r| Row {
            headers: json!({}),
            run_at: None,
            ..(*r).clone()
        })
        .collect();
    let sentinels: Vec<Row> = QUEUES
        .iter()
        .map(|&q| Row::new(q, "HardJob", "[\"sentinel\"]"))
        .collect();
    let mut tx = pool.begin().await.unwrap();
    insert(&mut *tx, &replay).await;
    insert(&mut *tx, &sentinels).await;
    tx.commit().await.unwrap();
    let (code, out, err) = run_relay(
        &["--sweep", "--older-than", "0s", "--layout", "sidekiq"],
        &[("DATABASE_URL", db), ("REDIS_URL", url)],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let report = sweep_report(&out);
    assert_eq!(report["duplicates"], 50, "{out}");
    assert_eq!(report["queued"], 4, "{out}");
    let runs = sidekiq
        .wait_for_runs(all.len() + 20 + 4, Duration::from_secs(30))
        .await;
    let by_jid = RunsById::new(&runs, Run::jid);
    for s in &sentinels {
        by_jid.once(&jid(s.uuid));
    }
    let twice = by_jid.twice();
    assert!(twice.is_empty(), "jobs that ran twice: {twice:?}");
    assert_eq!(runs.len(), all.len() + 20 + 4);
}
