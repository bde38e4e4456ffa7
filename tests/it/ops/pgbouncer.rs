//! The daemon through PgBouncer 1.18 (a private `pgbouncer`, tests/it/common/pgbouncer.rs) with
//! its defaults (no `ignore_startup_parameters`), in session and in transaction mode: it
//! connects, relays bursts and single rows with `/readyz` at 200 all along and nothing logged
//! at WARN or above but what the mode explains; in transaction mode it leaves no named
//! statement and no setting behind on the server connections that applications share, its
//! wake-up lock dies with it, and `--listen-url` gives it notifications; `--prepared-statements`
//! given there falls back to unnamed claims before a job goes astray.

use std::collections::BTreeSet;

use super::*;
use crate::common::batch::{assert_exactly_once, queue_uuids};
use crate::common::pgbouncer::{PgBouncer, PoolMode};
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions as _, Connection as _, Executor as _, Row as _};

/// The test database's name.
async fn db_name(pool: &PgPool) -> String {
    sqlx::query_scalar("SELECT current_database()")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Log events at WARN or above whose message does not start with one of `allowed`.
fn unexpected_warnings(d: &Daemon, allowed: &[&str]) -> Vec<String> {
    d.events()
        .into_iter()
        .filter(|e| e["level"] == "WARN" || e["level"] == "ERROR")
        .filter(|e| {
            let m = e["message"].as_str().unwrap_or_default();
            !allowed.iter().any(|a| m.starts_with(a))
        })
        .map(|e| e.to_string())
        .collect()
}

/// How many log events' messages start with `prefix`.
fn said(d: &Daemon, prefix: &str) -> usize {
    d.events()
        .into_iter()
        .filter(|e| e["message"].as_str().is_some_and(|m| m.starts_with(prefix)))
        .count()
}

/// Waits until `n` more jobs of `queue` are in Redis, asserting `/readyz` 200 all along.
async fn relayed_while_ready(d: &Daemon, ns: &Namespace, queue: &str, n: usize, within: Duration) {
    let key = &format!("queue:{queue}");
    let relayed = eventually_every(within, Duration::from_millis(50), || async move {
        let (status, body) = d.get("/readyz").await;
        assert_eq!(status, 200, "/readyz while relaying {queue}: {body}");
        ns.llen(key).await == n
    })
    .await;
    assert!(
        relayed,
        "{n} jobs of {queue} not relayed within {within:?} ({} are); logs:\n{}",
        ns.llen(key).await,
        d.logs()
    );
}

/// An application's connection through `bouncer`: no startup parameter PgBouncer refuses,
/// simple queries only (it must not trip over what it checks for).
async fn app_connection(bouncer: &PgBouncer, db: &str) -> sqlx::PgConnection {
    bouncer
        .url(db)
        .parse::<PgConnectOptions>()
        .unwrap()
        .extra_float_digits(None)
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect through PgBouncer: {e}\n{}", bouncer.log()))
}

/// What an application's transaction through PgBouncer finds on its server connection: the
/// settings the relay sets for its own transactions, and the named prepared statements.
async fn server_connection_state(con: &mut sqlx::PgConnection) -> (String, i64) {
    let row = con
        .fetch_one(
            "SELECT concat_ws(' ', current_setting('statement_timeout'),
                        current_setting('idle_in_transaction_session_timeout'),
                        current_setting('lock_timeout'), current_setting('synchronous_commit')),
                    (SELECT count(*) FROM pg_prepared_statements)",
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

#[sqlx::test]
async fn the_test_pgbouncer_refuses_startup_options(pool: PgPool) {
    // The scenario's premise: with PgBouncer's defaults, a client that sends what sqlx sends
    // by default (extra_float_digits) or startup options is refused. The relay is not.
    let bouncer = PgBouncer::start(PoolMode::Transaction, 2);
    let db = db_name(&pool).await;
    let e = sqlx::PgConnection::connect(&bouncer.url(&db))
        .await
        .expect_err("PgBouncer refuses extra_float_digits");
    assert!(
        e.to_string().contains("unsupported startup parameter"),
        "{e}"
    );
    let mut con = app_connection(&bouncer, &db).await;
    let one: i32 = con.fetch_one("SELECT 1").await.unwrap().get(0);
    assert_eq!(one, 1);
}

#[sqlx::test]
async fn relays_through_pgbouncer_in_session_mode_with_notifications(pool: PgPool) {
    let bouncer = PgBouncer::start(PoolMode::Session, 10);
    let db = db_name(&pool).await;
    let ns = Namespace::new();
    let mut d = Daemon::start(
        &["--poll-interval", "30s"],
        &[
            ("DATABASE_URL", &bouncer.url(&db)),
            ("REDIS_URL", &ns.url),
            ("JOBRELAY_NAMESPACE", &ns.prefix),
        ],
    );
    d.wait_ready(Duration::from_secs(15)).await;
    for burst in 1..=3 {
        insert_rows(&pool, 2000, "burst").await;
        relayed_while_ready(&d, &ns, "burst", burst * 2000, Duration::from_secs(60)).await;
    }
    for i in 1..=3 {
        // Idle again (the wake-up lock released): only a notification wakes it before its
        // 30 s poll.
        released(&pool).await;
        insert_rows(&pool, 1, "single").await;
        relayed_while_ready(&d, &ns, "single", i, Duration::from_secs(5)).await;
    }
    // A session pooler keeps a client's named statements: claims are named.
    assert_claims_named(&d, true).await;
    assert_eq!(d.terminate(Duration::from_secs(30)).await, Some(0));
    let unexpected = unexpected_warnings(&d, &[]);
    assert!(unexpected.is_empty(), "{unexpected:#?}");
}

/// Whether the relay's claims are named (`jobrelay_named_claims`), and it said so once if they
/// are, never if not.
async fn assert_claims_named(d: &Daemon, named: bool) {
    let gauge = d.metrics().await.try_get("jobrelay_named_claims");
    assert_eq!(gauge, Some(f64::from(u8::from(named))), "{}", d.logs());
    assert_eq!(said(d, "claims named:"), usize::from(named), "{}", d.logs());
}

/// What an application found on the server connections it was given (the distinct
/// [`server_connection_state`]s), and how often it looked.
type Found = (BTreeSet<(String, i64)>, usize);

/// Applications sharing the pooler, each watching the server connections it is given (the
/// settings and prepared statements it finds on them) until stopped.
struct Applications {
    stop: tokio_util::sync::CancellationToken,
    apps: Vec<tokio::task::JoinHandle<Found>>,
}

impl Applications {
    async fn start(n: usize, bouncer: &PgBouncer, db: &str) -> Applications {
        let stop = tokio_util::sync::CancellationToken::new();
        let mut apps = Vec::new();
        for _ in 0..n {
            let mut con = app_connection(bouncer, db).await;
            let stop = stop.clone();
            apps.push(tokio::spawn(async move {
                let mut seen = BTreeSet::new();
                let mut samples = 0;
                while !stop.is_cancelled() {
                    seen.insert(server_connection_state(&mut con).await);
                    samples += 1;
                    hold_for(Duration::from_millis(5), "an application's pace").await;
                }
                (seen, samples)
            }));
        }
        Applications { stop, apps }
    }

    /// Stops them: each ran, and found only the server's defaults.
    async fn assert_found_only_defaults(self) {
        self.stop.cancel();
        for app in self.apps {
            let (seen, samples) = app.await.unwrap();
            assert!(samples > 10, "the application ran ({samples} samples)");
            assert_eq!(
                seen.into_iter().collect::<Vec<_>>(),
                vec![("0 0 0 on".to_owned(), 0)],
                "the application's transactions found only the server's defaults and no \
                 prepared statement (statement_timeout, idle_in_transaction_session_timeout, \
                 lock_timeout, synchronous_commit; pg_prepared_statements)"
            );
        }
    }
}

/// Three bursts of 2,000 rows, each relayed with `/readyz` at 200; whether the relay was seen
/// holding its wake-up lock meanwhile.
async fn bursts_seeing_the_lock(pool: &PgPool, d: &Daemon, ns: &Namespace) -> bool {
    let lock_seen = std::cell::Cell::new(false);
    for burst in 1..=3 {
        insert_rows(pool, 2000, "burst").await;
        let relayed = eventually(Duration::from_secs(60), || async {
            if ns.llen("queue:burst").await >= burst * 2000 {
                return true;
            }
            lock_seen.set(lock_seen.get() | wakeup_lock_held(pool).await);
            let (status, body) = d.get("/readyz").await;
            assert_eq!(status, 200, "/readyz while relaying: {body}");
            false
        })
        .await;
        assert!(relayed, "burst {burst} not relayed; logs:\n{}", d.logs());
    }
    lock_seen.get()
}

/// Waits until the wake-up lock is released (committed) once the relay is idle: its server
/// connection goes back to PgBouncer, and to the application's next transaction.
async fn idle(pool: &PgPool) {
    released(pool).await;
    let why = "the applications take turns on the server connection the relay gave back";
    hold_for(Duration::from_millis(500), why).await;
}

/// Kills the relay while it holds the wake-up lock: the lock goes with it. Rows keep landing
/// until the relay is seen holding the lock: a drain can end before the lock is taken again,
/// while its last release still waits (up to 10 s) for older transactions of the shared server
/// to end.
async fn killed_holding_the_lock(pool: &PgPool, d: &mut Daemon) {
    let started = std::time::Instant::now();
    loop {
        insert_rows(pool, 20_000, "last").await;
        let held = eventually(Duration::from_secs(5), || wakeup_lock_held(pool)).await;
        if held {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the relay never held its wake-up lock while rows kept landing"
        );
    }
    d.child.start_kill().unwrap();
    let _ = d.child.wait().await;
    wait_until(
        "the wake-up lock is released with the killed relay",
        Duration::from_secs(5),
        || async { !wakeup_lock_held(pool).await },
    )
    .await;
}

#[sqlx::test]
async fn relays_through_pgbouncer_in_transaction_mode_and_leaves_nothing_behind(pool: PgPool) {
    // Few server connections for many clients: the relay's and the application's transactions
    // take turns on the same ones.
    let bouncer = PgBouncer::start(PoolMode::Transaction, 3);
    let db = db_name(&pool).await;
    let ns = Namespace::new();
    let mut d = Daemon::start(
        &["--poll-interval", "200ms"],
        &[
            ("DATABASE_URL", &bouncer.url(&db)),
            ("REDIS_URL", &ns.url),
            ("JOBRELAY_NAMESPACE", &ns.prefix),
        ],
    );
    d.wait_ready(Duration::from_secs(15)).await;

    // An application sharing the pooler, watching the server connections it is given.
    let apps = Applications::start(3, &bouncer, &db).await;
    let lock_seen = bursts_seeing_the_lock(&pool, &d, &ns).await;
    idle(&pool).await;
    for i in 1..=3 {
        insert_rows(&pool, 1, "single").await;
        relayed_while_ready(&d, &ns, "single", i, Duration::from_secs(5)).await;
        let why = "the applications take turns on the server connections between single rows";
        hold_for(Duration::from_millis(300), why).await;
    }
    idle(&pool).await;
    apps.assert_found_only_defaults().await;
    assert!(
        lock_seen,
        "the relay took its wake-up lock during the bursts"
    );
    // Nothing proved a session (the listener found none): claims stay unnamed.
    assert_claims_named(&d, false).await;

    killed_holding_the_lock(&pool, &mut d).await;
    let no_listener = "no notification listener: its connection is not a session of its own";
    let unexpected = unexpected_warnings(&d, &[no_listener]);
    assert!(unexpected.is_empty(), "{unexpected:#?}");
    let said = said(&d, no_listener);
    assert_eq!(
        said, 1,
        "the listener says once that it cannot work through transaction pooling"
    );
}

#[sqlx::test]
async fn in_transaction_mode_a_direct_listen_url_gives_notifications(pool: PgPool) {
    let bouncer = PgBouncer::start(PoolMode::Transaction, 3);
    let db = db_name(&pool).await;
    let direct = database_url_of(&pool).await;
    let ns = Namespace::new();
    let mut d = Daemon::start(
        &["--poll-interval", "30s"],
        &[
            ("DATABASE_URL", &bouncer.url(&db)),
            ("JOBRELAY_LISTEN_URL", &direct),
            ("REDIS_URL", &ns.url),
            ("JOBRELAY_NAMESPACE", &ns.prefix),
        ],
    );
    d.wait_ready(Duration::from_secs(15)).await;
    for i in 1..=3 {
        // Idle (the wake-up lock released): only a notification wakes it before its 30 s poll.
        released(&pool).await;
        insert_rows(&pool, 1, "single").await;
        relayed_while_ready(&d, &ns, "single", i, Duration::from_secs(5)).await;
    }
    // The listener's session is on another server than the pool's: it proves nothing of
    // the pool's connections, and claims stay unnamed.
    assert_claims_named(&d, false).await;
    assert_eq!(d.terminate(Duration::from_secs(30)).await, Some(0));
    let unexpected = unexpected_warnings(&d, &[]);
    assert!(unexpected.is_empty(), "{unexpected:#?}");
}

/// Rows that no transaction holds (what another relay could claim now).
async fn unlocked_rows(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM (SELECT 1 FROM pending_jobs FOR UPDATE SKIP LOCKED) t")
        .fetch_one(pool)
        .await
        .unwrap()
}

fn signal(d: &Daemon, sig: &str) {
    let pid = d.child.id().expect("running").to_string();
    let ok = std::process::Command::new("kill")
        .args([&format!("-{sig}"), &pid])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{sig} {pid}");
}

/// A relay stopped (SIGSTOP) with rows claimed, through PgBouncer in transaction mode, holds
/// them only until its transaction's own `idle_in_transaction_session_timeout` (`SET LOCAL`:
/// `--push-timeout` + 15 s, here 16 s) ends it, although PgBouncer took no startup option.
#[sqlx::test]
async fn through_transaction_pooling_a_stopped_relay_gives_its_rows_up(pool: PgPool) {
    let bouncer = PgBouncer::start(PoolMode::Transaction, 4);
    let db = db_name(&pool).await;
    let ns = Namespace::new();
    insert_rows(&pool, 50_000, "bulk").await;
    let mut d = Daemon::start(
        &["--push-timeout", "1s"],
        &[
            ("DATABASE_URL", &bouncer.url(&db)),
            ("REDIS_URL", &ns.url),
            ("JOBRELAY_NAMESPACE", &ns.prefix),
        ],
    );
    // Stop it while one of its batches holds rows.
    let every = Duration::from_millis(2);
    let caught = eventually_every(Duration::from_secs(60), every, || async {
        let pending = pending_count(&pool).await;
        assert!(pending > 0, "drained before the stop");
        if unlocked_rows(&pool).await >= pending {
            return false;
        }
        signal(&d, "STOP");
        let why = "the stopped relay's statements in flight end on the server before the look";
        hold_for(Duration::from_millis(100), why).await;
        if unlocked_rows(&pool).await < pending_count(&pool).await {
            return true;
        }
        signal(&d, "CONT");
        false
    })
    .await;
    assert!(caught, "never caught a batch in hand");
    let stopped = Instant::now();
    wait_until(
        "the stopped relay's rows come free",
        Duration::from_secs(40),
        || async { unlocked_rows(&pool).await == pending_count(&pool).await },
    )
    .await;
    let held = stopped.elapsed();
    assert!(
        held >= Duration::from_secs(10) && held <= Duration::from_secs(25),
        "rows held {held:?}: the server ends the transaction after 16 s idle"
    );
    d.child.start_kill().unwrap();
    let _ = d.child.wait().await;
}

/// The uuids of `rows` rows inserted into `table` in one transaction.
async fn insert_uuids(pool: &PgPool, table: &str, rows: i64) -> BTreeSet<String> {
    let uuids: Vec<uuid::Uuid> = sqlx::query_scalar(&format!(
        "INSERT INTO {table} (queue, job_type, payload)
         SELECT 'mixed', 'Bulk', convert_to(i::text, 'UTF8') FROM generate_series(1, $1) AS i
         RETURNING uuid"
    ))
    .bind(rows)
    .fetch_all(pool)
    .await
    .unwrap();
    uuids.iter().map(|u| u.to_string()).collect()
}

/// `--prepared-statements` given where it must not be: two relays of two tables through one
/// server connection of PgBouncer 1.18 in transaction mode, where a named statement stays on
/// the server connection and the next client of the same name runs it. Each relay finds out
/// by its first claim (a statement of another client, or one missing), says so once and claims
/// unnamed from then on: each table's jobs reach its own namespace, each once.
#[sqlx::test]
async fn prepared_claims_through_transaction_pooling_fall_back_to_unnamed(pool: PgPool) {
    // Fewer server connections than the two relays' clients: their transactions take turns
    // on them.
    let bouncer = PgBouncer::start(PoolMode::Transaction, 4);
    let db = db_name(&pool).await;
    sqlx::query("SELECT jobrelay_create_outbox('billing_jobs')")
        .execute(&pool)
        .await
        .unwrap();
    let (ns_a, ns_b) = (Namespace::new(), Namespace::new());
    let start = |table: &'static str, ns: &Namespace| {
        Daemon::start(
            &[
                "--poll-interval",
                "100ms",
                "--workers",
                "1",
                "--prepared-statements",
            ],
            &[
                ("DATABASE_URL", &bouncer.url(&db)),
                ("REDIS_URL", &ns.url),
                ("JOBRELAY_NAMESPACE", &ns.prefix),
                ("JOBRELAY_TABLE", table),
            ],
        )
    };
    let mut a = start("pending_jobs", &ns_a);
    let mut b = start("billing_jobs", &ns_b);
    a.wait_ready(Duration::from_secs(15)).await;
    b.wait_ready(Duration::from_secs(15)).await;
    let left = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT (SELECT count(*) FROM pending_jobs) + (SELECT count(*) FROM billing_jobs)",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    // Twenty rounds, each drained before the next: claim after claim on whichever server
    // connection each transaction is given.
    let (mut want_a, mut want_b) = (BTreeSet::new(), BTreeSet::new());
    for _ in 0..20 {
        want_a.extend(insert_uuids(&pool, "pending_jobs", 5).await);
        want_b.extend(insert_uuids(&pool, "billing_jobs", 5).await);
        wait_until("both tables drained", Duration::from_secs(30), || async {
            left().await == 0
        })
        .await;
    }
    assert_eq!(a.terminate(Duration::from_secs(30)).await, Some(0));
    assert_eq!(b.terminate(Duration::from_secs(30)).await, Some(0));
    let got_a: Vec<String> = queue_uuids(&ns_a, "queue:mixed").await;
    let got_b: Vec<String> = queue_uuids(&ns_b, "queue:mixed").await;
    assert_exactly_once(&got_a, &want_a);
    assert_exactly_once(&got_b, &want_b);
    let fallback = "claims unnamed: --prepared-statements";
    for (name, d) in [("pending_jobs", &a), ("billing_jobs", &b)] {
        let said = said(d, fallback);
        println!("{name}'s relay fell back to unnamed claims: {}", said == 1);
        assert!(
            said <= 1,
            "{name}'s relay said it {said} times:\n{}",
            d.logs()
        );
        let unexpected = unexpected_warnings(
            d,
            &[
                fallback,
                "no notification listener: its connection is not a session of its own",
            ],
        );
        assert!(unexpected.is_empty(), "{name}: {unexpected:#?}");
    }
}
