//! The wake-up lock: while workers are busy, producers skip NOTIFY and the relay polls.
//!
//! NOTIFY serialises the commits of concurrent producers (Postgres holds a database-wide lock
//! from a notifying transaction's commit through its WAL flush). A relay that has just found
//! work will look again within a millisecond anyway, so it takes the advisory lock
//! `(27250, hashtext(<channel>))` exclusively (migration 5); the insert trigger fires only
//! WHEN its transaction can take that lock shared, so while a relay holds it producers neither
//! notify nor run any PL/pgSQL, and this task polls the table every [`AWAKE_POLL`] instead.
//!
//! The lock is transaction-scoped (`pg_advisory_xact_lock`), taken in a transaction that stays
//! open while the relay is awake, on a connection of its own: it ends with that transaction,
//! never outlives it on a server connection that a pooler (PgBouncer in transaction mode) hands
//! to the next client, and its settings (`lock_timeout`, ...) are `SET LOCAL`. The transaction
//! takes no transaction id and, between polls, holds no snapshot: it does not hold back vacuum.
//!
//! The poll only runs while one of the relay's workers waits for a wake-up ([`Activity::waiting`]):
//! a worker in a batch, or one waiting for a claim slot ([`crate::relay`]'s gate), has no use
//! for one. While a backlog drains, every worker is busy, and a poll each millisecond cost
//! Postgres a statement each time for nothing; in a fleet, the lock's holder is often a relay
//! whose workers wait for a claim slot, and whose mark lags behind the other relays' claims,
//! so each of its polls walked the index entries those claims had just left dead (measured in
//! the fleet benchmark, 6 relays x 4 workers: Postgres 4.4-4.8 µs a row without the polls
//! against 6.0-6.7 with them).
//!
//! When no worker has found rows for [`AWAKE_WINDOW`], the task commits (unlocks), then waits
//! until every transaction of this database that was running at that moment has ended (no
//! session or prepared transaction of the database holds a transaction id older than one taken
//! after unlocking): any producer that skipped its NOTIFY because of the lock has then
//! committed or aborted. It wakes the workers for one more claim, and from then on the trigger
//! notifies again. No row waits for the poll interval because of the lock, unless a writing
//! transaction of the same database stays open longer than [`XMIN_WAIT_LIMIT`]; transactions
//! of other databases on the server are not waited for.
//!
//! A relay that dies releases the lock with its transaction. One that hangs with its
//! connection open stops polling, and the server ends its transaction after
//! [`IDLE_TIMEOUT`] (`idle_in_transaction_session_timeout`); other relays still poll
//! meanwhile. Every statement is bounded by [`STATEMENT_LIMIT`] on the client too: a server
//! that stops answering (a primary gone silent) costs the lock's session, not the task.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::{Connection, PgConnection, PgPool};
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;

use crate::relay::cursor::ClaimCursor;
use crate::table::TableName;

/// How long after the last non-empty claim the relay stays awake.
pub const AWAKE_WINDOW: Duration = Duration::from_secs(1);
/// How often an awake relay checks for claimable rows, while a worker waits for them.
pub const AWAKE_POLL: Duration = Duration::from_millis(1);
/// How often an awake relay whose workers are all busy looks whether it is still awake.
pub const BUSY_RECHECK: Duration = Duration::from_millis(100);
/// How long the relay waits to take the lock (producers' transactions hold it shared until
/// they end); it tries again this often while awake.
pub const LOCK_WAIT: Duration = Duration::from_millis(200);
/// The server ends the lock's transaction when it has been idle this long (a hung relay).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(5);
/// Client-side bound on each of the lock's statements (and on connecting).
pub const STATEMENT_LIMIT: Duration = Duration::from_secs(3);
/// Longest wait for older transactions to end after unlocking.
pub const XMIN_WAIT_LIMIT: Duration = Duration::from_secs(10);
/// First key of the wake-up lock ("jr"); the second is `hashtext(<channel>)`.
pub const LOCK_CLASS: i32 = 0x6A72;

