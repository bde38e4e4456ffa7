//! The celery layout's consumers (src/broker/layout/celery/consumers.rs) as
//! `jobrelay::admin::queues` reads them, against real Celery workers on a private
//! redis-server, in database 2 (the pidbox channel names the connection's database): a
//! connected worker counts for the queues declared and a queue no one declared starves, with
//! the age only an expiring message tells; jobs under another `global_keyprefix` point at the
//! worker's; a worker killed stops counting at once, though its mailbox's binding still names it,
//! and a worker stopped (SIGSTOP) still counts.

use super::*;
use crate::common::celery::CeleryWorker;
use crate::common::redis_server::RedisServer;
use jobrelay::admin::queues::{elsewhere, look, RedisSide};
use jobrelay::broker::connection::{connect, RedisConnection};
use jobrelay::broker::layout::consumers::Seen;

/// The relay's kind of connection to `url`.
async fn connection(url: &str) -> RedisConnection {
    let client = redis::Client::open(url).unwrap();
    connect(&client, Duration::from_secs(5))
        .await
        .expect("redis reachable")
}

/// A private server and the URL of its database 2.
fn server() -> (RedisServer, String) {
    let server = RedisServer::start();
    let url = format!("{}/2", server.url());
    (server, url)
}

/// Relays `jobs` under `namespace`, as the relay writes them.
async fn relay(url: &str, namespace: &str, jobs: &[jobrelay::Job]) {
    let mut con = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let enqueuer = Enqueuer::new(namespace.to_owned(), Duration::from_secs(60))
        .with_layout(LayoutKind::Celery);
    for r in enqueuer.enqueue_batch(&mut con, jobs).await.unwrap() {
        assert_eq!(r.unwrap(), Outcome::Queued);
    }
}

/// `n` jobs of [`TASK`] to `queue`.
fn jobs(queue: &str, n: usize) -> Vec<jobrelay::Job> {
    (0..n)
        .map(|i| {
            JobBuilder::new(queue, TASK)
                .payload(format!("[{i}]"))
                .build()
                .unwrap()
        })
        .collect()
}

/// `queues` under `namespace`, as the reader sees them.
async fn side(con: &RedisConnection, namespace: &str, queues: &[&str]) -> RedisSide {
    let queues: Vec<String> = queues.iter().map(|q| q.to_string()).collect();
    look(&mut con.clone(), LayoutKind::Celery, namespace, &queues)
        .await
        .unwrap()
}

/// How many consumers the reader counts for `queue` under `namespace`.
async fn consumers(con: &RedisConnection, namespace: &str, queue: &str) -> Option<usize> {
    side(con, namespace, &[queue]).await.queues[0].consumers
}

/// Waits until the reader counts one consumer of billing (the worker subscribes to its
/// mailbox about when it says it is ready), at most 10 s.
async fn wait_counted(con: &RedisConnection, worker: &CeleryWorker) {
    let counted = eventually(Duration::from_secs(10), || async {
        consumers(con, "", "billing").await == Some(1)
    })
    .await;
    assert!(
        counted,
        "the worker not counted; its log:\n{}",
        worker.last_lines(40)
    );
}

/// The node name [`CeleryWorker::start`] gives its worker, up to the host.
fn node_prefix() -> String {
    format!("jobrelay-test-{}@", std::process::id())
}

