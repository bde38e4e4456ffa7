//! Worker supervision: no silent zombie. A worker that dies (here: a panic injected
//! through the sink seam) is restarted; when its tasks keep dying, `/healthz` fails so that
//! Kubernetes restarts the process; and it recovers once a batch completes again.
//!
//! Both tests run `jobrelay::relay::spawn` in-process with two workers over a fresh database
//! (`#[sqlx::test]`) and a random Redis namespace. They read the process-wide counter
//! `jobrelay_task_panics_total{task="worker"}`, so they take turns ([`SERIAL`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use jobrelay::broker::enqueue::JobResult;
use jobrelay::broker::redis_sink::RedisSink;
use jobrelay::relay::health::PANIC_LIMIT;
use jobrelay::relay::{BatchSettings, Health, JobSink, RelaySettings};
use jobrelay::{Enqueuer, Job, Outcome, TableName};
use metrics_exporter_prometheus::PrometheusHandle;
use sqlx::PgPool;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

const ROWS: i64 = 100;

/// The tests read one process-wide counter: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A sink that panics instead of pushing while `always` is set or `left` panics remain, and
/// otherwise pushes for real, counting what it did.
#[derive(Clone)]
struct Panicky {
    inner: RedisSink,
    message: &'static str,
    always: Arc<AtomicBool>,
    left: Arc<AtomicU64>,
    panics: Arc<AtomicU64>,
    pushed: Arc<AtomicU64>,
    duplicates: Arc<AtomicU64>,
}

impl Panicky {
    async fn new(ns: &Namespace, message: &'static str, left: u64, always: bool) -> Self {
        let enqueuer = Enqueuer::new(ns.prefix.clone(), Duration::from_secs(600));
        Panicky {
            inner: RedisSink::new(enqueuer, ns.manager().await.into(), Duration::from_secs(5)),
            message,
            always: Arc::new(AtomicBool::new(always)),
            left: Arc::new(AtomicU64::new(left)),
            panics: Arc::default(),
            pushed: Arc::default(),
            duplicates: Arc::default(),
        }
    }
}

impl JobSink for Panicky {
    async fn push(&self, jobs: &[Job]) -> jobrelay::Result<Vec<JobResult>> {
        let take_one = |n: u64| n.checked_sub(1);
        if self.always.load(Ordering::SeqCst)
            || self
                .left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, take_one)
                .is_ok()
        {
            self.panics.fetch_add(1, Ordering::SeqCst);
            panic!("{}", self.message);
        }
        let results = self.inner.push(jobs).await?;
        for r in &results {
            let counter = match r {
                Ok(Outcome::Duplicate) => &self.duplicates,
                _ => &self.pushed,
            };
            counter.fetch_add(1, Ordering::SeqCst);
        }
        Ok(results)
    }
}

/// Two workers (sharing the sink's counters), batches of 10, until the token is cancelled.
fn start(pool: &PgPool, sink: &Panicky, health: &Arc<Health>) -> (TaskTracker, CancellationToken) {
    let settings = RelaySettings {
        table: TableName::default(),
        batch: BatchSettings {
            batch_size: 10,
            ..BatchSettings::default()
        },
        poll_interval: Duration::from_millis(200),
    };
    let (tracker, shutdown) = (TaskTracker::new(), CancellationToken::new());
    let sinks = vec![sink.clone(), sink.clone()];
    let pool = pool.clone();
    jobrelay::relay::spawn(
        &tracker,
        &settings,
        pool,
        sinks,
        health.clone(),
        shutdown.clone(),
    );
    (tracker, shutdown)
}

async fn stop(tracker: TaskTracker, shutdown: CancellationToken) {
    shutdown.cancel();
    tracker.close();
    let stopped = tokio::time::timeout(Duration::from_secs(30), tracker.wait()).await;
    stopped.expect("the relay's tasks stop");
}

/// `jobrelay_task_panics_total{task="worker"}` so far in this process.
fn worker_panics(metrics: &PrometheusHandle) -> u64 {
    let text = metrics.render();
    let line = text
        .lines()
        .find(|l| l.starts_with("jobrelay_task_panics_total{task=\"worker\"}"));
    line.and_then(|l| l.split_whitespace().last()?.parse().ok())
        .unwrap_or(0)
}

/// (count, max attempts, rows with an error) of the pending rows; and the dead-letter count.
async fn table_state(pool: &PgPool) -> ((i64, i32, i64), i64) {
    let pending =
        "SELECT count(*), coalesce(max(attempts), 0), count(last_error) FROM pending_jobs";
    let pending = sqlx::query_as(pending).fetch_one(pool).await.unwrap();
    let dead = "SELECT count(*) FROM pending_jobs_dead";
    (
        pending,
        sqlx::query_scalar(dead).fetch_one(pool).await.unwrap(),
    )
}