/// When the workers last claimed rows, how many of them wait for a wake-up, and when one last
/// polled while idle.
#[derive(Debug)]
pub struct Activity {
    base: Instant,
    /// Milliseconds since `base` of the last mark, plus one (0: never).
    last: AtomicU64,
    changed: Notify,
    /// Workers between batches, waiting for a wake-up ([`Activity::waiting`]).
    waiting: AtomicUsize,
    /// A worker began to wait.
    waiting_began: Notify,
    /// Milliseconds since `base` of the relay's last idle poll, plus one (0: never).
    idle_polled: AtomicU64,
}

impl Default for Activity {
    fn default() -> Self {
        Activity {
            base: Instant::now(),
            last: AtomicU64::new(0),
            changed: Notify::new(),
            waiting: AtomicUsize::new(0),
            waiting_began: Notify::new(),
            idle_polled: AtomicU64::new(0),
        }
    }
}

impl Activity {
    /// A worker claimed rows.
    pub fn mark(&self) {
        let was_awake = self.is_awake();
        self.last.store(
            self.base.elapsed().as_millis() as u64 + 1,
            Ordering::Release,
        );
        if !was_awake {
            self.changed.notify_one();
        }
    }

    /// A worker waits for a wake-up until the guard is dropped: the awake poll runs for it.
    pub fn waiting(&self) -> Waiting<'_> {
        self.waiting.fetch_add(1, Ordering::AcqRel);
        self.waiting_began.notify_one();
        Waiting(self)
    }

    /// A worker's idle wait of `interval` (`--poll-interval`) ran out with no wake-up: whether
    /// it should look for rows. One worker of the relay does, per interval; the others, whose
    /// waits run out at other moments of it, go back to waiting. Each look is a claim (a
    /// transaction, and a statement parsed and planned), and an idle fleet of 24 relays of 2
    /// workers spent most of its Postgres CPU on them. A backlog that arrives unannounced
    /// still draws every worker: the wake-up lock's poll wakes them once one claims rows, and
    /// without the lock, each idle worker's turn to look comes within an interval.
    pub fn take_idle_poll(&self, interval: Duration) -> bool {
        let now = self.base.elapsed().as_millis() as u64 + 1;
        let last = self.idle_polled.load(Ordering::Acquire);
        // A tenth of the interval's slack: the poller's own next wait ends a little more than
        // an interval after its last look began, never less.
        let recent = (interval.as_millis() as u64).saturating_mul(9) / 10;
        if last != 0 && now.saturating_sub(last) < recent {
            return false;
        }
        self.idle_polled
            .compare_exchange(last, now, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Whether a worker waits for a wake-up.
    pub fn anyone_waiting(&self) -> bool {
        self.waiting.load(Ordering::Acquire) > 0
    }

    /// Whether a worker claimed rows within [`AWAKE_WINDOW`].
    pub fn is_awake(&self) -> bool {
        match self.last.load(Ordering::Acquire) {
            0 => false,
            last => {
                let since = (self.base.elapsed().as_millis() as u64 + 1).saturating_sub(last);
                Duration::from_millis(since) < AWAKE_WINDOW
            }
        }
    }
}

/// A worker waiting for a wake-up, from [`Activity::waiting`].
#[derive(Debug)]
pub struct Waiting<'a>(&'a Activity);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What [`WakeupLock::step`] asks for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Step again after this pause.
    Pause(Duration),
    /// Awake, but no worker waits for a wake-up: step again once one does (or after
    /// [`BUSY_RECHECK`]).
    Busy,
    /// Nobody is awake: step again once a worker claims rows (or after [`AWAKE_WINDOW`]).
    Idle,
}

/// The wake-up lock as a state machine: [`WakeupLock::step`] does one transition (take the
/// lock, poll once, or release it and wait for older transactions), [`keep_awake`] repeats it.
pub struct WakeupLock {
    pool: PgPool,
    channel: String,
    /// The awake poll's statement, before and after the id it starts above.
    ready_sql: (String, String),
    /// The relay's claim cursor: the poll looks above its mark, as claims do.
    cursor: Option<Arc<ClaimCursor>>,
    activity: Arc<Activity>,
    wake: watch::Sender<u64>,
    /// The lock's session, kept from a failed try to the next.
    session: Option<PgConnection>,
    /// The session is inside the lock's transaction.
    in_tx: bool,
    held: bool,
    tried_at: Option<Instant>,
    /// While Postgres fails, wait as the workers do instead of polling every millisecond.
    backoff: crate::backoff::Backoff,
}

