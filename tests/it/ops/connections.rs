//! The relay's Postgres connections: how many it opens (`--pg-max-connections`), a server that
//! refuses more (`too many connections`, named in logs, `/readyz` and `check`), and a primary
//! gone silent behind a proxy that then switches to a live server (readiness names it, workers
//! and listener recover, SIGTERM exits 0).

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use super::*;
use crate::common::proxy::Proxy;

/// The relay's connections to this test's database (`application_name` jobrelay).
async fn relay_connections(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND application_name = 'jobrelay'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Runs a daemon with `args` through bursts and idle spells, sampling its connections;
/// returns the most it held, and the daemon (still running).
async fn most_connections(pool: &PgPool, ns: &Namespace, args: &[&str]) -> (i64, Daemon) {
    let db = database_url_of(pool).await;
    let d = Daemon::start(
        args,
        &[
            ("DATABASE_URL", &db),
            ("REDIS_URL", &ns.url),
            ("JOBRELAY_NAMESPACE", &ns.prefix),
        ],
    );
    d.wait_ready(Duration::from_secs(15)).await;
    let most = Arc::new(AtomicI64::new(0));
    let stop = tokio_util::sync::CancellationToken::new();
    let sampler = {
        let (pool, most, stop) = (pool.clone(), most.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                most.fetch_max(relay_connections(&pool).await, Ordering::SeqCst);
                hold_for(Duration::from_millis(2), "between samples").await;
            }
        })
    };
    for burst in 1..=3 {
        insert_rows(pool, 3000, "burst").await;
        wait_until("the burst is relayed", Duration::from_secs(60), || async {
            ns.llen("queue:burst").await == burst * 3000
        })
        .await;
        // Idle until the wake-up lock is released (the next burst takes it again).
        released(pool).await;
    }
    stop.cancel();
    sampler.await.unwrap();
    (most.load(Ordering::SeqCst), d)
}

#[sqlx::test]
async fn the_footprint_follows_pg_max_connections(pool: PgPool) {
    // The default: workers + 3 (workers, probe, listener, wake-up lock).
    let ns = Namespace::new();
    let (most, mut d) = most_connections(&pool, &ns, &["--workers", "2"]).await;
    assert!(
        (4..=5).contains(&most),
        "2 workers hold at most 5 connections by default, and use more than the pool: {most}"
    );
    assert_eq!(d.terminate(Duration::from_secs(30)).await, Some(0));

    // A sidecar: one worker and the probe, polling.
    let ns = Namespace::new();
    let (most, mut d) = most_connections(
        &pool,
        &ns,
        &[
            "--workers",
            "1",
            "--pg-max-connections",
            "2",
            "--poll-interval",
            "100ms",
        ],
    )
    .await;
    assert!(most <= 2, "--pg-max-connections 2: {most} connections");
    assert_eq!(d.terminate(Duration::from_secs(30)).await, Some(0));
    assert_eq!(
        d.events_with("no notification listener (--pg-max-connections): idle workers poll")
            .len(),
        1,
        "{}",
        d.logs()
    );

    // Fewer than a worker each plus the probe: a usage error.
    let (code, _, stderr) = run_relay(
        &["--workers", "2", "--pg-max-connections", "2", "check"],
        &[],
    )
    .await;
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("--pg-max-connections: 2 is fewer than one connection per worker"),
        "{stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
}

#[sqlx::test]
async fn too_many_connections_is_named_in_logs_readyz_and_check(pool: PgPool) {
    with_a_refused_role(&pool, "jr_full", |pool, role| async move {
        too_many_connections_scenario(&pool, &role).await
    })
    .await;
}

