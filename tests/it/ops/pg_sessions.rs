//! The relay's own Postgres sessions (issue 34): the wake-up lock survives a drain that keeps
//! every worker busy longer than its idle-in-transaction timeout, and when it is lost anyway it
//! says so once and takes it again; the horizon probe judges sessions by their snapshot, not
//! by how long their transaction has been open, and never names the relay's own; a server
//! that refuses connections is asked once per backoff step; the wordings of a refusal, a
//! timeout and a connection closed before the server answered.

use std::sync::Arc;

use sqlx::Connection as _;

use super::*;
use crate::common::proxy::Proxy;
use jobrelay::relay::wakeup::lock::{keep_awake, Activity, IDLE_TIMEOUT};

/// The pid of the session holding the wake-up lock of `pending_jobs`, if one does.
async fn lock_holder(pool: &PgPool) -> Option<i32> {
    sqlx::query_scalar(
        "SELECT pid FROM pg_locks
         WHERE locktype = 'advisory' AND granted AND mode = 'ExclusiveLock'
           AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND classid = 27250 AND objsubid = 2
           AND objid = (hashtext('pending_jobs')::int8 & 4294967295)::text::oid",
    )
    .fetch_optional(pool)
    .await
    .unwrap()
}

/// A pool on `pool`'s database with the relay's session settings (`application_name`
/// jobrelay), as the daemon's.
async fn relay_pool(pool: &PgPool) -> PgPool {
    let url = database_url_of(pool).await;
    let opts: sqlx::postgres::PgConnectOptions = url.parse().unwrap();
    jobrelay::db::lazy_pool(jobrelay::config::session_settings(opts), 4)
}

/// Keeps `activity` awake (a claim every 100 ms, as a draining worker's) until `stop`.
fn claiming(activity: Arc<Activity>, stop: tokio_util::sync::CancellationToken) {
    tokio::spawn(async move {
        while !stop.is_cancelled() {
            activity.mark();
            hold_for(Duration::from_millis(100), "a draining worker's claims").await;
        }
    });
}

/// Runs the wake-up lock's task for `relay` (the default table, `activity`, `wake`) until
/// `stop`, and waits until it holds the lock: the task, and the pid of the lock's session.
async fn take_the_lock(
    pool: &PgPool,
    relay: PgPool,
    activity: Arc<Activity>,
    wake: tokio::sync::watch::Sender<u64>,
    stop: &tokio_util::sync::CancellationToken,
) -> (tokio::task::JoinHandle<()>, i32) {
    let task = tokio::spawn(keep_awake(
        relay,
        Default::default(),
        activity,
        wake,
        Arc::new(Default::default()),
        false,
        stop.clone(),
    ));
    wait_until("the lock is taken", Duration::from_secs(5), || async {
        lock_holder(pool).await.is_some()
    })
    .await;
    (task, lock_holder(pool).await.unwrap())
}

/// Every worker busy (claiming, none waiting for a wake-up) for longer than the lock's
/// idle-in-transaction timeout, as in a drain of a large backlog: the lock is held throughout,
/// by the same session (the server never ended it), and that session holds no snapshot
/// between its statements (`backend_xmin` NULL: it does not hold back vacuum).
#[sqlx::test]
async fn a_busy_relay_keeps_its_wakeup_lock_past_the_idle_transaction_timeout(pool: PgPool) {
    let relay = relay_pool(&pool).await;
    let activity = Arc::new(Activity::default());
    let (wake, _woken) = tokio::sync::watch::channel(0u64);
    let stop = tokio_util::sync::CancellationToken::new();
    claiming(activity.clone(), stop.clone());
    let (task, pid) = take_the_lock(&pool, relay, activity, wake, &stop).await;
    let (mut samples, mut with_xmin) = (0, 0);
    let started = Instant::now();
    while started.elapsed() < IDLE_TIMEOUT + Duration::from_secs(3) {
        let holder = lock_holder(&pool).await;
        assert_eq!(
            holder,
            Some(pid),
            "the lock held by the same session after {:?} of busy workers",
            started.elapsed()
        );
        let xmin: bool = sqlx::query_scalar(
            "SELECT backend_xmin IS NOT NULL FROM pg_stat_activity WHERE pid = $1",
        )
        .bind(pid)
        .fetch_one(&pool)
        .await
        .unwrap();
        samples += 1;
        with_xmin += i32::from(xmin);
        hold_for(Duration::from_millis(100), "between samples").await;
    }
    // A keep-alive's snapshot lasts microseconds: a sample may catch one, not many.
    assert!(
        with_xmin <= 2,
        "{with_xmin} of {samples} samples saw the lock's session hold a snapshot"
    );
    stop.cancel();
    task.await.unwrap();
}