#[tokio::test]
async fn a_worker_counts_for_the_declared_queues_and_a_queue_none_declared_starves() {
    let (_server, url) = server();
    let worker = CeleryWorker::start(&url, "", &["billing"], &[TASK]).await;
    let con = connection(&url).await;
    wait_counted(&con, &worker).await;

    // Relayed: three jobs to mail, one that expires to audit. Sent by celery's own client, one
    // that expires to reports: the client declares the queue.
    relay(&url, "", &jobs("mail", 3)).await;
    let expiring = JobBuilder::new("audit", TASK)
        .payload("[1]")
        .option("expires", 300)
        .build()
        .unwrap();
    relay(&url, "", &[expiring]).await;
    worker.python(&format!(
        "from app import app\napp.send_task({TASK:?}, args=[1], queue='reports', expires=300)\n"
    ));
    hold_for(
        Duration::from_secs(2),
        "the oldest jobs wait: their age is the point",
    )
    .await;

    let side = side(&con, "", &["billing", "mail", "audit", "reports"]).await;
    assert_eq!(side.consumers_unrecorded, None);
    let [billing, mail, audit, reports] = &side.queues[..] else {
        panic!("four queues: {side:?}")
    };
    assert_eq!((billing.depth, billing.consumers), (0, Some(1)), "{side:?}");
    assert!(!billing.starving());
    // No sent time in a message that does not expire.
    assert_eq!(
        (mail.depth, mail.consumers, mail.oldest_age_seconds),
        (3, Some(0), None),
        "{side:?}"
    );
    assert!(mail.starving());
    assert_eq!((audit.depth, audit.consumers), (1, Some(0)), "{side:?}");
    assert!(audit.starving());
    // Declared by the client, reports counts the worker: the rule's limit.
    assert_eq!((reports.depth, reports.consumers), (1, Some(1)), "{side:?}");
    for q in [audit, reports] {
        let age = q.oldest_age_seconds.expect("an expiring message says when");
        assert!((2.0..30.0).contains(&age), "{}: {age}", q.queue);
    }

    // The worker, named by its mailbox, reads every queue declared.
    let seen = LayoutKind::Celery
        .layout()
        .consumers()
        .seen(&mut con.clone(), "")
        .await
        .unwrap();
    let Seen::Consumers(all) = seen else {
        panic!("{seen:?}")
    };
    assert_eq!(all.len(), 1, "{all:?}");
    assert!(all[0].name.starts_with(&node_prefix()), "{all:?}");
    assert_eq!(all[0].queues, ["billing", "reports"]);
    worker.stop().await;
    let gone = eventually(Duration::from_secs(10), || async {
        consumers(&con, "", "billing").await == Some(0)
    })
    .await;
    assert!(gone, "a worker stopped cleanly still counts");
}

#[tokio::test]
async fn jobs_under_another_keyprefix_point_at_the_workers() {
    let (_server, url) = server();
    let worker = CeleryWorker::start(&url, "", &["billing"], &[TASK]).await;
    let con = connection(&url).await;
    wait_counted(&con, &worker).await;

    relay(&url, "myapp:", &jobs("billing", 2)).await;
    let side = side(&con, "myapp:", &["billing"]).await;
    let billing = &side.queues[0];
    assert_eq!((billing.depth, billing.consumers), (2, Some(0)), "{side:?}");
    assert!(billing.starving());
    let con = &mut con.clone();
    assert_eq!(
        elsewhere(con, LayoutKind::Celery, "myapp:", "billing")
            .await
            .unwrap(),
        [""],
        "the stock worker's keyprefix"
    );
    assert!(elsewhere(con, LayoutKind::Celery, "myapp:", "mail")
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn a_killed_worker_stops_counting_at_once_a_stopped_one_counts_on() {
    let (_server, url) = server();
    let worker = CeleryWorker::start(&url, "", &["billing"], &[TASK]).await;
    let con = connection(&url).await;
    wait_counted(&con, &worker).await;

    // Stopped, its connections stay open: it counts.
    worker.signal("STOP");
    hold_for(
        Duration::from_secs(3),
        "a stopped worker: nothing may change while it is held",
    )
    .await;
    assert_eq!(consumers(&con, "", "billing").await, Some(1));

    // Killed (while stopped), its connections close: it no longer counts, though the bindings
    // it made, its mailbox's too, stay.
    worker.kill();
    let gone = eventually(Duration::from_secs(10), || async {
        consumers(&con, "", "billing").await == Some(0)
    })
    .await;
    assert!(gone, "still counted; its log:\n{}", worker.last_lines(40));
    let mut raw = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mailboxes: Vec<String> = redis::cmd("SMEMBERS")
        .arg("_kombu.binding.celery.pidbox")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(
        mailboxes.len() == 1
            && mailboxes[0].starts_with(&format!("\x06\x16\x06\x16{}", node_prefix())),
        "{mailboxes:?}"
    );
}

#[sqlx::test]
async fn a_wrong_keyprefix_is_told_by_the_metrics_the_log_status_and_check(pool: sqlx::PgPool) {
    let (_server, url) = server();
    let worker = CeleryWorker::start(&url, "", &["billing"], &[TASK]).await;
    wait_counted(&connection(&url).await, &worker).await;
    let payload = r#"{"args": [1], "kwargs": {}}"#;
    let rows = [(TASK, payload), (TASK, payload)];
    crate::common::redis_side::wrong_namespace_is_told(
        &pool,
        &url,
        "celery",
        ("myapp:", ""),
        "billing",
        &rows,
    )
    .await;
}
