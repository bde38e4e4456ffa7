//! The probe's samples: the backlog of the outbox, and what holds the database's xmin horizon.

use std::time::Duration;

use super::Event;
use crate::telemetry::metrics;

/// A transaction (or prepared transaction) that has held the xmin horizon for this long is
/// logged, once per episode, at WARN (docs/metrics.md#the-xmin-horizon): longer than any
/// transaction of the relay's own (bounded by its idle-in-transaction timeout) or of a healthy
/// OLTP application.
pub const HORIZON_WARN_AFTER: Duration = Duration::from_secs(60);

/// Who holds the xmin horizon of the outbox's database back: the oldest snapshot or
/// transaction id that vacuum must keep dead rows for. Until it moves on, no row the relay
/// deleted since can be removed, and claims walk over more and more of them.
#[derive(Debug, Clone, PartialEq)]
pub struct Horizon {
    /// `transaction`, `prepared transaction`, `standby feedback` or `replication slot`.
    pub kind: String,
    /// Its backend's pid (a prepared transaction has none; a slot, while a client uses it).
    pub pid: Option<i32>,
    /// How long it has held the horizon, in seconds, as far as one sample tells: a session's
    /// running statement's age while it is `active`, else its transaction's (prepared: since
    /// `PREPARE`); the relay's `HorizonWatch` keeps counting while the same holder keeps the same
    /// horizon. `None` for a slot or a standby, and for another role's sessions unless the
    /// relay's role may read their statistics (`pg_read_all_stats`).
    pub seconds: Option<f64>,
    /// How many transaction ids old the horizon it holds is.
    pub xids: i64,
    /// What else identifies it: state and application name, a prepared transaction's gid, a
    /// slot's name.
    pub detail: String,
    /// The transaction id it holds the horizon at (its `backend_xmin`, else its `backend_xid`),
    /// as text: the same holder with the same horizon in the next sample has held it since.
    pub horizon: Option<String>,
}

/// One sample of the backlog (`jobrelay_pending_jobs`, `jobrelay_oldest_pending_age_seconds`,
/// `jobrelay_oldest_claimable_age_seconds`, `jobrelay_dead_jobs`). No log line: one every 5 s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BacklogSampled {
    /// Rows in the outbox table.
    pub pending: i64,
    /// Age of the oldest of them, in seconds (0 when there is none).
    pub oldest_age_seconds: f64,
    /// Age of the first row, in `id` order, that a claim could take now (0 when none).
    pub oldest_claimable_age_seconds: f64,
    /// Rows in the dead-letter table.
    pub dead: i64,
}

impl Event for BacklogSampled {
    fn emit(self) {
        metrics::backlog(
            self.pending,
            self.oldest_age_seconds,
            self.oldest_claimable_age_seconds,
            self.dead,
        );
    }
}

/// One sample of the xmin horizon (`jobrelay_xmin_horizon_age_seconds`,
/// `jobrelay_xmin_horizon_age_xids`). No log line: [`XminHorizonHeld`] and
/// [`XminHorizonMovedOn`] tell the episode.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct XminHorizonSampled {
    /// How long its holder's transaction has been open (0 when unknown or none).
    pub age_seconds: f64,
    /// How old the horizon is, in transaction ids.
    pub xids: i64,
}

impl Event for XminHorizonSampled {
    fn emit(self) {
        metrics::xmin_horizon(self.age_seconds, self.xids);
    }
}

/// A holder has kept the xmin horizon for [`HORIZON_WARN_AFTER`] (WARN, once per episode).
/// Its gauges are [`XminHorizonSampled`]'s, set at every sample.
#[derive(Debug)]
pub struct XminHorizonHeld<'a> {
    /// Who holds it.
    pub horizon: &'a Horizon,
    /// For how long, in seconds.
    pub seconds: f64,
}

impl Event for XminHorizonHeld<'_> {
    fn emit(self) {
        let (h, seconds) = (self.horizon, self.seconds);
        let pid = h.pid.map(|p| p.to_string()).unwrap_or_default();
        tracing::warn!(kind = %h.kind, pid = %pid, age_seconds = seconds.round(),
            xids = h.xids, detail = %h.detail,
            threshold_seconds = HORIZON_WARN_AFTER.as_secs(),
            "a {} (pid {}) open for {:.0}s holds the xmin horizon: no row deleted since can be \
             vacuumed, and claims slow down as dead rows pile up; end it (pg_terminate_backend) \
             if it should not be running", h.kind, if pid.is_empty() { "none" } else { &pid }, seconds);
    }
}

/// The holder [`XminHorizonHeld`] named let the horizon go (INFO).
#[derive(Debug)]
pub struct XminHorizonMovedOn<'a> {
    /// Who held it.
    pub was: &'a Horizon,
}

impl Event for XminHorizonMovedOn<'_> {
    fn emit(self) {
        tracing::info!(kind = %self.was.kind, pid = ?self.was.pid, "the xmin horizon moved on");
    }
}
