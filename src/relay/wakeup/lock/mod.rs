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
//! While every worker is busy the task runs no poll, but it sends a keep-alive statement
//! every [`KEEPALIVE`] (a fifth of [`IDLE_TIMEOUT`]): a drain of a large backlog keeps every
//! worker in its batches for minutes, and a transaction left idle that long was ended by the
//! server after [`IDLE_TIMEOUT`] (issue 34: about 5 s into every drain, after which producers
//! notified again for the rest of it). The keep-alive runs no query on any table and leaves
//! no snapshot behind: between statements the transaction's `backend_xmin` is NULL.
//!
//! A relay that dies releases the lock with its transaction. One that hangs with its
//! connection open stops polling and sending keep-alives, and the server ends its transaction
//! after [`IDLE_TIMEOUT`] (`idle_in_transaction_session_timeout`); other relays still poll
//! meanwhile. Every statement is bounded by [`STATEMENT_LIMIT`] on the client too: a server
//! that stops answering (a primary gone silent) costs the lock's session, not the task. When
//! the relay loses the lock while awake (its session ended or failed), it says so once per
//! episode at WARN (`wake-up lock lost`), takes it again as soon as it can (a new session,
//! connected through [`crate::db::ConnectGate`]'s backoff), and says INFO `wake-up lock taken
//! again`.

mod activity;
mod session;

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::{Connection, PgConnection, PgPool};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use self::activity::{Activity, Waiting, AWAKE_WINDOW};
pub use self::session::{IDLE_TIMEOUT, LOCK_CLASS, LOCK_WAIT, STATEMENT_LIMIT, XMIN_WAIT_LIMIT};

use self::session::{bounded, try_lock, unlock_and_settle};
use crate::relay::cursor::ClaimCursor;
use crate::table::TableName;

