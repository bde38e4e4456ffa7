//! Waking the relay: NOTIFY wakes an idle relay at once; the wake-up lock (migration 5,
//! src/relay/wakeup/): a busy relay holds an advisory lock and producers skip NOTIFY; when it unlocks,
//! a producer that skipped is not stranded; a relay that dies releases it at once; the lock's
//! state machine steps through take, poll and release.

use std::time::Duration;

use crate::common::batch::*;
use crate::common::child::RelayChild;
use crate::common::*;
use sqlx::postgres::PgListener;
use sqlx::PgPool;

/// Whether a relay holds the wake-up lock of `pending_jobs` in this test's database.
async fn lock_held(pool: &PgPool) -> bool {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_locks
                        WHERE locktype = 'advisory' AND granted AND mode = 'ExclusiveLock'
                          AND database = (SELECT oid FROM pg_database
                                          WHERE datname = current_database())
                          AND classid = 27250 AND objsubid = 2
                          AND objid = (hashtext('pending_jobs')::int8 & 4294967295)::text::oid)",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Inserts one row into `queue`, expects its NOTIFY on `listener` (`why`), then the row in
/// Redis, well before any 30 s poll.
async fn insert_notified_and_relayed(
    pool: &PgPool,
    ns: &Namespace,
    listener: &mut PgListener,
    queue: &str,
    why: &str,
) {
    insert_rows(pool, 1, queue).await;
    tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .unwrap_or_else(|_| panic!("NOTIFY {why}"))
        .unwrap();
    let key = format!("queue:{queue}");
    wait_until(
        &format!("the row is relayed ({why})"),
        Duration::from_secs(5),
        || async { ns.llen(&key).await == 1 },
    )
    .await;
}

/// Starts a daemon that would only poll every 30 s, makes it busy (one row relayed), and waits
/// until it holds the wake-up lock.
async fn busy_relay(pool: &PgPool, ns: &Namespace) -> RelayChild {
    let db = database_url_of(pool).await;
    let relay = RelayChild::start(&db, &ns.url, &ns.prefix, &["--poll-interval", "30s"]);
    insert_rows(pool, 1, "warmup").await;
    wait_until(
        "the warm-up row is relayed",
        Duration::from_secs(10),
        || async { ns.llen("queue:warmup").await == 1 },
    )
    .await;
    wait_until("the lock is held", Duration::from_secs(5), || {
        lock_held(pool)
    })
    .await;
    relay
}

#[sqlx::test]
async fn a_busy_relay_holds_the_lock_and_inserts_skip_notify(pool: PgPool) {
    let ns = Namespace::new();
    let mut relay = busy_relay(&pool, &ns).await;

    let mut listener = PgListener::connect_with(&pool).await.unwrap();
    listener.listen("pending_jobs").await.unwrap();
    // Keep the relay busy so that the lock is renewed, and insert while it holds.
    insert_rows(&pool, 1, "q").await;
    assert!(lock_held(&pool).await);
    let n = tokio::time::timeout(Duration::from_millis(300), listener.recv()).await;
    assert!(n.is_err(), "no NOTIFY while the lock holds: {n:?}");
    wait_until(
        "the row is relayed by polling",
        Duration::from_secs(5),
        || async { ns.llen("queue:q").await == 1 },
    )
    .await;

    // Idle: the relay unlocks and inserts notify again.
    wait_until("the relay unlocks", Duration::from_secs(10), || async {
        !lock_held(&pool).await
    })
    .await;
    // Unlocking wakes the workers once more; let that pass, then insert.
    insert_notified_and_relayed(
        &pool,
        &ns,
        &mut listener,
        "after",
        "after the relay unlocked",
    )
    .await;
    relay.signal("TERM");
    assert_eq!(relay.wait(Duration::from_secs(30)).await, Some(0));
}