/// A lock whose session the server ends (here `pg_terminate_backend`, as the idle-in-transaction
/// timeout did) while the relay is busy: WARN `wake-up lock lost` once, and the lock taken
/// again by a new session, with INFO `wake-up lock taken again`.
#[sqlx::test]
async fn a_lost_wakeup_lock_is_logged_once_and_taken_again(pool: PgPool) {
    let db = database_url_of(&pool).await;
    let ns = Namespace::new();
    let mut d = Daemon::start(
        &["--poll-interval", "30s"],
        &[
            ("DATABASE_URL", &db),
            ("REDIS_URL", &ns.url),
            ("JOBRELAY_NAMESPACE", &ns.prefix),
            ("RUST_LOG", "info"),
        ],
    );
    d.wait_ready(Duration::from_secs(15)).await;
    // A steady stream keeps the relay awake.
    let stop = tokio_util::sync::CancellationToken::new();
    let producer = {
        let (pool, stop) = (pool.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                insert_rows(&pool, 5, "stream").await;
                hold_for(Duration::from_millis(50), "the stream's pace").await;
            }
        })
    };
    wait_until("the lock is taken", Duration::from_secs(10), || async {
        lock_holder(&pool).await.is_some()
    })
    .await;
    for round in 0..2 {
        let first = lock_holder(&pool).await.unwrap();
        sqlx::query("SELECT pg_terminate_backend($1)")
            .bind(first)
            .execute(&pool)
            .await
            .unwrap();
        wait_until(
            &format!("the lock is taken again ({round})"),
            Duration::from_secs(10),
            || async { lock_holder(&pool).await.is_some_and(|p| p != first) },
        )
        .await;
        wait_until("the relay says so", Duration::from_secs(5), || async {
            d.events_with("wake-up lock taken again: producers skip NOTIFY")
                .len()
                == round + 1
        })
        .await;
    }
    stop.cancel();
    producer.await.unwrap();
    let lost: Vec<_> = d
        .events()
        .into_iter()
        .filter(|e| {
            e["message"]
                .as_str()
                .unwrap()
                .starts_with("wake-up lock lost")
        })
        .collect();
    assert_eq!(lost.len(), 2, "once per episode: {lost:#?}");
    assert_eq!(lost[0]["level"], "WARN", "{}", lost[0]);
    assert_eq!(d.terminate(Duration::from_secs(30)).await, Some(0));
}