async fn too_many_connections_scenario(pool: &PgPool, role: &str) {
    let mut url = url::Url::parse(&database_url_of(pool).await).unwrap();
    url.set_username(role).unwrap();
    let url = url.to_string();
    let ns = Namespace::new();
    let mut d = Daemon::start(
        &[],
        &[
            ("DATABASE_URL", &url),
            ("REDIS_URL", &ns.url),
            ("JOBRELAY_NAMESPACE", &ns.prefix),
        ],
    );
    let port = d.port;
    wait_until(
        "/readyz names too many connections",
        Duration::from_secs(20),
        || async {
            http_get(port, "/readyz")
                .await
                .is_ok_and(|(s, body)| s == 503 && body.contains("postgres: too many connections"))
        },
    )
    .await;
    // Several probes and batches fail meanwhile: one episode, logged once.
    hold_for(Duration::from_secs(3), "the refusals last; one episode").await;
    let (status, body) = d.get("/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("too many connections for role"), "{body}");
    assert_eq!(d.terminate(Duration::from_secs(30)).await, Some(0));
    let episodes: Vec<_> = d
        .events()
        .into_iter()
        .filter(|e| e["dependency"] == "postgres" && e["reason"].is_string())
        .collect();
    assert_eq!(episodes.len(), 1, "{episodes:#?}");
    assert_eq!(
        episodes[0]["reason"], "too many connections",
        "{episodes:#?}"
    );

    let (code, stdout, stderr) = run_relay(
        &["check"],
        &[("DATABASE_URL", &url), ("REDIS_URL", &ns.url)],
    )
    .await;
    assert_ne!(code, 0, "{stdout}{stderr}");
    assert!(
        format!("{stdout}{stderr}").contains("too many connections"),
        "check names it: {stdout}{stderr}"
    );
}

/// A daemon (polling every 30 s) whose Postgres is reached through `proxy`, ready and with a
/// first row relayed.
async fn relay_behind(proxy: &Proxy, pool: &PgPool, ns: &Namespace) -> Daemon {
    let mut url = url::Url::parse(&database_url_of(pool).await).unwrap();
    url.set_port(Some(proxy.port)).unwrap();
    let url = url.to_string();
    let d = Daemon::start(
        &["--poll-interval", "30s", "--shutdown-timeout", "10s"],
        &[
            ("DATABASE_URL", &url),
            ("REDIS_URL", &ns.url),
            ("JOBRELAY_NAMESPACE", &ns.prefix),
        ],
    );
    d.wait_ready(Duration::from_secs(15)).await;
    insert_rows(pool, 1, "warmup").await;
    wait_until(
        "the warm-up row is relayed",
        Duration::from_secs(5),
        || async { ns.llen("queue:warmup").await == 1 },
    )
    .await;
    d
}

/// A producer committing 20 rows of the queue `steady` every 20 ms, straight to the server.
struct SteadyProducer {
    inserted: Arc<AtomicI64>,
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl SteadyProducer {
    fn start(pool: &PgPool) -> SteadyProducer {
        let inserted = Arc::new(AtomicI64::new(0));
        let stop = tokio_util::sync::CancellationToken::new();
        let task = {
            let (pool, inserted, stop) = (pool.clone(), inserted.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.is_cancelled() {
                    insert_rows(&pool, 20, "steady").await;
                    inserted.fetch_add(20, Ordering::SeqCst);
                    hold_for(Duration::from_millis(20), "the producer's pace").await;
                }
            })
        };
        SteadyProducer {
            inserted,
            stop,
            task,
        }
    }

    /// Stops it; the rows it inserted.
    async fn stop(self) -> usize {
        self.stop.cancel();
        self.task.await.unwrap();
        self.inserted.load(Ordering::SeqCst) as usize
    }
}

#[sqlx::test]
async fn a_primary_gone_silent_is_noticed_and_survived(pool: PgPool) {
    let proxy = Proxy::start("127.0.0.1:5432".parse().unwrap());
    let ns = Namespace::new();
    let mut d = relay_behind(&proxy, &pool, &ns).await;

    // Producers keep committing (straight to the server) while the relay's server goes
    // silent: the relay is busy, its workers, wake-up lock and listener all hold connections.
    let producer = SteadyProducer::start(&pool);
    wait_until(
        "the relay relays the steady stream",
        Duration::from_secs(10),
        || async { ns.llen("queue:steady").await > 0 },
    )
    .await;
    proxy.blackhole();
    let port = d.port;
    wait_until(
        "/readyz 503 naming the silent postgres",
        Duration::from_secs(10),
        || async {
            http_get(port, "/readyz")
                .await
                .is_ok_and(|(s, body)| s == 503 && body.contains("postgres: timeout"))
        },
    )
    .await;
    // The proxy switches to a live server (here the same one: the promoted replica); the
    // connections it froze stay frozen.
    proxy.heal();
    wait_until(
        "/readyz 200 once the proxy reaches a live server",
        Duration::from_secs(30),
        || async { status_of(port, "/readyz").await == 200 },
    )
    .await;
    let total = producer.stop().await;
    // Rows the frozen transactions had locked come back when the server ends those
    // transactions (idle_in_transaction_session_timeout, push timeout + 15 s).
    wait_until(
        "every row is relayed by the recovered workers",
        Duration::from_secs(60),
        || async { ns.llen("queue:steady").await == total },
    )
    .await;
    wait_until(
        "the listener listens again",
        Duration::from_secs(30),
        || async {
            !d.events_with("notification listener listening again")
                .is_empty()
        },
    )
    .await;
    // Idle (the wake-up lock released), with a 30 s poll interval: only a notification relays
    // a row this fast.
    released(&pool).await;
    insert_rows(&pool, 1, "after").await;
    wait_until(
        "a row committed after the recovery is relayed on its notification",
        Duration::from_secs(5),
        || async { ns.llen("queue:after").await == 1 },
    )
    .await;
    let started = Instant::now();
    assert_eq!(d.terminate(Duration::from_secs(15)).await, Some(0));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let outages: Vec<_> = d
        .events()
        .into_iter()
        .filter(|e| e["dependency"] == "postgres" && e["reason"].is_string())
        .collect();
    assert!(
        outages.iter().any(|e| e["reason"] == "timeout"),
        "the outage is logged as a timeout: {outages:#?}"
    );
    assert!(d
        .events_with("shutdown timed out: batches in hand roll back (nothing is lost)")
        .is_empty());
}