impl WakeupLock {
    /// The lock of `table`'s channel, kept while `activity` is awake; `wake` is bumped
    /// whenever workers should claim.
    pub fn new(
        pool: PgPool,
        table: &TableName,
        activity: Arc<Activity>,
        wake: watch::Sender<u64>,
    ) -> Self {
        WakeupLock {
            pool,
            channel: table.channel(),
            // The claim's own access path (the primary key, in id order): after a burst the
            // heap is full of dead tuples until vacuum runs, and a sequential scan would read
            // all of them every millisecond, while the index scan skips entries already marked
            // dead. `statement_timestamp()`, not `now()`: the poll runs in the lock's
            // transaction, whose `now()` stays at its start.
            // Above the relay's claim mark ([`ClaimCursor`]): below it, the index entries of
            // rows the claims deleted stay until vacuum (or, while a long transaction holds
            // the xmin horizon, until it ends), and a poll from the lowest id every millisecond
            // would walk all of them. Rows that become claimable below the mark are the
            // catch-up claims' (docs/guarantees.md#where-a-claim-looks).
            ready_sql: (
                format!(
                    "SELECT EXISTS (SELECT 1 FROM {} WHERE id > ",
                    table.pending()
                ),
                " AND available_at <= statement_timestamp() ORDER BY id LIMIT 1)".to_owned(),
            ),
            cursor: None,
            activity,
            wake,
            session: None,
            in_tx: false,
            held: false,
            tried_at: None,
            backoff: crate::backoff::Backoff::transient(),
        }
    }

    /// Polls above `cursor`'s mark (the relay's claims' cursor) instead of from the lowest id.
    pub fn with_cursor(mut self, cursor: Arc<ClaimCursor>) -> Self {
        self.cursor = Some(cursor);
        self
    }

    /// In a layout that holds rows until their `run_at` is due
    /// ([`crate::redis::layout::Layout::holds_until_due`]), counts only due rows as ready, as
    /// the claim does: otherwise a row whose `run_at` is ahead would wake the workers every
    /// millisecond while they are awake, each time for a claim that takes nothing (measured:
    /// 170-200 empty claims after one such row came in).
    pub fn holding_until_due(mut self, holds: bool) -> Self {
        if holds {
            self.ready_sql.1 = " AND available_at <= statement_timestamp() \
                                AND (run_at IS NULL OR run_at <= statement_timestamp()) \
                                ORDER BY id LIMIT 1)"
                .to_owned();
        }
        self
    }

    /// Whether this relay holds the lock (producers skip NOTIFY).
    pub fn held(&self) -> bool {
        self.held
    }

    fn bump(&self) {
        self.wake.send_modify(|g| *g = g.wrapping_add(1));
    }