/// A producer whose insert ran while the lock was held (so it did not notify) but that commits
/// only after the relay unlocked: the relay waits for it before going to sleep, so its row does
/// not wait for the 30 s poll.
#[sqlx::test]
async fn a_producer_that_skipped_notify_is_not_stranded(pool: PgPool) {
    let ns = Namespace::new();
    let mut relay = busy_relay(&pool, &ns).await;

    let mut tx = pool.begin().await.unwrap();
    sqlx::query("INSERT INTO pending_jobs (queue, job_type) VALUES ('late', 'Late')")
        .execute(&mut *tx)
        .await
        .unwrap();
    // The trigger fires only when its transaction could take the lock shared.
    let skipped: bool = sqlx::query_scalar(
        "SELECT NOT EXISTS (SELECT 1 FROM pg_locks
                            WHERE pid = pg_backend_pid() AND locktype = 'advisory'
                              AND classid = 27250)",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert!(
        skipped,
        "the insert ran while the lock was held, so it did not notify"
    );
    // The relay goes idle and unlocks while this transaction is still open.
    wait_until("the relay unlocks", Duration::from_secs(10), || async {
        !lock_held(&pool).await
    })
    .await;
    tx.commit().await.unwrap();
    wait_until(
        "the late row is relayed well before the 30 s poll",
        Duration::from_secs(8),
        || async { ns.llen("queue:late").await == 1 },
    )
    .await;
    relay.signal("TERM");
    assert_eq!(relay.wait(Duration::from_secs(30)).await, Some(0));
}

/// A relay killed while it holds the lock releases it with its session: the next insert
/// notifies, and another relay picks the row up at once instead of at its 30 s poll.
#[sqlx::test]
async fn a_relay_killed_holding_the_lock_releases_it(pool: PgPool) {
    let ns = Namespace::new();
    let mut relay = busy_relay(&pool, &ns).await;
    relay.signal("KILL");
    relay.wait(Duration::from_secs(10)).await;
    wait_until(
        "the killed relay's session ends",
        Duration::from_secs(5),
        || async { !lock_held(&pool).await },
    )
    .await;

    let db = database_url_of(&pool).await;
    let mut other = RelayChild::start(&db, &ns.url, &ns.prefix, &["--poll-interval", "30s"]);
    let mut listener = PgListener::connect_with(&pool).await.unwrap();
    listener.listen("pending_jobs").await.unwrap();
    insert_notified_and_relayed(
        &pool,
        &ns,
        &mut listener,
        "after_kill",
        "once the killed relay's lock is gone",
    )
    .await;
    other.signal("TERM");
    assert_eq!(other.wait(Duration::from_secs(30)).await, Some(0));
}

/// The lock's state machine, one step at a time: taken while a worker is awake, a poll per
/// step that wakes the workers when a row is claimable (only while a worker waits for a
/// wake-up: busy workers need none), released (with one more wake-up) once nobody is awake,
/// then idle.
#[sqlx::test]
async fn the_wakeup_lock_steps_through_take_poll_release(pool: PgPool) {
    use jobrelay::relay::wakeup::lock::{Activity, Next, WakeupLock, AWAKE_POLL};
    use std::sync::Arc;
    let activity = Arc::new(Activity::default());
    let (wake, mut woken) = tokio::sync::watch::channel(0u64);
    let mut lock = WakeupLock::new(pool.clone(), &Default::default(), activity.clone(), wake);
    let stop = tokio_util::sync::CancellationToken::new();

    assert_eq!(
        lock.step(&stop).await,
        Next::Idle,
        "nobody awake, nothing to do"
    );
    activity.mark();
    let waiting = activity.waiting();
    assert_eq!(lock.step(&stop).await, Next::Pause(AWAKE_POLL));
    assert!(lock.held() && lock_held(&pool).await, "taken while awake");
    assert!(!woken.has_changed().unwrap(), "an empty table wakes nobody");

    insert_rows(&pool, 1, "q").await;
    assert_eq!(lock.step(&stop).await, Next::Pause(AWAKE_POLL));
    assert!(
        woken.has_changed().unwrap(),
        "a claimable row wakes the workers"
    );
    woken.borrow_and_update();

    // Every worker busy (in a batch, or waiting for a claim slot): no poll, nobody woken.
    drop(waiting);
    assert_eq!(lock.step(&stop).await, Next::Busy);
    assert!(
        !woken.has_changed().unwrap(),
        "busy workers are not woken, and the table not polled for them"
    );
    // A worker waits again: the poll finds the row.
    let _waiting = activity.waiting();
    assert_eq!(lock.step(&stop).await, Next::Pause(AWAKE_POLL));
    assert!(
        woken.has_changed().unwrap(),
        "a waiting worker is woken for the claimable row"
    );
    woken.borrow_and_update();

    wait_until(
        "the awake window to pass",
        Duration::from_secs(5),
        || async { !activity.is_awake() },
    )
    .await;
    assert_eq!(lock.step(&stop).await, Next::Pause(Duration::ZERO));
    assert!(
        !lock.held() && !lock_held(&pool).await,
        "released once nobody is awake"
    );
    assert!(
        woken.has_changed().unwrap(),
        "one more claim after the release"
    );
    assert_eq!(lock.step(&stop).await, Next::Idle);
}

