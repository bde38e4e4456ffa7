//! Execution order with a real runner (docs/layouts/README.md#execution-order): the relay keeps
//! a key's order up to its queue; one worker at concurrency 1 alone on each shard queue then
//! runs a key's jobs one after another, in `id` order. Rows over 6 keys in 2 shard queues are
//! committed with the page's own shard INSERT, in transactions of random keys, while the relay
//! and the workers run; every job sleeps a random few milliseconds and records when it started
//! and ended. Each key's runs must start in `id` order, each after the one before it ended.

use std::collections::BTreeMap;

use super::*;
use crate::common::child::RelayChild;
use crate::common::exactly_once::doc_sql;
use crate::common::redis_server::RedisServer;
use crate::common::rq::RqApp;
use crate::common::sidekiq::Sidekiq;
use serde_json::{json, Value};

/// The shard queues' base name, `$1` of the page's INSERT.
const BASE: &str = "billing";
const SHARDS: usize = 2;
const KEYS_PER_SHARD: usize = 3;
const JOBS_PER_KEY: usize = 20;
/// The recipe's concurrency: one job at a time per shard queue.
const CONCURRENCY: u32 = 1;

/// The shard INSERT of docs/layouts/README.md, word for word, returning the row's id and queue.
fn shard_insert() -> String {
    format!(
        "{} RETURNING id, queue",
        doc_sql("README.md", "<!-- shard-insert -->").trim_end()
    )
}

/// A shard queue and the keys the page's INSERT puts there.
struct Shard {
    queue: String,
    keys: Vec<String>,
}

/// `SHARDS` shard queues with `KEYS_PER_SHARD` keys each, as the page's INSERT computes them
/// (for one row of each of 64 keys, in a transaction rolled back).
async fn shards(pool: &PgPool) -> Vec<Shard> {
    let mut by_queue: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut tx = pool.begin().await.unwrap();
    for k in 0..64 {
        let key = format!("account-{k}");
        let (_, queue): (i64, String) = sqlx::query_as(&shard_insert())
            .bind(BASE)
            .bind("Probe")
            .bind("[]")
            .bind(&key)
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        by_queue.entry(queue).or_default().push(key);
    }
    tx.rollback().await.unwrap();
    let shards: Vec<Shard> = by_queue
        .into_iter()
        .filter(|(_, keys)| keys.len() >= KEYS_PER_SHARD)
        .take(SHARDS)
        .map(|(queue, mut keys)| {
            keys.truncate(KEYS_PER_SHARD);
            Shard { queue, keys }
        })
        .collect();
    assert_eq!(shards.len(), SHARDS, "64 keys over 8 shards");
    shards
}

/// A row committed: its id and key. Its job's arguments end with the key and the row's index
/// in the `Vec` returned by [`produce`].
struct Job {
    id: i64,
    key: String,
}

/// Commits `JOBS_PER_KEY` rows for every key of `shards` with the page's INSERT, in
/// transactions of 1..=10 rows of random keys; `payload(ms, key, n)` is the n-th row's payload,
/// for a job that sleeps `ms` milliseconds (0..=8). Checks each row went to its key's queue.
async fn produce(
    pool: &PgPool,
    shards: &[Shard],
    job_type: &str,
    payload: impl Fn(u64, &str, usize) -> String,
) -> Vec<Job> {
    let keys: Vec<(&str, &str)> = shards
        .iter()
        .flat_map(|s| s.keys.iter().map(|k| (k.as_str(), s.queue.as_str())))
        .collect();
    let total = keys.len() * JOBS_PER_KEY;
    let insert = shard_insert();
    let mut jobs: Vec<Job> = Vec::with_capacity(total);
    while jobs.len() < total {
        let rows = rand::rng().random_range(1..=10).min(total - jobs.len());
        let mut tx = pool.begin().await.unwrap();
        for _ in 0..rows {
            let (key, shard) = keys[rand::rng().random_range(0..keys.len())];
            let ms = rand::rng().random_range(0..=8);
            let (id, queue): (i64, String) = sqlx::query_as(&insert)
                .bind(BASE)
                .bind(job_type)
                .bind(payload(ms, key, jobs.len()))
                .bind(key)
                .fetch_one(&mut *tx)
                .await
                .unwrap();
            assert_eq!(queue, shard, "{key}'s queue");
            jobs.push(Job {
                id,
                key: key.to_owned(),
            });
        }
        tx.commit().await.unwrap();
    }
    jobs
}

/// One run: the row's index in `produce`'s `Vec`, when it started and ended (epoch seconds).
#[derive(Debug)]
struct Ran {
    n: usize,
    start: f64,
    end: f64,
}