/// (status, body) of `GET path` on 127.0.0.1:`port`.
async fn http_get(port: u16, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    s.write_all(request.as_bytes()).await.unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    (head[9..12].parse().unwrap(), body.to_owned())
}

// ---------------------------------------------------------------------------------------------

#[sqlx::test]
async fn workers_that_panic_are_restarted_and_lose_nothing(pool: PgPool) {
    let _turn = SERIAL.lock().await;
    let metrics = jobrelay::http::install_recorder().unwrap();
    let before = worker_panics(&metrics);
    let ns = Namespace::new();
    insert_rows(&pool, ROWS, "supervised").await;
    let sink = Panicky::new(&ns, "injected panic: first pushes", 5, false).await;
    let health = Arc::new(Health::default());

    let (tracker, shutdown) = start(&pool, &sink, &health);
    wait_until("every row relayed", Duration::from_secs(60), || async {
        pending_count(&pool).await == 0
    })
    .await;
    stop(tracker, shutdown).await;

    assert_eq!(sink.panics.load(Ordering::SeqCst), 5);
    assert_eq!(
        worker_panics(&metrics) - before,
        5,
        "each panic was caught and counted"
    );
    // Each row reached Redis exactly once: a panicked batch rolled back before any push.
    assert_eq!(sink.pushed.load(Ordering::SeqCst), ROWS as u64);
    assert_eq!(sink.duplicates.load(Ordering::SeqCst), 0);
    assert_eq!(ns.llen("queue:supervised").await, ROWS as usize);
    assert_eq!(ns.marker_count().await, ROWS as usize);
    assert_eq!(
        table_state(&pool).await,
        ((0, 0, 0), 0),
        "nothing lost or dead-lettered"
    );
    assert_eq!(health.liveness(), Ok(()));
}

#[sqlx::test]
async fn healthz_fails_while_workers_keep_panicking_and_recovers_after_a_batch(pool: PgPool) {
    let _turn = SERIAL.lock().await;
    let metrics = jobrelay::http::install_recorder().unwrap();
    let before = worker_panics(&metrics);
    let ns = Namespace::new();
    insert_rows(&pool, ROWS, "zombie").await;
    let sink = Panicky::new(&ns, "injected panic: every push", 0, true).await;
    let health = Arc::new(Health::default());
    let listener = jobrelay::http::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    let http_stop = CancellationToken::new();
    let http = jobrelay::http::serve(listener, metrics.clone(), health.clone(), http_stop.clone());
    let http = tokio::spawn(http);
    assert_eq!(http_get(port, "/healthz").await.0, 200);

    let (tracker, shutdown) = start(&pool, &sink, &health);
    wait_until("liveness fails", Duration::from_secs(30), || async {
        health.liveness().is_err()
    })
    .await;
    let why = health.liveness().unwrap_err();
    assert!(why.contains("worker: injected panic: every push"), "{why}");
    let (status, body) = http_get(port, "/healthz").await;
    assert_eq!(status, 503);
    assert!(
        body.contains("times in a row, last: worker: injected panic: every push"),
        "{body}"
    );
    assert!(sink.panics.load(Ordering::SeqCst) >= PANIC_LIMIT);
    assert!(worker_panics(&metrics) - before >= PANIC_LIMIT);
    // The rows were claimed and rolled back each time: untouched, nothing in Redis.
    assert_eq!(table_state(&pool).await, ((ROWS, 0, 0), 0));
    assert_eq!(ns.llen("queue:zombie").await, 0);

    // The fault goes away: the restarted workers complete batches and liveness recovers.
    sink.always.store(false, Ordering::SeqCst);
    wait_until("every row relayed", Duration::from_secs(60), || async {
        pending_count(&pool).await == 0
    })
    .await;
    wait_until("liveness recovers", Duration::from_secs(10), || async {
        health.liveness().is_ok()
    })
    .await;
    assert_eq!(http_get(port, "/healthz").await, (200, "ok\n".to_owned()));
    stop(tracker, shutdown).await;
    http_stop.cancel();
    http.await.unwrap().unwrap();
    assert_eq!(sink.pushed.load(Ordering::SeqCst), ROWS as u64);
    assert_eq!(sink.duplicates.load(Ordering::SeqCst), 0);
    assert_eq!(table_state(&pool).await, ((0, 0, 0), 0));
}
