//! The Redis side's consumers in the bullmq layout (`jobrelay::admin::queues`), against a real
//! BullMQ `Worker` (tests/it/common/bullmq.rs) on a private redis-server: a worker counts for
//! its queue as many times as BullMQ's own `Queue.getWorkers()` lists it, a queue with jobs and
//! no worker starves, the prefix its workers use is found when the relay writes under another,
//! a killed worker stops counting once its connection is closed, and a server that refuses
//! `CLIENT LIST` leaves the count unknown. The queues BullMQ knows are those with a `meta`
//! hash.

use super::*;
use jobrelay::admin::queues::{elsewhere, look, queues_to_look_at, RedisSide};
use jobrelay::broker::connection::{connect, RedisConnection};

/// `Queue.getWorkers()` of `queue` under the worker's prefix: how many BullMQ lists.
const GET_WORKERS: &str = r#"
const { Queue } = require('bullmq');
const connection = { host: '127.0.0.1', port: Number(process.env.JOBRELAY_TEST_PORT) };
(async () => {
  const q = new Queue(QUEUE, { connection, prefix: process.env.JOBRELAY_TEST_PREFIX });
  console.log((await q.getWorkers()).length);
  await q.close();
})().catch((e) => { console.error(e); process.exit(1); });
"#;

/// How many workers BullMQ's `Queue.getWorkers()` lists for `queue`.
fn get_workers(worker: &BullmqWorker, queue: &str) -> usize {
    let script = scripts::js(&[("QUEUE", json!(queue))], GET_WORKERS);
    let out = worker.node(&script);
    out.trim()
        .parse()
        .unwrap_or_else(|e| panic!("getWorkers' count {out:?}: {e}"))
}

/// The relay's kind of connection to `redis`.
async fn relay_con(redis: &RedisServer) -> RedisConnection {
    let client = redis::Client::open(redis.url().as_str()).unwrap();
    connect(&client, Duration::from_secs(5)).await.unwrap()
}

