//! The rq layout's consumers (src/broker/layout/rq/consumers.rs) as `jobrelay::admin::queues`
//! reads them, against real `rq worker`s on a private redis-server: a worker counts for the
//! queues it reads and a queue no worker reads starves, with the age of its oldest job; jobs
//! under another namespace point at the worker's; a worker killed stops counting at once,
//! though RQ's own records keep it for minutes, and a worker stopped (SIGSTOP) still counts.

use super::*;
use crate::common::redis_server::RedisServer;
use crate::common::rq::RqWorker;
use jobrelay::admin::queues::{elsewhere, look, queues_to_look_at, RedisSide};
use jobrelay::broker::connection::{connect, RedisConnection};
use jobrelay::broker::layout::consumers::{Consumer, Seen};

/// How long a worker may take to start and register.
const START: Duration = Duration::from_secs(30);

/// The relay's kind of connection to `url`.
async fn connection(url: &str) -> RedisConnection {
    let client = redis::Client::open(url).unwrap();
    connect(&client, Duration::from_secs(5))
        .await
        .expect("redis reachable")
}

/// Relays `n` jobs to `queue` under `namespace`, as the relay writes them.
async fn relay(url: &str, namespace: &str, queue: &str, n: usize) {
    let mut con = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let jobs: Vec<_> = (0..n)
        .map(|i| {
            JobBuilder::new(queue, FUNC)
                .payload(format!("[{i}]"))
                .build()
                .unwrap()
        })
        .collect();
    let enqueuer = Enqueuer::new(namespace.to_owned(), TTL).with_layout(LayoutKind::Rq);
    for r in enqueuer.enqueue_batch(&mut con, &jobs).await.unwrap() {
        assert_eq!(r.unwrap(), Outcome::Queued);
    }
}

/// `queues` under `namespace`, as the reader sees them.
async fn side(con: &RedisConnection, namespace: &str, queues: &[&str]) -> RedisSide {
    let queues: Vec<String> = queues.iter().map(|q| q.to_string()).collect();
    look(&mut con.clone(), LayoutKind::Rq, namespace, &queues)
        .await
        .unwrap()
}

/// How many consumers the reader counts for `queue` under `namespace`.
async fn consumers(con: &RedisConnection, namespace: &str, queue: &str) -> Option<usize> {
    side(con, namespace, &[queue]).await.queues[0].consumers
}

/// Waits until the reader counts `n` consumers of `queue` under `namespace`, at most
/// `deadline`; panics with the worker's log if it does not.
async fn wait_consumers(
    con: &RedisConnection,
    namespace: &str,
    queue: &str,
    n: usize,
    deadline: Duration,
    worker: &RqWorker,
) {
    let counted = eventually(deadline, || async {
        consumers(con, namespace, queue).await == Some(n)
    })
    .await;
    assert!(
        counted,
        "{n} consumers of {queue} under {namespace:?} within {deadline:?}: {:?}; the worker's \
         log:\n{}",
        consumers(con, namespace, queue).await,
        worker.last_lines(40)
    );
}

/// The name [`RqApp::worker`] gives the worker it calls `name`.
fn worker_name(name: &str) -> String {
    format!("jobrelay-test-{}-{name}", std::process::id())
}