    /// One transition. While a worker claimed rows within [`AWAKE_WINDOW`]: take the lock if
    /// not held (trying at most every [`LOCK_WAIT`]), then poll the table once, waking the
    /// workers if a row is claimable. Once nobody is awake: release the lock, wait until every
    /// transaction running at that moment has ended (a producer that skipped NOTIFY has then
    /// committed), and wake the workers for one more claim.
    pub async fn step(&mut self, shutdown: &CancellationToken) -> Next {
        if self.activity.is_awake() {
            if !self.held && self.tried_at.is_none_or(|t| t.elapsed() >= LOCK_WAIT) {
                self.tried_at = Some(Instant::now());
                match try_lock(
                    &self.pool,
                    &mut self.session,
                    &mut self.in_tx,
                    &self.channel,
                )
                .await
                {
                    Ok(true) => {
                        tracing::debug!("wake-up lock taken: producers skip NOTIFY");
                        self.held = true;
                    }
                    // Producers that skipped NOTIFY while this waited for the lock have
                    // committed or are about to: claim once more so none waits for the poll.
                    Ok(false) => self.bump(),
                    Err(e) => {
                        tracing::debug!(error = %e, "cannot take the wake-up lock");
                        (self.session, self.in_tx) = (None, false);
                    }
                }
            }
            let held = self.held;
            if held && !self.activity.anyone_waiting() {
                // Nobody to wake: every worker is in a batch or waits for a claim slot.
                return Next::Busy;
            }
            let pause = match self.session.as_mut().filter(|_| held) {
                // Not held (a producer's long transaction, or Postgres failing): producers
                // notify; nothing to poll until the next try.
                None => LOCK_WAIT,
                Some(con) => match bounded(crate::db::simple_query(
                    con,
                    &format!(
                        "{}{}{}",
                        self.ready_sql.0,
                        self.cursor
                            .as_ref()
                            .and_then(|c| c.mark())
                            .unwrap_or(i64::MIN),
                        self.ready_sql.1
                    ),
                ))
                .await
                .and_then(|row| sqlx::Row::try_get::<bool, _>(&row, 0))
                {
                    Ok(ready) => {
                        if ready {
                            self.bump();
                        }
                        self.backoff.reset();
                        AWAKE_POLL
                    }
                    Err(e) => {
                        // The session is gone or failing, and its lock with it (or soon): the
                        // workers report the outage; this task keeps out of the way.
                        tracing::debug!(error = %e, "wake-up poll failed");
                        (self.session, self.in_tx, self.held) = (None, false, false);
                        self.backoff.next_delay()
                    }
                },
            };
            Next::Pause(pause)
        } else if let Some(con) = self.session.take() {
            // Held, or tried: a try that waited made producers skip NOTIFY meanwhile too.
            if let Err(e) = unlock_and_settle(con, self.in_tx, shutdown).await {
                tracing::debug!(error = %e, "wake-up lock release failed");
            }
            // Rows committed by producers that skipped NOTIFY are visible now.
            tracing::debug!("wake-up lock released: producers notify again");
            self.bump();
            (self.held, self.in_tx, self.tried_at) = (false, false, None);
            Next::Pause(Duration::ZERO)
        } else {
            Next::Idle
        }
    }

    /// Closes the lock's session (which releases the lock).
    pub async fn close(&mut self) {
        if let Some(con) = self.session.take() {
            let _ = tokio::time::timeout(STATEMENT_LIMIT, con.close()).await;
        }
        (self.held, self.in_tx) = (false, false);
    }
}

/// Runs the wake-up lock until `shutdown`, bumping `wake` whenever workers should claim.
pub async fn keep_awake(
    pool: PgPool,
    table: TableName,
    activity: Arc<Activity>,
    wake: watch::Sender<u64>,
    cursor: Arc<ClaimCursor>,
    holds_until_due: bool,
    shutdown: CancellationToken,
) {
    let mut lock = WakeupLock::new(pool, &table, activity.clone(), wake)
        .with_cursor(cursor)
        .holding_until_due(holds_until_due);
    while !shutdown.is_cancelled() {
        match lock.step(&shutdown).await {
            Next::Pause(pause) => {
                tokio::select! {
                    _ = shutdown.cancelled() => {}
                    _ = tokio::time::sleep(pause) => {}
                }
            }
            Next::Busy => {
                tokio::select! {
                    _ = shutdown.cancelled() => {}
                    _ = activity.waiting_began.notified() => {}
                    _ = tokio::time::sleep(BUSY_RECHECK) => {}
                }
            }
            Next::Idle => {
                tokio::select! {
                    _ = shutdown.cancelled() => {}
                    _ = activity.changed.notified() => {}
                    _ = tokio::time::sleep(AWAKE_WINDOW) => {}
                }
            }
        }
    }
    lock.close().await;
}

/// `fut` within [`STATEMENT_LIMIT`]; a timeout is an I/O error (the caller drops the session).
async fn bounded<T>(fut: impl std::future::Future<Output = sqlx::Result<T>>) -> sqlx::Result<T> {
    tokio::time::timeout(STATEMENT_LIMIT, fut)
        .await
        .unwrap_or_else(|_| {
            Err(sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "no answer within {}",
                    humantime::format_duration(STATEMENT_LIMIT)
                ),
            )))
        })
}