/// A wake-up lock of `pending_jobs` over `cursor`, its relay awake (the test keeps a worker
/// waiting, [`Activity::waiting`]), and the receiving end of its wake-ups.
fn awake_lock(
    pool: &PgPool,
    cursor: std::sync::Arc<jobrelay::relay::cursor::ClaimCursor>,
) -> (
    jobrelay::relay::wakeup::lock::WakeupLock,
    std::sync::Arc<jobrelay::relay::wakeup::lock::Activity>,
    tokio::sync::watch::Receiver<u64>,
) {
    use jobrelay::relay::wakeup::lock::{Activity, WakeupLock};
    let activity = std::sync::Arc::new(Activity::default());
    let (wake, woken) = tokio::sync::watch::channel(0u64);
    let lock = WakeupLock::new(pool.clone(), &Default::default(), activity.clone(), wake)
        .with_cursor(cursor);
    activity.mark();
    (lock, activity, woken)
}

/// One step of an awake lock with a worker waiting: it polls; whether that woke a worker.
async fn poll_woke(
    lock: &mut jobrelay::relay::wakeup::lock::WakeupLock,
    woken: &mut tokio::sync::watch::Receiver<u64>,
) -> bool {
    use jobrelay::relay::wakeup::lock::{Next, AWAKE_POLL};
    let stop = tokio_util::sync::CancellationToken::new();
    assert_eq!(lock.step(&stop).await, Next::Pause(AWAKE_POLL));
    assert!(lock.held(), "taken while awake");
    let woke = woken.has_changed().unwrap();
    woken.borrow_and_update();
    woke
}

/// The awake poll looks where the relay's claims look: above their mark. Rows below it are the
/// catch-up claims' (docs/guarantees.md#where-a-claim-looks); the dead index entries the claims
/// left there are not walked every millisecond.
#[sqlx::test]
async fn the_awake_poll_looks_above_the_claim_mark(pool: PgPool) {
    use jobrelay::relay::cursor::{ClaimCursor, Claimed};
    use std::sync::Arc;
    insert_rows(&pool, 1, "below").await;
    let below: i64 = sqlx::query_scalar("SELECT max(id) FROM pending_jobs")
        .fetch_one(&pool)
        .await
        .unwrap();
    // A claim that took up to `below` (its row stands for one handed back since), old enough
    // to be the mark.
    let cursor = Arc::new(ClaimCursor::default());
    cursor.start().finish(Claimed {
        last_id: Some(below),
        ..Claimed::default()
    });
    let c = cursor.clone();
    wait_until("the claim becomes the mark", Duration::from_secs(5), || {
        let c = c.clone();
        async move {
            drop(c.start());
            c.mark() == Some(below)
        }
    })
    .await;

    let (mut lock, activity, mut woken) = awake_lock(&pool, cursor);
    let _waiting = activity.waiting();
    assert!(
        !poll_woke(&mut lock, &mut woken).await,
        "a row at or below the mark is not the poll's"
    );
    insert_rows(&pool, 1, "above").await;
    assert!(
        poll_woke(&mut lock, &mut woken).await,
        "a row above the mark wakes the workers"
    );
    lock.close().await;
}

