//! The wake-up lease: while workers are busy, producers skip NOTIFY and the relay polls.
//!
//! NOTIFY serialises the commits of concurrent producers (Postgres holds a database-wide lock
//! from a notifying transaction's commit through its WAL flush). A relay that has just found
//! work will look again within a millisecond anyway, so it takes a lease in `jobrelay_wakeup`
//! (migration 3); while the lease holds, the insert trigger does not notify, and this task
//! polls the table every [`AWAKE_POLL`] instead.
//!
//! When no worker has found rows for [`AWAKE_WINDOW`], the task stops renewing. Once the lease
//! has expired on the server's clock, it waits until every transaction that was running at that
//! moment has ended (snapshot xmin passes the xmax seen after expiry): any producer that skipped
//! its NOTIFY because of the lease has then committed or aborted. It wakes the workers for one
//! more claim, and from then on the trigger notifies again. No row waits for the poll interval
//! because of the lease, unless an unrelated transaction holds the xmin back for longer than
//! [`XMIN_WAIT_LIMIT`]. If the relay dies holding a lease, producers skip NOTIFY until it
//! expires ([`LEASE`]); other relays still find those rows within their poll interval.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sqlx::PgPool;
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;

use crate::table::TableName;

/// How long after the last non-empty claim the relay stays awake.
pub const AWAKE_WINDOW: Duration = Duration::from_secs(1);
/// How often an awake relay checks for claimable rows.
pub const AWAKE_POLL: Duration = Duration::from_millis(1);
/// Lease length on the server's clock; renewed every third of it while awake.
pub const LEASE: Duration = Duration::from_millis(600);
/// Longest wait for older transactions to end after the lease lapsed.
pub const XMIN_WAIT_LIMIT: Duration = Duration::from_secs(10);

/// When the workers last claimed rows.
#[derive(Debug)]
pub struct Activity {
    base: Instant,
    /// Milliseconds since `base` of the last mark, plus one (0: never).
    last: AtomicU64,
    changed: Notify,
}

impl Default for Activity {
    fn default() -> Self {
        Activity {
            base: Instant::now(),
            last: AtomicU64::new(0),
            changed: Notify::new(),
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

/// Runs the lease until `shutdown`, bumping `wake` whenever workers should claim.
///
/// Degrades to plain NOTIFY wake-ups when the lease cannot be written (e.g. a role without
/// privileges on `jobrelay_wakeup`, or a schema before migration 3): logged once.
pub async fn keep_awake(
    pool: PgPool,
    table: TableName,
    activity: std::sync::Arc<Activity>,
    wake: watch::Sender<u64>,
    shutdown: CancellationToken,
) {
    let channel = table.channel();
    // The claim's own access path (the primary key, in id order): after a burst the heap is
    // full of dead tuples until vacuum runs, and a sequential scan would read all of them
    // every millisecond, while the index scan skips entries already marked dead.
    let ready_sql = format!(
        "SELECT EXISTS (SELECT 1 FROM {} WHERE available_at <= now() ORDER BY id LIMIT 1)",
        table.pending()
    );
    let bump = || wake.send_modify(|g| *g = g.wrapping_add(1));
    let mut leased = false;
    let mut renewed_at: Option<Instant> = None;
    let mut warned = false;
    // While Postgres fails, wait as the workers do instead of polling every millisecond.
    let mut backoff = crate::backoff::Backoff::transient();
    loop {
        if shutdown.is_cancelled() {
            if leased {
                let _ = release(&pool, &channel).await;
            }
            return;
        }
        if activity.is_awake() {
            let mut failed = false;
            if renewed_at.is_none_or(|t| t.elapsed() >= LEASE / 3) {
                renewed_at = Some(Instant::now());
                match renew(&pool, &channel).await {
                    Ok(()) => leased = true,
                    Err(sqlx::Error::Database(e)) if !warned => {
                        // A role without privileges, or a schema before migration 3.
                        warned = true;
                        tracing::warn!(error = %e, "cannot hold the wake-up lease; producers keep notifying on every insert");
                    }
                    Err(_) => failed = true,
                }
            }
            if leased && !failed {
                match sqlx::query_scalar::<_, bool>(&ready_sql)
                    .fetch_one(&pool)
                    .await
                {
                    Ok(true) => bump(),
                    Ok(false) => {}
                    Err(_) => failed = true,
                }
            }
            let pause = if failed {
                // Postgres is failing: the workers report it; this task keeps out of the way.
                backoff.next_delay()
            } else if !leased {
                // No lease (e.g. a role without the grant): producers notify, nothing to poll
                // until the next renewal attempt.
                backoff.reset();
                LEASE / 3
            } else {
                backoff.reset();
                AWAKE_POLL
            };
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = tokio::time::sleep(pause) => {}
            }
        } else if leased {
            if let Err(e) = lapse(&pool, &channel, &shutdown).await {
                tracing::debug!(error = %e, "wake-up lease lapse check failed");
            }
            leased = false;
            renewed_at = None;
            // Rows committed by producers that trusted the lease are visible now.
            bump();
        } else {
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = activity.changed.notified() => {}
                _ = tokio::time::sleep(AWAKE_WINDOW) => {}
            }
        }
    }
}

async fn renew(pool: &PgPool, channel: &str) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO jobrelay_wakeup (channel, awake_until)
         VALUES ($1, clock_timestamp() + $2 * interval '1 millisecond')
         ON CONFLICT (channel) DO UPDATE
         SET awake_until = greatest(jobrelay_wakeup.awake_until, EXCLUDED.awake_until)",
    )
    .bind(channel)
    .bind(LEASE.as_millis() as f64)
    .execute(pool)
    .await?;
    Ok(())
}

async fn release(pool: &PgPool, channel: &str) -> sqlx::Result<()> {
    // Only our own lease can be cut short safely if no other relay extended it: leave any
    // lease that runs longer than ours would have, and let it expire by itself.
    sqlx::query(
        "UPDATE jobrelay_wakeup SET awake_until = clock_timestamp()
         WHERE channel = $1 AND awake_until <= clock_timestamp() + $2 * interval '1 millisecond'",
    )
    .bind(channel)
    .bind(LEASE.as_millis() as f64)
    .execute(pool)
    .await?;
    Ok(())
}

/// Waits until the lease has expired on the server's clock and every transaction running at
/// that moment has ended.
async fn lapse(pool: &PgPool, channel: &str, shutdown: &CancellationToken) -> sqlx::Result<()> {
    let started = Instant::now();
    loop {
        let expired: bool = sqlx::query_scalar(
            "SELECT NOT EXISTS (SELECT 1 FROM jobrelay_wakeup
                                WHERE channel = $1 AND awake_until > clock_timestamp())",
        )
        .bind(channel)
        .fetch_one(pool)
        .await?;
        if expired || shutdown.is_cancelled() || started.elapsed() > LEASE * 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let xmax: String = sqlx::query_scalar("SELECT pg_snapshot_xmax(pg_current_snapshot())::text")
        .fetch_one(pool)
        .await?;
    let started = Instant::now();
    loop {
        let passed: bool =
            sqlx::query_scalar("SELECT pg_snapshot_xmin(pg_current_snapshot()) >= $1::xid8")
                .bind(&xmax)
                .fetch_one(pool)
                .await?;
        if passed || shutdown.is_cancelled() {
            return Ok(());
        }
        if started.elapsed() > XMIN_WAIT_LIMIT {
            tracing::debug!("an old transaction holds the xmin back; relying on the poll interval");
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}
