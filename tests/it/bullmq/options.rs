//! Job options (docs/layouts/bullmq.md#job-options), proven by a real `Worker` without options
//! of its own: `attempts: 3, backoff: {type: fixed, delay: 200}` runs a failing job 3 times
//! about 200 ms apart, then it is failed; `attempts: 2, backoff: 100` (a number: BullMQ's fixed
//! backoff) twice, and `removeOnFail: true` leaves no job behind; `removeOnComplete: true`
//! leaves no completed job where a job without options stays completed; a `lifo` job runs first;
//! jobs of `priority` 1 and 5 wait in the prioritized set and run after the jobs without a
//! priority, 1 before 5. Each job's stored `opts` (and hash field `priority`) equals what
//! `Queue.add` stores for the same options, member by member but for `jobId`.

use super::*;
use redis::AsyncCommands;
use uuid::Uuid;

/// The rows: (name, options) in insertion order.
fn cases() -> Vec<(&'static str, Value)> {
    vec![
        (
            "fail",
            json!({"attempts": 3, "backoff": {"type": "fixed", "delay": 200}, "stackTraceLimit": 2}),
        ),
        (
            "fail",
            json!({"attempts": 2, "backoff": 100, "removeOnFail": true, "keepLogs": 5}),
        ),
        ("ok", json!({"removeOnComplete": true})),
        ("ok", json!({})),
        (
            "ok",
            json!({"lifo": true, "removeOnFail": {"age": 60, "count": 10}}),
        ),
        ("ok", json!({"priority": 5, "attempts": 2})),
        ("ok", json!({"priority": 1})),
    ]
}

#[derive(Debug, serde::Deserialize)]
struct Run {
    id: String,
    #[serde(rename = "attemptsMade")]
    attempts_made: i64,
    at: i64,
}

#[sqlx::test]
async fn bullmq_options_reach_the_job_and_the_worker_obeys_them(pool: PgPool) {
    let redis = RedisServer::start();
    let url = redis.url();
    let cases = cases();
    let mut ids = Vec::new();
    for (name, options) in &cases {
        let uuid: Uuid = sqlx::query_scalar(
            "INSERT INTO pending_jobs (queue, job_type, payload, options)
             VALUES ('opts', $1, convert_to('{}', 'UTF8'), $2) RETURNING uuid",
        )
        .bind(name)
        .bind(options)
        .fetch_one(&pool)
        .await
        .unwrap();
        ids.push(uuid.to_string());
    }
    let db = database_url_of(&pool).await;
    let args = ["--sweep", "--older-than", "0s", "--layout", "bullmq"];
    let env = [
        ("DATABASE_URL", db.as_str()),
        ("REDIS_URL", url.as_str()),
        ("JOBRELAY_NAMESPACE", NS),
    ];
    let (code, out, err) = run_relay(&args, &env).await;
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");

    // The stored opts, against Queue.add's for the same options.
    let node = BullmqWorker::start(port_of(&url), PREFIX, &[]).await;
    let options: Vec<&Value> = cases.iter().map(|(_, o)| o).collect();
    node.node(&scripts::js(
        &[("CASES", json!(options))],
        include_str!("options_baseline.js"),
    ));
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let opts_of = |key: String| {
        let mut con = con.clone();
        async move {
            let text: String = con.hget(&key, "opts").await.unwrap();
            let mut v: Value = serde_json::from_str(&text).unwrap();
            assert!(
                v.as_object_mut().unwrap().remove("jobId").is_some(),
                "{text}"
            );
            v
        }
    };
    for (i, id) in ids.iter().enumerate() {
        let ours = opts_of(format!("{NS}opts:{id}")).await;
        let theirs = opts_of(format!("{NS}baseline:b{i}")).await;
        assert_eq!(ours, theirs, "case {i}: opts as Queue.add stores them");
        let priority = |key: String| {
            let mut con = con.clone();
            async move { con.hget::<_, _, String>(key, "priority").await.unwrap() }
        };
        assert_eq!(
            priority(format!("{NS}opts:{id}")).await,
            priority(format!("{NS}baseline:b{i}")).await,
            "case {i}: the hash's priority"
        );
    }
    // The prioritized set holds the jobs of a priority, in the order of theirs.
    let prioritized = |queue: &'static str| {
        let mut con = con.clone();
        async move {
            con.zrange::<_, Vec<String>>(format!("{NS}{queue}:prioritized"), 0, -1)
                .await
                .unwrap()
        }
    };
    assert_eq!(prioritized("opts").await, [ids[6].clone(), ids[5].clone()]);
    assert_eq!(prioritized("baseline").await, ["b6", "b5"]);

    // The worker.
    let script = scripts::js(
        &[("EXPECTED", json!(10))],
        include_str!("options_worker.js"),
    );
    let runs: Vec<Run> = serde_json::from_str(node.node(&script).trim()).unwrap();
    assert_eq!(runs.len(), 10, "{runs:?}");
    assert_eq!(runs[0].id, ids[4], "the lifo job first: {runs:?}");
    let first_runs: Vec<&str> = runs
        .iter()
        .filter(|r| r.attempts_made == 0)
        .map(|r| r.id.as_str())
        .collect();
    let order: Vec<&str> = [4, 0, 1, 2, 3, 6, 5]
        .iter()
        .map(|&i| ids[i].as_str())
        .collect();
    assert_eq!(
        first_runs, order,
        "the wait list (lifo first), then priority 1, then 5: {runs:?}"
    );
    let of = |i: usize| runs.iter().filter(|r| r.id == ids[i]).collect::<Vec<_>>();
    let three = of(0);
    assert_eq!(
        three.iter().map(|r| r.attempts_made).collect::<Vec<_>>(),
        [0, 1, 2],
        "attempts: 3 {runs:?}"
    );
    for pair in three.windows(2) {
        let gap = pair[1].at - pair[0].at;
        assert!(
            (190..1500).contains(&gap),
            "backoff 200 ms: gap {gap} ms, {runs:?}"
        );
    }
    let two = of(1);
    assert_eq!(two.len(), 2, "attempts: 2 {runs:?}");
    assert!(two[1].at - two[0].at >= 90, "backoff 100: {runs:?}");
    for i in [2, 3, 4, 5, 6] {
        assert_eq!(of(i).len(), 1, "case {i} ran once: {runs:?}");
    }
    let failed: Vec<String> = con.zrange(format!("{NS}opts:failed"), 0, -1).await.unwrap();
    assert_eq!(
        failed,
        [ids[0].clone()],
        "removeOnFail: true left no failed job"
    );
    let completed: Vec<String> = con
        .zrange(format!("{NS}opts:completed"), 0, -1)
        .await
        .unwrap();
    let mut want: Vec<String> = [3, 4, 5, 6].iter().map(|&i| ids[i].clone()).collect();
    want.sort();
    let mut completed = completed;
    completed.sort();
    assert_eq!(
        completed, want,
        "removeOnComplete: true left no completed job"
    );
    for i in [1, 2] {
        let exists: bool = con.exists(format!("{NS}opts:{}", ids[i])).await.unwrap();
        assert!(!exists, "case {i}: the job hash is gone");
    }
}