#[sqlx::test]
async fn notify_wakes_an_idle_relay(pool: PgPool) {
    let ns = Namespace::new();
    let child = idle_daemon(&pool, &ns).await;
    for i in 0..3 {
        let row = insert_job(&pool, &NewRow::default()).await;
        // Far sooner than the 30 s poll interval.
        wait_until(
            &format!("row {i} relayed"),
            Duration::from_secs(5),
            || async { ns.llen("queue:billing").await == i + 1 },
        )
        .await;
        let jobs = ns.list_jobs("queue:billing").await;
        assert_job_is_row(&jobs[i], &row);
    }
    wait_until("rows deleted", Duration::from_secs(5), || async {
        pending_count(&pool).await == 0
    })
    .await;
    stop(child).await;
}

/// Transactions of this database rolled back so far, as the statistics have them (a backend
/// reports its own when it exits).
async fn rollbacks(pool: &PgPool) -> i64 {
    let mut conn = pool.acquire().await.unwrap();
    sqlx::query("SELECT pg_stat_clear_snapshot()")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query_scalar(
        "SELECT xact_rollback FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap()
}

/// A relay whose empty claims are counted: started with `args` once the database's rollbacks
/// so far are noted, listening.
struct Counted {
    relay: RelayChild,
    db: String,
    before: i64,
    started: std::time::Instant,
}

impl Counted {
    async fn start(pool: &PgPool, ns: &Namespace, args: &[&str]) -> Counted {
        let db = database_url_of(pool).await;
        let before = rollbacks(pool).await;
        let started = std::time::Instant::now();
        let relay = RelayChild::start(&db, &ns.url, &ns.prefix, args);
        wait_until("the relay listens", Duration::from_secs(20), || async {
            listening_relays(pool).await == 1
        })
        .await;
        Counted {
            relay,
            db,
            before,
            started,
        }
    }

    /// Stops the relay and, once every backend of it has exited and reported its
    /// transactions, returns the database's rollbacks since it started: its empty claims.
    async fn stop(mut self, pool: &PgPool) -> i64 {
        self.relay.signal("TERM");
        assert_eq!(self.relay.wait(Duration::from_secs(30)).await, Some(0));
        let db_name = self.db.rsplit('/').next().unwrap().to_owned();
        let db_name = &db_name;
        wait_until(
            "the relay's sessions end",
            Duration::from_secs(10),
            || async move {
                sqlx::query_scalar::<_, i64>(
                    "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = $1 AND application_name = 'jobrelay'",
                )
                .bind(db_name)
                .fetch_one(pool)
                .await
                .unwrap()
                    == 0
            },
        )
        .await;
        rollbacks(pool).await - self.before
    }
}

/// An idle relay looks for rows once per `--poll-interval`, not once per worker: each look is
/// a claim's transaction (rolled back when it finds nothing), and 24 idle sidecars of 2
/// workers spent most of their Postgres CPU on them. Counted as the database's rollbacks over
/// an idle relay's life: 4 workers polling each would be 4 per interval.
#[sqlx::test]
async fn an_idle_relay_polls_once_per_interval_not_once_per_worker(pool: PgPool) {
    let ns = Namespace::new();
    let relay = Counted::start(&pool, &ns, &["--workers", "4", "--poll-interval", "200ms"]).await;
    let started = relay.started;
    // The window observed: 3 s of an idle relay, 15 poll intervals.
    hold_for(
        Duration::from_secs(3),
        "an idle relay's window, 15 poll intervals",
    )
    .await;
    let looks = relay.stop(&pool).await;
    let intervals = (started.elapsed().as_secs_f64() / 0.2).ceil() as i64;
    // One look per interval, plus each worker's first claim and one at each wake-up of the
    // listener (its start): at most twice the intervals and a few. One per worker and
    // interval would be four times the intervals.
    assert!(
        looks <= 2 * intervals + 8,
        "{looks} empty claims over {intervals} poll intervals of an idle relay of 4 workers"
    );
    assert!(
        looks >= intervals / 2,
        "{looks} looks over {intervals} intervals: polls stopped"
    );
}

/// A wake-up sends one of a relay's waiting workers to claim, not all of them: one claim looks
/// at every claimable row, and each other worker's claim (a transaction, a statement parsed and
/// planned) would find them locked and roll back. Without the wake-up lock (too few
/// connections for it), each row's NOTIFY is one wake-up: 20 rows relayed one at a time by a
/// relay of 4 workers made 86 rollbacks when every worker woke, 12 with one (the workers'
/// first claims, the probe's and the backlog gauges' transactions).
#[sqlx::test]
async fn a_wake_up_sends_one_worker_to_claim(pool: PgPool) {
    let ns = Namespace::new();
    // The workers, the probe and the listener: no wake-up lock.
    let args = [
        "--workers",
        "4",
        "--poll-interval",
        "30s",
        "--pg-max-connections",
        "6",
    ];
    let relay = Counted::start(&pool, &ns, &args).await;
    let started = relay.started;
    let rows = 20;
    for i in 0..rows {
        insert_rows(&pool, 1, "billing").await;
        wait_until(
            &format!("row {i} relayed"),
            Duration::from_secs(5),
            || async { ns.llen("queue:billing").await == i + 1 },
        )
        .await;
    }
    assert!(!lock_held(&pool).await, "the relay took the wake-up lock");
    let looks = relay.stop(&pool).await;
    let seconds = started.elapsed().as_secs() as i64;
    // Each worker's first claim, one at each wake-up of the listener (its start and its
    // checks), the probe's transaction every second and the backlog gauges' every 5: a few
    // and two a second, and less than two a row (every worker woken: three a row at least).
    assert!(
        looks <= 6 + 2 * seconds + 2 * rows as i64,
        "{looks} rollbacks in {seconds} s for {rows} rows, each woken by its NOTIFY, \
         by a relay of 4 workers"
    );
}

/// The awake poll looks past the rows the relay's own batches hold until they end: another
/// worker woken for them would find them locked (a claim for nothing, every millisecond of a
/// steady stream while a batch pushes). Once the batch ends, rows still there wake a worker.
#[sqlx::test]
async fn the_awake_poll_looks_past_the_rows_a_batch_holds(pool: PgPool) {
    use jobrelay::relay::cursor::ClaimCursor;
    use std::sync::Arc;
    insert_rows(&pool, 2, "held").await;
    let (lo, hi): (i64, i64) = sqlx::query_as("SELECT min(id), max(id) FROM pending_jobs")
        .fetch_one(&pool)
        .await
        .unwrap();
    let cursor = Arc::new(ClaimCursor::default());
    let (mut lock, activity, mut woken) = awake_lock(&pool, cursor.clone());
    let _waiting = activity.waiting();

    // A batch of this relay holds both rows.
    let turn = cursor.start();
    turn.holds(lo, hi);
    assert!(
        !poll_woke(&mut lock, &mut woken).await,
        "rows a batch of the relay holds wake nobody"
    );
    insert_rows(&pool, 1, "above").await;
    assert!(
        poll_woke(&mut lock, &mut woken).await,
        "a row beyond them wakes a worker"
    );
    sqlx::query("DELETE FROM pending_jobs WHERE id > $1")
        .bind(hi)
        .execute(&pool)
        .await
        .unwrap();
    assert!(!poll_woke(&mut lock, &mut woken).await, "still held");
    // The batch ended (here: failed) with its rows still pending.
    drop(turn);
    assert!(
        poll_woke(&mut lock, &mut woken).await,
        "rows left when the batch ended wake a worker"
    );
    lock.close().await;
}

/// A sink that notes which rows the relay's cursor says its batches hold, while it pushes.
struct NotingHeld {
    inner: jobrelay::broker::redis_sink::RedisSink,
    cursor: std::sync::Arc<jobrelay::relay::cursor::ClaimCursor>,
    seen: std::sync::Mutex<Vec<Vec<(i64, i64)>>>,
}

impl jobrelay::relay::JobSink for NotingHeld {
    async fn push(
        &self,
        jobs: &[jobrelay::Job],
    ) -> jobrelay::Result<Vec<jobrelay::broker::enqueue::JobResult>> {
        self.seen.lock().unwrap().push(self.cursor.held());
        self.inner.push(jobs).await
    }
}

/// A batch tells the relay's cursor the ids of the rows it holds from its claim until it
/// ends, which the awake poll looks past (the test above): from the lowest to the highest id
/// it took.
#[sqlx::test]
async fn a_batch_holds_its_rows_from_its_claim_to_its_end(pool: PgPool) {
    use jobrelay::relay::batch::Batcher;
    use jobrelay::relay::cursor::ClaimCursor;
    use std::sync::Arc;
    let ns = Namespace::new();
    insert_rows(&pool, 3, "held").await;
    let (lo, hi): (i64, i64) = sqlx::query_as("SELECT min(id), max(id) FROM pending_jobs")
        .fetch_one(&pool)
        .await
        .unwrap();
    let cursor = Arc::new(ClaimCursor::default());
    let sink = NotingHeld {
        inner: redis_sink(&ns, TTL).await,
        cursor: cursor.clone(),
        seen: Default::default(),
    };
    let batcher =
        Batcher::new(pool.clone(), queries(), settings(10), sink).with_cursor(cursor.clone());
    assert_eq!(batcher.run_once(None).await.unwrap().claimed, 3);
    assert_eq!(*batcher.sink().seen.lock().unwrap(), vec![vec![(lo, hi)]]);
    assert_eq!(cursor.held(), vec![], "nothing held once the batch ended");
}

/// A sink that counts the jobs its worker pushed.
struct CountingWorker {
    inner: jobrelay::broker::redis_sink::RedisSink,
    pushed: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl jobrelay::relay::JobSink for CountingWorker {
    async fn push(
        &self,
        jobs: &[jobrelay::Job],
    ) -> jobrelay::Result<Vec<jobrelay::broker::enqueue::JobResult>> {
        let results = self.inner.push(jobs).await?;
        self.pushed
            .fetch_add(jobs.len(), std::sync::atomic::Ordering::Relaxed);
        Ok(results)
    }
}

/// A backlog that arrives with one wake-up (one transaction of many rows, one notification)
/// draws more than the one worker that wake-up sends: a worker whose batch came back full
/// sends one more, also without the wake-up lock's poll. Without that, the other workers of a
/// relay without the lock slept until their poll interval (30 s here) and one worker drained
/// all 20,000 rows.
#[sqlx::test]
async fn a_full_batch_sends_one_more_worker(pool: PgPool) {
    use jobrelay::relay::{Health, RelaySettings, Wakeup};
    use jobrelay::TableName;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let ns = Namespace::new();
    let pushed: Vec<Arc<AtomicUsize>> = (0..4).map(|_| Arc::default()).collect();
    let mut sinks = Vec::new();
    for p in &pushed {
        sinks.push(CountingWorker {
            inner: redis_sink(&ns, TTL).await,
            pushed: p.clone(),
        });
    }
    let settings = RelaySettings {
        table: TableName::default(),
        batch: (*settings(250)).clone(),
        poll_interval: Duration::from_secs(30),
    };
    let wakeup = Wakeup {
        listen: Some((*pool.connect_options()).clone()),
        lock: false,
    };
    let tracker = tokio_util::task::TaskTracker::new();
    let shutdown = tokio_util::sync::CancellationToken::new();
    jobrelay::relay::spawn_with(
        &tracker,
        &settings,
        &wakeup,
        pool.clone(),
        sinks,
        Arc::new(Health::default()),
        shutdown.clone(),
    );
    wait_until("the listener listens", Duration::from_secs(20), || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND query ILIKE 'LISTEN%'",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
            == 1
    })
    .await;
    // Every worker has made its first claim (the empty table) and waits.
    hold_for(Duration::from_millis(500), "the workers' first claims").await;
    let rows = 20_000;
    let expected = insert_many(&pool, rows, "bulk").await;
    drained_then_stopped(&pool, Duration::from_secs(25), tracker, shutdown).await;
    let per_worker: Vec<usize> = pushed.iter().map(|p| p.load(Ordering::Relaxed)).collect();
    assert_eq!(per_worker.iter().sum::<usize>(), rows as usize);
    assert_exactly_once(&queue_uuids(&ns, "queue:bulk").await, &expected);
    assert!(
        per_worker.iter().filter(|&&n| n > 0).count() >= 2,
        "one notification, a backlog of {rows} rows: jobs pushed per worker {per_worker:?}"
    );
}