/// How often an awake relay checks for claimable rows, while a worker waits for them.
pub const AWAKE_POLL: Duration = Duration::from_millis(1);
/// How often an awake relay whose workers are all busy looks whether it is still awake.
pub const BUSY_RECHECK: Duration = Duration::from_millis(100);
/// How long the lock's session may go without a statement while it holds the lock: well under
/// [`IDLE_TIMEOUT`], after which the server would end its transaction.
pub const KEEPALIVE: Duration = Duration::from_secs(1);

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
    /// When the session last ran a statement (take, poll or keep-alive).
    last_statement: Instant,
    /// No try to take the lock before this (a failed connect or statement backs off).
    retry_at: Option<Instant>,
    /// The lock was lost while awake and not taken again yet: the episode is logged once.
    lost: bool,
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
            last_statement: Instant::now(),
            retry_at: None,
            lost: false,
        }
    }

    /// Polls above `cursor`'s mark (the relay's claims' cursor) instead of from the lowest id.
    pub fn with_cursor(mut self, cursor: Arc<ClaimCursor>) -> Self {
        self.cursor = Some(cursor);
        self
    }

    /// In a layout that holds rows until their `run_at` is due
    /// ([`crate::sink::ClaimNeeds::holds_until_due`]), counts only due rows as ready, as
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

    /// The awake poll: whether a row is claimable above the claims' mark, past the rows the
    /// relay's batches hold ([`ClaimCursor::held`]).
    fn ready_statement(&self) -> String {
        let (mark, held) = self
            .cursor
            .as_ref()
            .map_or((None, Vec::new()), |c| (c.mark(), c.held()));
        let past_held: String = held
            .iter()
            .map(|(lo, hi)| format!(" AND id NOT BETWEEN {lo} AND {hi}"))
            .collect();
        format!(
            "{}{}{past_held}{}",
            self.ready_sql.0,
            mark.unwrap_or(i64::MIN),
            self.ready_sql.1
        )
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
            let now = Instant::now();
            if !self.held
                && self.tried_at.is_none_or(|t| t.elapsed() >= LOCK_WAIT)
                && self.retry_at.is_none_or(|t| now >= t)
            {
                self.tried_at = Some(now);
                match try_lock(
                    &self.pool,
                    &mut self.session,
                    &mut self.in_tx,
                    &self.channel,
                )
                .await
                {
                    Ok(true) => {
                        if self.lost {
                            tracing::info!(
                                channel = self.channel,
                                "wake-up lock taken again: producers skip NOTIFY"
                            );
                            self.lost = false;
                        } else {
                            tracing::debug!("wake-up lock taken: producers skip NOTIFY");
                        }
                        self.held = true;
                        self.last_statement = Instant::now();
                        self.backoff.reset();
                        self.retry_at = None;
                    }
                    // Producers that skipped NOTIFY while this waited for the lock have
                    // committed or are about to: claim once more so none waits for the poll.
                    Ok(false) => {
                        self.last_statement = Instant::now();
                        self.backoff.reset();
                        self.bump();
                    }
                    Err(e) => {
                        tracing::debug!(error = %crate::telemetry::redact::scrub(&e.to_string()),
                            "cannot take the wake-up lock");
                        (self.session, self.in_tx) = (None, false);
                        // Not again before the backoff's next step: a server that refuses
                        // connections is not asked every LOCK_WAIT.
                        self.retry_at = Some(Instant::now() + self.backoff.next_delay());
                    }
                }
            }
            let held = self.held;
            if held && !self.activity.anyone_waiting() {
                // Nobody to wake: every worker is in a batch or waits for a claim slot. The
                // session still runs a statement every KEEPALIVE, or the server would end its
                // transaction (idle_in_transaction_session_timeout) in the middle of a drain.
                if self.last_statement.elapsed() >= KEEPALIVE {
                    if let Some(con) = self.session.as_mut() {
                        match bounded(crate::db::simple_query(con, session::KEEPALIVE_SQL)).await {
                            Ok(_) => self.last_statement = Instant::now(),
                            Err(e) => return Next::Pause(self.lose(&e)),
                        }
                    }
                }
                return Next::Busy;
            }
            // Only a poll needs it (it reads the cursor's mark and held rows).
            let ready = if held {
                self.ready_statement()
            } else {
                String::new()
            };
            let pause = match self.session.as_mut().filter(|_| held) {
                // Not held (a producer's long transaction, or Postgres failing): producers
                // notify; nothing to poll until the next try.
                None => self
                    .retry_at
                    .map_or(LOCK_WAIT, |t| t.saturating_duration_since(Instant::now()))
                    .max(LOCK_WAIT),
                Some(con) => match bounded(crate::db::simple_query(con, &ready))
                    .await
                    .and_then(|row| sqlx::Row::try_get::<bool, _>(&row, 0))
                {
                    Ok(ready) => {
                        self.last_statement = Instant::now();
                        if ready {
                            self.bump();
                        }
                        self.backoff.reset();
                        AWAKE_POLL
                    }
                    // The session is gone or failing, and its lock with it (or soon).
                    Err(e) => self.lose(&e),
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
            (self.held, self.in_tx, self.tried_at, self.lost) = (false, false, None, false);
            Next::Pause(Duration::ZERO)
        } else {
            // Asleep: an episode of loss (the lock not taken again) ends here too.
            self.lost = false;
            Next::Idle
        }
    }

    /// The lock's session failed while it held the lock (the server ended it, or it stopped
    /// answering): producers notify again until it is taken again. Logged once per episode;
    /// returns the pause before the next try (the backoff's next step).
    fn lose(&mut self, e: &sqlx::Error) -> Duration {
        if !self.lost {
            tracing::warn!(channel = self.channel,
                error = %crate::telemetry::redact::scrub(&e.to_string()),
                "wake-up lock lost: its session failed; producers NOTIFY until it is taken again");
            self.lost = true;
        } else {
            tracing::debug!(error = %e, "wake-up lock session failed");
        }
        (self.session, self.in_tx, self.held) = (None, false, false);
        let delay = self.backoff.next_delay();
        self.retry_at = Some(Instant::now() + delay);
        delay
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