/// The horizon probe judges a session by what it holds: the relay's wake-up lock, polling
/// every millisecond in a transaction open for seconds, is never named; a `READ COMMITTED`
/// transaction open for seconds whose statement began just now is timed by that statement;
/// a `REPEATABLE READ` snapshot by its transaction; a writer idle in its transaction (a
/// transaction id, no snapshot) is named too.
#[sqlx::test]
async fn the_horizon_probe_judges_snapshots_and_never_names_the_relays_sessions(pool: PgPool) {
    use jobrelay::broker::redis_probe::RedisProbe;
    use jobrelay::relay::probe::Probe;
    let relay = relay_pool(&pool).await;
    let redis = RedisProbe::new(
        redis::Client::open(redis_url()).unwrap(),
        "jr:test:",
        Duration::from_secs(5),
    );
    let probe = Probe::new(
        relay.clone(),
        &Default::default(),
        Duration::from_secs(5),
        redis,
    );
    // The relay awake, a worker waiting: the lock's session polls every millisecond.
    let activity = Arc::new(Activity::default());
    let (wake, _woken) = tokio::sync::watch::channel(0u64);
    let stop = tokio_util::sync::CancellationToken::new();
    claiming(activity.clone(), stop.clone());
    let waiting = {
        let activity = activity.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let _w = activity.waiting();
            stop.cancelled().await;
        })
    };
    let (task, lock_pid) = take_the_lock(&pool, relay.clone(), activity, wake, &stop).await;
    hold_for(Duration::from_secs(3), "the lock's transaction grows old").await;
    for _ in 0..100 {
        if let Some(h) = probe.horizon().await.unwrap() {
            assert_ne!(h.pid, Some(lock_pid), "the relay's lock named: {h:?}");
            assert!(h.seconds.unwrap_or(0.0) < 1.0, "{h:?}");
        }
        hold_for(Duration::from_millis(10), "between samples").await;
    }

    let report = |app: &'static str| {
        let pool = pool.clone();
        async move {
            let url = database_url_of(&pool).await;
            let opts: sqlx::postgres::PgConnectOptions = url.parse().unwrap();
            let mut c = sqlx::PgConnection::connect_with(&opts.application_name(app))
                .await
                .unwrap();
            let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
                .fetch_one(&mut c)
                .await
                .unwrap();
            (c, pid)
        }
    };
    // READ COMMITTED, open for 3 s, now running a statement of 1.5 s: timed by the statement.
    let (mut rc, rc_pid) = report("report_rc").await;
    sqlx::query("BEGIN").execute(&mut rc).await.unwrap();
    hold_for(Duration::from_secs(3), "the transaction grows old").await;
    let running = tokio::spawn(async move {
        sqlx::query("SELECT pg_sleep(1.5)")
            .execute(&mut rc)
            .await
            .unwrap();
        rc
    });
    hold_for(Duration::from_millis(500), "the statement runs 0.5 s").await;
    let h = probe
        .horizon()
        .await
        .unwrap()
        .expect("the statement's snapshot");
    assert_eq!(h.pid, Some(rc_pid), "{h:?}");
    let s = h.seconds.unwrap();
    assert!(
        (0.3..2.0).contains(&s),
        "timed by its statement, not its transaction: {h:?}"
    );
    let mut rc = running.await.unwrap();
    // Idle in its transaction without a transaction id: no snapshot, nothing held.
    let h = probe.horizon().await.unwrap();
    assert!(h.as_ref().is_none_or(|h| h.pid != Some(rc_pid)), "{h:?}");
    // A write takes a transaction id: that holds the horizon, since its transaction began.
    sqlx::query("INSERT INTO pending_jobs (queue, job_type) VALUES ('h', 'H')")
        .execute(&mut rc)
        .await
        .unwrap();
    let h = probe
        .horizon()
        .await
        .unwrap()
        .expect("the writer's transaction id");
    assert_eq!(h.pid, Some(rc_pid), "{h:?}");
    assert!(h.seconds.unwrap() >= 4.0, "{h:?}");
    sqlx::query("ROLLBACK").execute(&mut rc).await.unwrap();

    // REPEATABLE READ: its snapshot is held from its first statement on.
    let (mut rr, rr_pid) = report("report_rr").await;
    sqlx::query("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut rr)
        .await
        .unwrap();
    sqlx::query("SELECT 1").execute(&mut rr).await.unwrap();
    hold_for(Duration::from_secs(2), "the snapshot grows old").await;
    let h = probe.horizon().await.unwrap().expect("the snapshot");
    assert_eq!(h.pid, Some(rr_pid), "{h:?}");
    assert!(h.seconds.unwrap() >= 2.0, "{h:?}");
    sqlx::query("ROLLBACK").execute(&mut rr).await.unwrap();

    stop.cancel();
    task.await.unwrap();
    waiting.await.unwrap();
}

