//! Job options (docs/layouts/sidekiq.md#job-options), proven by the real worker: a failing job
//! with `retry: false` runs once and leaves no retry or dead-set entry; `retry: 0` goes to the
//! dead set, unless `dead: false`; `retry: 2` is in the retry set after its first failure with
//! `retry: 2` and `retry_count: 0`, on its `retry_queue`, with the `backtrace` lines it asked
//! for and its `tags`, is retried exactly twice (on `later`) and then lies in the dead set; a
//! custom key reaches the job. Sidekiq waits 15 s and more before a retry: the test moves each
//! retry's time to now with Sidekiq's own API (`SortedEntry#reschedule`), and the worker's own
//! scheduler enqueues it, as it would when the time came. Each relayed job, as stored, equals the same
//! job pushed by Sidekiq's own client (`Sidekiq::Client.push`) field by field, but for `jid`,
//! `created_at` and `enqueued_at`.

use super::*;
use crate::common::batch::stop;
use crate::common::child::RelayChild;
use crate::common::redis_server::RedisServer;
use crate::common::sidekiq::Sidekiq;
use sqlx::PgPool;

/// The rows: (name, class, options).
fn cases() -> Vec<(&'static str, &'static str, Value)> {
    vec![
        ("no_retry", "FailingJob", json!({"retry": false})),
        ("exhausted_kept", "FailingJob", json!({"retry": 0})),
        (
            "exhausted_dropped",
            "FailingJob",
            json!({"retry": 0, "dead": false}),
        ),
        (
            "twice",
            "FailingJob",
            json!({"retry": 2, "retry_queue": "later", "backtrace": 3, "tags": ["billing", "eu"]}),
        ),
        (
            "custom",
            "HardJob",
            json!({"tags": ["x"], "bid": "b-1", "app_context": {"tenant": 7, "flags": [true]}}),
        ),
    ]
}

/// The job hash Sidekiq stores for `json` (a job's JSON), without what differs between two
/// pushes of the same job.
fn comparable(json: &str) -> Value {
    let mut v: Value = serde_json::from_str(json).unwrap();
    let m = v.as_object_mut().unwrap();
    for k in ["jid", "created_at", "enqueued_at"] {
        assert!(m.remove(k).is_some(), "{k} in {json}");
    }
    v
}

/// The sorted set `key`'s members, as job hashes.
async fn set_members(redis_url: &str, key: &str) -> Vec<Value> {
    let client = redis::Client::open(redis_url).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let members: Vec<String> = redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .query_async(&mut con)
        .await
        .unwrap();
    members
        .iter()
        .map(|m| serde_json::from_str(m).unwrap())
        .collect()
}