/// The row index of a job whose arguments end with its key and index.
fn index_of(args: &Value) -> usize {
    let args = args.as_array().expect("arguments");
    args[args.len() - 1].as_u64().expect("the row's index") as usize
}

/// Every row ran once, and each key's runs, by start, have rising ids and start after the one
/// before ended. Returns the keys checked.
fn assert_each_key_ran_in_id_order(jobs: &[Job], runs: &[Ran]) -> usize {
    let mut seen = vec![0; jobs.len()];
    let mut by_key: BTreeMap<&str, Vec<&Ran>> = BTreeMap::new();
    for r in runs {
        seen[r.n] += 1;
        by_key.entry(&jobs[r.n].key).or_default().push(r);
    }
    let not_once: Vec<(i64, usize)> = seen
        .iter()
        .enumerate()
        .filter(|(_, c)| **c != 1)
        .map(|(n, c)| (jobs[n].id, *c))
        .collect();
    assert!(
        not_once.is_empty(),
        "rows not run once (id, runs): {not_once:?}"
    );
    let mut wrong = Vec::new();
    for (key, runs) in &mut by_key {
        runs.sort_by(|a, b| a.start.total_cmp(&b.start));
        for pair in runs.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            let (ida, idb) = (jobs[a.n].id, jobs[b.n].id);
            if idb < ida {
                wrong.push(format!("{key}: row {idb} started after row {ida}"));
            }
            if b.start < a.end {
                wrong.push(format!(
                    "{key}: row {idb} started {:.1} ms before row {ida} ended",
                    (a.end - b.start) * 1000.0
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} runs out of order or overlapping, first: {:#?}",
        wrong.len(),
        &wrong[..wrong.len().min(8)]
    );
    by_key.len()
}

#[sqlx::test]
async fn one_sidekiq_at_concurrency_1_per_shard_runs_each_key_in_id_order(pool: PgPool) {
    let redis = RedisServer::start();
    let shards = shards(&pool).await;
    let mut workers = Vec::new();
    for shard in &shards {
        // An application directory each: one `sidekiq -q <shard> -c 1` process per shard.
        let mut sidekiq = Sidekiq::new(&redis.url());
        sidekiq.start(&[&shard.queue], CONCURRENCY).await;
        workers.push(sidekiq);
    }
    let db = database_url_of(&pool).await;
    let _relay = RelayChild::start(&db, &redis.url(), "", &["--layout", "sidekiq"]);
    let jobs = produce(&pool, &shards, "TimedJob", |ms, key, n| {
        json!([ms, key, n]).to_string()
    })
    .await;
    let spans = || -> Vec<Ran> {
        workers
            .iter()
            .flat_map(Sidekiq::spans)
            .map(|s| Ran {
                n: index_of(&s.args),
                start: s.start,
                end: s.end,
            })
            .collect()
    };
    let logs = || {
        workers
            .iter()
            .map(|w| std::fs::read_to_string(w.dir.path().join("worker.log")).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
    };
    let runs = wait_for_records("runs", jobs.len(), Duration::from_secs(60), spans, logs).await;
    assert_eq!(
        assert_each_key_ran_in_id_order(&jobs, &runs),
        SHARDS * KEYS_PER_SHARD
    );
}

#[sqlx::test]
async fn one_rq_worker_per_shard_runs_each_key_in_id_order(pool: PgPool) {
    let redis = RedisServer::start();
    let shards = shards(&pool).await;
    let app = RqApp::new(&redis.url());
    let workers: Vec<_> = shards
        .iter()
        .enumerate()
        .map(|(i, s)| app.worker(&format!("shard{i}"), &[&s.queue], &[]))
        .collect();
    let db = database_url_of(&pool).await;
    let _relay = RelayChild::start(&db, &redis.url(), "", &["--layout", "rq"]);
    let jobs = produce(&pool, &shards, "jobs.span", |ms, key, n| {
        json!({ "args": [ms as f64 / 1000.0, key, n] }).to_string()
    })
    .await;
    // Each run records twice: its start, then its end.
    let logs = || {
        workers
            .iter()
            .map(|w| w.last_lines(40))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let records = app
        .wait_runs(2 * jobs.len(), Duration::from_secs(90), logs)
        .await;
    let mut starts: HashMap<String, f64> = HashMap::new();
    let mut runs = Vec::new();
    for r in records {
        match r.kwargs["phase"].as_str() {
            Some("start") => assert!(starts.insert(r.id, r.at).is_none(), "started twice"),
            Some("end") => runs.push(Ran {
                n: index_of(&r.args),
                start: starts[&r.id],
                end: r.at,
            }),
            other => panic!("a run without its phase: {other:?}"),
        }
    }
    assert_eq!(
        assert_each_key_ran_in_id_order(&jobs, &runs),
        SHARDS * KEYS_PER_SHARD
    );
}
