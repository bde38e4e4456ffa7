//! The relay: claim committed rows, run the enqueue algorithm, delete what Redis acknowledged.
//!
//! - [`batch`]: one step (claim, push, delete or hand back, commit): [`Batcher::run_once`].
//! - `worker`: the daemon's loop over that step, woken by [`crate::relay::wakeup`] or the poll interval.
//! - [`mod@sweep`]: the one-shot recovery sweep over the same step.
//! - [`JobSink`] ([`crate::sink`]): where claimed jobs go; the relay names no sink of its own.
//! - [`health`], [`probe`]: dependency state for logs, probes and `jobrelay_up`; [`backlog`]:
//!   the backlog and xmin horizon samples.

pub mod backlog;
pub mod batch;
pub mod claim_kind;
pub mod cursor;
pub mod health;
pub mod prepared;
pub mod probe;
pub mod queries;
mod row;
pub(crate) mod slots;
pub(crate) mod supervise;
pub mod sweep;
pub mod wakeup;
pub(crate) mod worker;

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use sqlx::PgPool;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use self::batch::{BatchSettings, Batcher};
pub use self::health::{Dependency, Health};
pub use self::prepared::PreparedStatements;
pub use self::queries::Queries;
pub use self::sweep::sweep;
pub use crate::report::Report;
use crate::sink::ClaimNeeds;
pub use crate::sink::JobSink;
use crate::table::TableName;
use crate::telemetry::events::ClaimsNamed;

/// What the daemon's workers share.
#[derive(Debug, Clone)]
pub struct RelaySettings {
    /// The outbox table.
    pub table: TableName,
    /// Claiming and failure handling.
    pub batch: BatchSettings,
    /// How long an idle worker waits when no notification comes.
    pub poll_interval: Duration,
}

/// How idle workers learn of new rows, and what that costs in connections.
#[derive(Debug, Clone)]
pub struct Wakeup {
    /// Where the notification listener connects (a session of its own, outside the pool);
    /// `None`: no listener, idle workers poll every poll interval.
    pub listen: Option<PgConnectOptions>,
    /// Whether busy workers hold the wake-up lock (one more connection while they find rows),
    /// so that producers skip NOTIFY ([`self::wakeup::lock`]).
    pub lock: bool,
}

/// Starts the notification listener (on the pool's server), the wake-up lock and one worker
/// per sink on `tracker`, until `shutdown`: [`spawn_with`] with both wake-ups on.
pub fn spawn<S: JobSink + 'static>(
    tracker: &TaskTracker,
    settings: &RelaySettings,
    pool: PgPool,
    sinks: Vec<S>,
    health: Arc<Health>,
    shutdown: CancellationToken,
) {
    let wakeup = Wakeup {
        listen: Some((*pool.connect_options()).clone()),
        lock: true,
    };
    spawn_with(tracker, settings, &wakeup, pool, sinks, health, shutdown);
}

/// Starts the wake-ups `wakeup` asks for and one worker per sink on `tracker`, until
/// `shutdown`.
///
/// Each worker finishes the batch in hand after `shutdown` fires, then stops. Wait for them
/// with `tracker.close(); tracker.wait()`. Every task is supervised (`supervise.rs`): one that
/// panics is logged, counted and restarted.
pub fn spawn_with<S: JobSink + 'static>(
    tracker: &TaskTracker,
    settings: &RelaySettings,
    wakeup: &Wakeup,
    pool: PgPool,
    sinks: Vec<S>,
    health: Arc<Health>,
    shutdown: CancellationToken,
) {
    let (wake_tx, wake_rx) = watch::channel(0u64);
    let activity = Arc::new(self::wakeup::lock::Activity::default());
    let prepared = Arc::new(prepared::PreparedClaims::new(
        settings.batch.prepared_statements,
    ));
    ClaimsNamed::gauge(prepared.on());
    if let Some(listen) = &wakeup.listen {
        let (h, stop) = (health.clone(), shutdown.clone());
        let listener = self::wakeup::listen::Listener {
            opts: listen.clone(),
            notifier: pool.clone(),
            channel: settings.table.channel(),
            wake: wake_tx.clone(),
            // Its proof of a session is the pool's only where it connects as the pool does.
            claims: same_server(listen, pool.connect_options().as_ref()).then(|| prepared.clone()),
        };
        tracker.spawn(supervise::supervised(
            "listener",
            h,
            stop.clone(),
            move || listener.clone().run(stop.clone()),
        ));
    } else {
        tracing::info!(
            poll_interval = ?settings.poll_interval,
            "no notification listener (--pg-max-connections): idle workers poll"
        );
    }
    // One claim cursor per relay: its workers' claims start where the relay's last ones took,
    // and the wake-up lock's poll looks where they do.
    let cursor = Arc::new(cursor::ClaimCursor::default());
    let needs = sinks
        .first()
        .map_or_else(ClaimNeeds::default, JobSink::claim_needs);
    if wakeup.lock {
        let holds = needs.holds_until_due;
        let (h, stop) = (health.clone(), shutdown.clone());
        let (p, table, a) = (pool.clone(), settings.table.clone(), activity.clone());
        let c = cursor.clone();
        let tx = wake_tx.clone();
        tracker.spawn(supervise::supervised(
            "wakeup",
            h,
            stop.clone(),
            move || {
                self::wakeup::lock::keep_awake(
                    p.clone(),
                    table.clone(),
                    a.clone(),
                    tx.clone(),
                    c.clone(),
                    holds,
                    stop.clone(),
                )
            },
        ));
    }
    // Without a listener or a lock, the wake channel closes here and workers poll.
    drop(wake_tx);
    let queries = Arc::new(Queries::for_needs(&settings.table, needs));
    let batch = Arc::new(settings.batch.clone());
    let slots = Arc::new(slots::SlotGate::default());
    for sink in sinks {
        let batcher = Arc::new(
            Batcher::new(pool.clone(), queries.clone(), batch.clone(), sink)
                .with_cursor(cursor.clone())
                .with_prepared(prepared.clone()),
        );
        let (h, stop, wake, a, g) = (
            health.clone(),
            shutdown.clone(),
            wake_rx.clone(),
            activity.clone(),
            slots.clone(),
        );
        let (batch_size, poll) = (settings.batch.batch_size, settings.poll_interval);
        tracker.spawn(supervise::supervised(
            "worker",
            h.clone(),
            stop.clone(),
            move || {
                worker::work(
                    batcher.clone(),
                    batch_size,
                    poll,
                    wake.clone(),
                    a.clone(),
                    g.clone(),
                    h.clone(),
                    stop.clone(),
                )
            },
        ));
    }
}

/// Whether `a` and `b` reach the same server, database and role (a session of one proves the
/// other's: a pooler's mode is a database's or a role's).
fn same_server(a: &PgConnectOptions, b: &PgConnectOptions) -> bool {
    a.get_host() == b.get_host()
        && a.get_port() == b.get_port()
        && a.get_socket() == b.get_socket()
        && a.get_database() == b.get_database()
        && a.get_username() == b.get_username()
}