#[sqlx::test]
async fn sidekiq_options_reach_the_job_and_the_worker_obeys_them(pool: PgPool) {
    let redis = RedisServer::start();
    let mut sidekiq = Sidekiq::new(&redis.url());
    let db = database_url_of(&pool).await;
    let cases = cases();
    let mut jids = std::collections::HashMap::new();
    for (name, class, options) in &cases {
        let uuid: Uuid = sqlx::query_scalar(
            "INSERT INTO pending_jobs (queue, job_type, payload, options)
             VALUES ('opts', $1, convert_to($2, 'UTF8'), $3) RETURNING uuid",
        )
        .bind(class)
        .bind(json!([name]).to_string())
        .bind(options)
        .fetch_one(&pool)
        .await
        .unwrap();
        jids.insert(jid(uuid), *name);
    }
    let relay = RelayChild::start(&db, &redis.url(), "", &["--layout", "sidekiq"]);
    relayed(&pool, "every row relayed").await;
    stop(relay).await;
    let dead: i64 = sqlx::query_scalar("SELECT count(*) FROM pending_jobs_dead")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(dead, 0, "no refusal");

    // The same jobs pushed by Sidekiq's own client, onto queue `opts`'s twin `client`.
    let script = cases
        .iter()
        .map(|(name, class, options)| {
            format!(
                "Sidekiq::Client.push({{'queue' => 'client', 'class' => '{class}', \
                 'args' => ['{name}']}}.merge(JSON.parse('{options}')))"
            )
        })
        .collect::<Vec<_>>()
        .join("\n");
    sidekiq.ruby(&script).await;
    let client = redis::Client::open(redis.url().as_str()).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let lrange = |key: &'static str| {
        let mut con = con.clone();
        async move {
            redis::cmd("LRANGE")
                .arg(key)
                .arg(0)
                .arg(-1)
                .query_async::<Vec<String>>(&mut con)
                .await
                .unwrap()
        }
    };
    // Rows without an ordering key may reach the queue in any order (two workers claim and
    // push side by side), so each relayed job is matched to the client's by its name.
    let by_name = |jobs: Vec<String>| {
        jobs.iter()
            .map(|job| {
                let job = comparable(job);
                (job["args"][0].as_str().unwrap().to_owned(), job)
            })
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    let (ours, theirs) = (
        by_name(lrange("queue:opts").await),
        by_name(lrange("queue:client").await),
    );
    assert_eq!((ours.len(), theirs.len()), (cases.len(), cases.len()));
    for (name, mut ours) in ours {
        ours["queue"] = json!("client");
        assert_eq!(
            Some(&ours),
            theirs.get(&name),
            "the relayed job {name} is the client's, field by field"
        );
    }
    let _: () = redis::cmd("DEL")
        .arg("queue:client")
        .query_async(&mut con)
        .await
        .unwrap();

    // The worker: four jobs fail once each, one runs.
    sidekiq.start(&["opts", "later"], 2).await;
    let ran = sidekiq.wait_for_runs(1, Duration::from_secs(60)).await;
    let failed = sidekiq.wait_for_failures(4, Duration::from_secs(60)).await;
    // Long enough for a retry that should not happen to show (Sidekiq's first retry waits
    // 15-25 s; none may be due at once).
    hold_for(Duration::from_secs(2), "no retry may run at once").await;
    assert_eq!(sidekiq.failures().len(), 4, "each failing job ran once");
    let name_of = |job: &Value| jids[job["jid"].as_str().unwrap()];
    let mut names: Vec<&str> = failed.iter().map(|r| name_of(&r.job)).collect();
    names.sort();
    assert_eq!(
        names,
        ["exhausted_dropped", "exhausted_kept", "no_retry", "twice"]
    );
    let custom = &ran[0].job;
    assert_eq!(name_of(custom), "custom");
    assert_eq!(custom["bid"], json!("b-1"));
    assert_eq!(custom["app_context"], json!({"tenant": 7, "flags": [true]}));
    assert_eq!(custom["tags"], json!(["x"]));

    // The retry set: only `retry: 2`, retried on its retry_queue, 3 backtrace lines kept.
    let retries = set_members(&redis.url(), "retry").await;
    assert_eq!(retries.len(), 1, "{retries:?}");
    let r = &retries[0];
    assert_eq!(name_of(r), "twice");
    assert_eq!(
        (&r["retry"], &r["retry_count"], &r["queue"], &r["tags"]),
        (
            &json!(2),
            &json!(0),
            &json!("later"),
            &json!(["billing", "eu"])
        ),
        "{r}"
    );
    assert!(r["error_backtrace"].is_string(), "backtrace kept: {r}");
    assert_eq!(r["error_message"], json!("FailingJob fails on purpose"));
    // The dead set: only `retry: 0` without `dead: false`; `retry: false` leaves nothing.
    let dead = set_members(&redis.url(), "dead").await;
    let dead: Vec<&str> = dead.iter().map(name_of).collect();
    assert_eq!(dead, ["exhausted_kept"]);

    // `retry: 2`: retried twice, each time when its retry falls due, then dead.
    for retry in 1..=2 {
        let due = format!("retry {retry} of `twice` waiting in the retry set");
        wait_until(&due, Duration::from_secs(30), || async {
            set_members(&redis.url(), "retry").await.len() == 1
        })
        .await;
        sidekiq
            .ruby("Sidekiq::RetrySet.new.each { |e| e.reschedule(Time.now.to_f) }")
            .await;
        let failed = sidekiq
            .wait_for_failures(4 + retry, Duration::from_secs(60))
            .await;
        let again = failed.last().unwrap();
        assert_eq!(name_of(&again.job), "twice");
        assert_eq!(
            again.job["queue"],
            json!("later"),
            "retried on its retry_queue"
        );
        assert_eq!(again.job["retry_count"], json!(retry - 1), "{}", again.job);
    }
    let exhausted = "`twice` in the dead set after its second retry";
    wait_until(exhausted, Duration::from_secs(30), || async {
        set_members(&redis.url(), "dead").await.len() == 2
    })
    .await;
    let twice_runs = sidekiq
        .failures()
        .iter()
        .filter(|r| name_of(&r.job) == "twice")
        .count();
    assert_eq!(twice_runs, 3, "`retry: 2`: the first run and two retries");
    assert!(set_members(&redis.url(), "retry").await.is_empty());
    let dead = set_members(&redis.url(), "dead").await;
    let last = dead
        .iter()
        .find(|j| name_of(j) == "twice")
        .expect("twice is dead");
    assert_eq!(last["retry_count"], json!(2), "{last}");
}