/// A role that may not connect at all (`CONNECTION LIMIT 0`: SQLSTATE 53300, as every
/// connection past `max_connections`), reached through a counting proxy: the relay's sessions
/// (workers, probe, listener) make one attempt per step of its backoff, not a dozen a second.
#[sqlx::test]
async fn refused_connections_are_tried_once_per_backoff_step(pool: PgPool) {
    with_a_refused_role(&pool, "jr_refused", |pool, role| async move {
        let pg: std::net::SocketAddr = "127.0.0.1:5432".parse().unwrap();
        let proxy = Proxy::start(pg);
        let mut url = url::Url::parse(&database_url_of(&pool).await).unwrap();
        url.set_username(&role).unwrap();
        url.set_port(Some(proxy.port)).unwrap();
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
        let window = Duration::from_secs(12);
        hold_for(window, "the attempts are counted over a window").await;
        let attempts = proxy.accepted();
        let (_, body) = d.get("/readyz").await;
        assert_eq!(d.terminate(Duration::from_secs(30)).await, Some(0));
        eprintln!("refused attempts in {window:?}: {attempts}");
        // 250 ms doubling to 4 s, each step at least half its nominal value: at most 10
        // attempts in 12 s (the first at once); sqlx's pool alone made about 11 a second.
        assert!(attempts <= 11, "{attempts} attempts in {window:?}");
        assert!(attempts >= 3, "{attempts} attempts in {window:?}");
        assert!(
            body.contains("postgres: too many connections (too many connections for role"),
            "{body}"
        );
    })
    .await;
}

/// The wordings: `check` names a refusal's reason and the server's message once (no repeated
/// `postgres:`, no `error returned from database`); a server that does not answer is reported
/// after the bound the line states; a connection closed before the server answered says so in
/// words, not `unexpected response from SSLRequest: 0x00`.
#[sqlx::test]
async fn refusals_timeouts_and_closed_connections_are_worded_once(pool: PgPool) {
    with_a_refused_role(&pool, "jr_words", |pool, role| async move {
        let db = database_url_of(&pool).await;
        let redis = redis_url();
        let mut refused = url::Url::parse(&db).unwrap();
        refused.set_username(&role).unwrap();
        let (code, out, _) = run_relay(
            &["check"],
            &[("DATABASE_URL", refused.as_str()), ("REDIS_URL", &redis)],
        )
        .await;
        assert_eq!(code, 1, "{out}");
        let line = out.lines().find(|l| l.starts_with("postgres:")).unwrap();
        assert!(
            line.starts_with("postgres: too many connections: too many connections for role"),
            "{line}"
        );
        assert_eq!(line.matches("postgres").count(), 1, "{line}");
        assert!(!line.contains("error returned from database"), "{line}");

        // A server that accepts and never answers: --push-timeout 2s, said and kept.
        let pg: std::net::SocketAddr = "127.0.0.1:5432".parse().unwrap();
        let proxy = Proxy::start(pg);
        proxy.stall();
        let mut silent = url::Url::parse(&db).unwrap();
        silent.set_port(Some(proxy.port)).unwrap();
        let started = Instant::now();
        let (code, out, _) = run_relay(
            &["check", "--push-timeout", "2s"],
            &[("DATABASE_URL", silent.as_str()), ("REDIS_URL", &redis)],
        )
        .await;
        let took = started.elapsed();
        assert_eq!(code, 1, "{out}");
        let line = out.lines().find(|l| l.starts_with("postgres:")).unwrap();
        assert!(line.starts_with("postgres: timeout: "), "{line}");
        assert!(line.ends_with("timed out after 2s"), "{line}");
        assert!(
            took < Duration::from_secs(4),
            "{line}, returned after {took:?}"
        );

        // A proxy with no server behind it: accepts, reads the TLS request, closes.
        let closing = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut closed = url::Url::parse(&db).unwrap();
        closed
            .set_port(Some(closing.local_addr().unwrap().port()))
            .unwrap();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = closing.accept().await.unwrap();
                let mut request = [0u8; 8];
                let _ = s.read_exact(&mut request).await;
                let _ = s.shutdown().await;
            }
        });
        let ns = Namespace::new();
        let d = Daemon::start(
            &[],
            &[
                ("DATABASE_URL", closed.as_str()),
                ("REDIS_URL", &ns.url),
                ("JOBRELAY_NAMESPACE", &ns.prefix),
            ],
        );
        wait_until("/readyz names it", Duration::from_secs(15), || async {
            http_get(d.port, "/readyz")
                .await
                .is_ok_and(|(s, body)| s == 503 && body.contains("postgres: unreachable"))
        })
        .await;
        let (_, body) = d.get("/readyz").await;
        assert!(
            body.contains(
                "postgres: unreachable (the connection was closed before the server answered"
            ),
            "{body}"
        );
        assert!(!body.contains("SSLRequest"), "{body}");
    })
    .await;
}