#[tokio::test]
async fn a_worker_counts_for_its_queue_and_a_queue_no_worker_reads_starves() {
    let server = RedisServer::start();
    let url = server.url();
    let app = RqApp::new(&url);
    let worker = app.worker("billing", &["billing"], &[]);
    let con = connection(&url).await;
    wait_consumers(&con, "", "billing", 1, START, &worker).await;

    relay(&url, "", "mail", 3).await;
    hold_for(
        Duration::from_secs(2),
        "the oldest job waits: its age is the point",
    )
    .await;
    let side = side(&con, "", &["billing", "mail"]).await;
    assert_eq!(side.consumers_unrecorded, None);
    let (billing, mail) = (&side.queues[0], &side.queues[1]);
    assert_eq!((billing.depth, billing.consumers), (0, Some(1)), "{side:?}");
    assert!(!billing.starving());
    assert_eq!((mail.depth, mail.consumers), (3, Some(0)), "{side:?}");
    assert!(mail.starving(), "{side:?}");
    let age = mail.oldest_age_seconds.expect("RQ's enqueued_at says it");
    assert!((2.0..30.0).contains(&age), "the oldest job's age: {age}");

    // The worker by its name and queues; the queue RQ's registry lists (the relay adds it).
    let seen = LayoutKind::Rq
        .layout()
        .consumers()
        .seen(&mut con.clone(), "")
        .await
        .unwrap();
    assert_eq!(
        seen,
        Seen::Consumers(vec![Consumer {
            name: worker_name("billing"),
            queues: vec!["billing".into()],
        }])
    );
    let listed = queues_to_look_at(&mut con.clone(), LayoutKind::Rq, "", Vec::new(), TTL)
        .await
        .unwrap();
    assert!(listed.contains(&"mail".to_owned()), "{listed:?}");
}

#[tokio::test]
async fn jobs_under_another_namespace_point_at_the_workers() {
    let server = RedisServer::start();
    let url = server.url();
    let app = RqApp::new(&url);
    let worker = app.worker("stock", &["billing"], &[]);
    let con = connection(&url).await;
    wait_consumers(&con, "", "billing", 1, START, &worker).await;

    relay(&url, "myapp:", "billing", 2).await;
    let side = side(&con, "myapp:", &["billing"]).await;
    let billing = &side.queues[0];
    assert_eq!((billing.depth, billing.consumers), (2, Some(0)), "{side:?}");
    assert!(billing.starving());
    let con = &mut con.clone();
    assert_eq!(
        elsewhere(con, LayoutKind::Rq, "myapp:", "billing")
            .await
            .unwrap(),
        [""],
        "the stock worker's namespace"
    );
    assert!(elsewhere(con, LayoutKind::Rq, "myapp:", "mail")
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn a_killed_worker_stops_counting_at_once_a_stopped_one_counts_on() {
    let server = RedisServer::start();
    let url = server.url();
    let app = RqApp::new(&url);
    let worker = app.worker("doomed", &["billing"], &[]);
    let con = connection(&url).await;
    wait_consumers(&con, "", "billing", 1, START, &worker).await;

    // Stopped, its connection stays open and its hash lives on: it counts.
    worker.signal("STOP");
    hold_for(
        Duration::from_secs(3),
        "a stopped worker: nothing may change while it is held",
    )
    .await;
    assert_eq!(consumers(&con, "", "billing").await, Some(1));

    // Killed (while stopped), its connection closes: it no longer counts, though its hash and
    // RQ's set keep it until the hash expires (worker_ttl + 60 s).
    worker.kill();
    wait_consumers(&con, "", "billing", 0, Duration::from_secs(10), &worker).await;
    let key = format!("rq:worker:{}", worker_name("doomed"));
    let mut raw = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let (member, ttl): (bool, i64) = redis::pipe()
        .cmd("SISMEMBER")
        .arg("rq:workers")
        .arg(&key)
        .cmd("TTL")
        .arg(&key)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(member && ttl > 60, "RQ's records keep it: {member} {ttl}");
}

#[sqlx::test]
async fn a_wrong_namespace_is_told_by_the_metrics_the_log_status_and_check(pool: sqlx::PgPool) {
    let server = RedisServer::start();
    let url = server.url();
    let app = RqApp::new(&url);
    let worker = app.worker("billing", &["billing"], &[]);
    wait_consumers(&connection(&url).await, "", "billing", 1, START, &worker).await;
    let rows = [(FUNC, "[1]"), (FUNC, "[2]")];
    crate::common::redis_side::wrong_namespace_is_told(
        &pool,
        &url,
        "rq",
        ("myapp:", ""),
        "billing",
        &rows,
    )
    .await;
}