/// Enqueues `n` jobs on `queue` under `namespace` in the bullmq layout, as the relay does.
async fn enqueue(con: &mut RedisConnection, namespace: &str, queue: &str, n: usize) {
    let enqueuer = Enqueuer::new(namespace.to_owned(), Duration::from_secs(60))
        .with_layout(LayoutKind::Bullmq);
    let jobs: Vec<_> = (0..n)
        .map(|i| {
            JobBuilder::new(queue, NAME)
                .payload(format!(r#"{{"i":{i}}}"#))
                .build()
                .unwrap()
        })
        .collect();
    for result in enqueuer.enqueue_batch(con, &jobs).await.unwrap() {
        assert!(matches!(result, Ok(Outcome::Queued)), "{result:?}");
    }
}

/// The queues `status` and `check` would look at under `namespace`, the outbox naming none.
async fn registered(con: &mut RedisConnection, namespace: &str) -> Vec<String> {
    queues_to_look_at(
        con,
        LayoutKind::Bullmq,
        namespace,
        Vec::new(),
        Duration::from_secs(60),
    )
    .await
    .unwrap()
}

/// The Redis side of `queues` under `namespace`.
async fn side(con: &mut RedisConnection, namespace: &str, queues: &[&str]) -> RedisSide {
    let queues: Vec<String> = queues.iter().map(|q| q.to_string()).collect();
    look(con, LayoutKind::Bullmq, namespace, &queues)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_worker_counts_for_its_queue_as_get_workers_lists_it_and_a_queue_without_starves() {
    let redis = RedisServer::start();
    let mut con = relay_con(&redis).await;
    let worker = BullmqWorker::start(redis.port, PREFIX, &["billing"]).await;
    enqueue(&mut con, NS, "mail", 3).await;
    let held = Duration::from_millis(1500);
    hold_for(held, "the oldest mail job ages").await;

    let got = side(&mut con, NS, &["billing", "mail"]).await;
    assert_eq!(got.consumers_unrecorded, None);
    let (billing, mail) = (&got.queues[0], &got.queues[1]);
    assert_eq!(get_workers(&worker, "billing"), 1, "BullMQ's own count");
    assert_eq!(billing.consumers, Some(1), "{got:?}");
    assert_eq!(billing.depth, 0);
    assert!(!billing.starving());
    assert_eq!(get_workers(&worker, "mail"), 0, "BullMQ's own count");
    assert_eq!(mail.consumers, Some(0), "{got:?}");
    assert_eq!(mail.depth, 3);
    assert!(mail.starving(), "{mail:?}");
    let age = mail.oldest_age_seconds.expect("the oldest job's age");
    assert!(
        age >= held.as_secs_f64() && age < 30.0,
        "the oldest mail job is {age} s old, held {held:?}"
    );
    assert_eq!(
        registered(&mut con, NS).await,
        ["billing", "mail"],
        "the queue the worker reads and the one the relay wrote"
    );
}

#[tokio::test]
async fn the_workers_prefix_is_found_when_the_relay_writes_under_another() {
    let redis = RedisServer::start();
    let mut con = relay_con(&redis).await;
    let _worker = BullmqWorker::start(redis.port, PREFIX, &["billing"]).await;
    enqueue(&mut con, "myapp:", "billing", 2).await;

    let got = side(&mut con, "myapp:", &["billing"]).await;
    let billing = &got.queues[0];
    assert_eq!(billing.consumers, Some(0), "{got:?}");
    assert_eq!(billing.depth, 2);
    assert!(billing.starving());
    let found = elsewhere(&mut con, LayoutKind::Bullmq, "myapp:", "billing")
        .await
        .unwrap();
    assert_eq!(found, [NS]);
    let none = elsewhere(&mut con, LayoutKind::Bullmq, "myapp:", "mail")
        .await
        .unwrap();
    assert!(none.is_empty(), "no worker reads mail: {none:?}");
    assert_eq!(registered(&mut con, "myapp:").await, ["billing"]);
}

#[tokio::test]
async fn a_killed_worker_stops_counting_once_its_connection_is_closed() {
    let redis = RedisServer::start();
    let mut con = relay_con(&redis).await;
    let worker = BullmqWorker::start(redis.port, PREFIX, &["billing"]).await;
    let got = side(&mut con, NS, &["billing"]).await;
    assert_eq!(got.queues[0].consumers, Some(1), "{got:?}");

    worker.kill();
    let counted = || {
        let mut con = con.clone();
        async move { side(&mut con, NS, &["billing"]).await.queues[0].consumers }
    };
    wait_until(
        "the killed worker no longer counted",
        Duration::from_secs(15),
        || async { counted().await == Some(0) },
    )
    .await;
}

#[tokio::test]
async fn a_server_that_refuses_client_list_leaves_the_count_unknown() {
    let redis = RedisServer::start_with(&["--rename-command", "CLIENT", ""]);
    let mut con = relay_con(&redis).await;
    enqueue(&mut con, NS, "mail", 1).await;

    let got = side(&mut con, NS, &["mail"]).await;
    let why = got.consumers_unrecorded.expect("the count unknown");
    assert!(why.contains("CLIENT LIST"), "{why}");
    assert_eq!(got.queues[0].consumers, None);
    assert_eq!(got.queues[0].depth, 1, "the rest is read");
    assert!(!got.queues[0].starving(), "unknown is not none");
    let found = elsewhere(&mut con, LayoutKind::Bullmq, NS, "mail")
        .await
        .unwrap();
    assert!(found.is_empty(), "{found:?}");
}

#[sqlx::test]
async fn a_wrong_prefix_is_told_by_the_metrics_the_log_status_and_check(pool: sqlx::PgPool) {
    let redis = RedisServer::start();
    let worker = BullmqWorker::start(redis.port, PREFIX, &["billing"]).await;
    assert_eq!(get_workers(&worker, "billing"), 1);
    let rows = [("charge", r#"{"n":1}"#), ("charge", r#"{"n":2}"#)];
    let namespaces = ("myapp:", NS);
    crate::common::redis_side::wrong_namespace_is_told(
        &pool,
        &redis.url(),
        "bullmq",
        namespaces,
        "billing",
        &rows,
    )
    .await;
}