/// Opens the lock's transaction: `lock_timeout` [`LOCK_WAIT`], `idle_in_transaction_session_timeout`
/// [`IDLE_TIMEOUT`] and `statement_timeout` [`STATEMENT_LIMIT`], and the claims' planner
/// settings, all for this transaction only.
fn begin_statement() -> String {
    format!(
        "BEGIN; SET LOCAL lock_timeout = {}; SET LOCAL idle_in_transaction_session_timeout = {}; \
         SET LOCAL statement_timeout = {}; {}",
        LOCK_WAIT.as_millis(),
        IDLE_TIMEOUT.as_millis(),
        STATEMENT_LIMIT.as_millis(),
        // The awake poll reads the outbox in `id` order: the claims' planner settings.
        crate::relay::queries::PLANNER_SET_LOCAL
    )
}

/// Takes the wake-up lock in `session` (a connection of its own to the pool's server, opened
/// if `None`), in a transaction opened if `in_tx` is false; `false` when producers'
/// transactions held it shared for longer than [`LOCK_WAIT`] (the transaction is then rolled
/// back, the session kept). While this waits, producers cannot take the lock shared either (a
/// waiting exclusive request blocks new shared ones), so they skip NOTIFY: the relay is awake
/// and polls right after.
async fn try_lock(
    pool: &PgPool,
    session: &mut Option<PgConnection>,
    in_tx: &mut bool,
    channel: &str,
) -> sqlx::Result<bool> {
    let con = match session {
        Some(con) => con,
        None => {
            // Not from the pool: the lock's session is counted apart (--pg-max-connections).
            let con = bounded(PgConnection::connect_with(&pool.connect_options())).await?;
            session.insert(con)
        }
    };
    if !*in_tx {
        bounded(sqlx::Executor::execute(
            &mut *con,
            begin_statement().as_str(),
        ))
        .await?;
        *in_tx = true;
    }
    // Unnamed: a named statement would outlive the transaction on a pooled server connection.
    match bounded(
        sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext($2))")
            .persistent(false)
            .bind(LOCK_CLASS)
            .bind(channel)
            .execute(&mut *con),
    )
    .await
    {
        Ok(_) => Ok(true),
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("55P03") => {
            bounded(sqlx::Executor::execute(&mut *con, "ROLLBACK")).await?;
            *in_tx = false;
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// Commits the lock's transaction if `in_tx` (which unlocks), then waits until every
/// transaction running at that moment has ended: a producer that skipped its NOTIFY has then
/// committed (its row is visible) or aborted. Closes the session.
async fn unlock_and_settle(
    mut con: PgConnection,
    in_tx: bool,
    shutdown: &CancellationToken,
) -> sqlx::Result<()> {
    use sqlx::Row as _;
    if in_tx {
        bounded(sqlx::Executor::execute(&mut con, "COMMIT")).await?;
    }
    // A fresh transaction id: every id below it was assigned before this point. (A snapshot's
    // xmax would not do: it is one past the latest *completed* id, so a producer whose
    // transaction holds the newest id is not below it, and the wait below would pass while
    // that producer is still open.) The simple query protocol, with the id written into the
    // statement: one round trip each, whatever pooler is in between.
    let next: String = bounded(crate::db::simple_query(
        &mut con,
        "SELECT pg_current_xact_id()::text",
    ))
    .await?
    .try_get(0)?;
    let next: u64 = next
        .parse()
        .map_err(|_| sqlx::Error::Protocol(format!("pg_current_xact_id() returned {next:?}")))?;
    // Only this database's transactions can have inserted into the outbox: one that holds
    // an older id, open or prepared, is waited for; a long transaction of another database on
    // the same server (a report, another application) is not. `age` orders ids: an older id
    // is further behind.
    let passed_sql = format!(
        "SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity
                            WHERE datname = current_database() AND backend_xid IS NOT NULL
                              AND pid <> pg_backend_pid()
                              AND age(backend_xid) > age(xid('{next}'::xid8)))
            AND NOT EXISTS (SELECT 1 FROM pg_prepared_xacts
                            WHERE database = current_database()
                              AND age(transaction) > age(xid('{next}'::xid8)))"
    );
    let started = Instant::now();
    loop {
        let passed: bool = bounded(crate::db::simple_query(&mut con, &passed_sql))
            .await?
            .try_get(0)?;
        if passed || shutdown.is_cancelled() {
            break;
        }
        if started.elapsed() > XMIN_WAIT_LIMIT {
            tracing::debug!("an old transaction holds the xmin back; relying on the poll interval");
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    bounded(con.close()).await
}
