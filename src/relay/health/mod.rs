//! What the relay knows about its dependencies and its own tasks, shared by workers, the probe,
//! `/healthz`, `/readyz` and metrics.
//!
//! Three things are tracked as episodes: Postgres, Redis, and the outbox table. Workers and the
//! probe report successes and failures here, each with the time its request was sent and, for
//! failures, the [`Reason`] the error names. The first failure after a success logs the episode
//! once, with its reason; the first success after it logs its end once. Failures in between
//! only update the reason that `/readyz` shows. A report about a request sent before the last
//! change of state is old news and is ignored, so overlapping requests (two workers and the
//! probe) cannot make one outage look like several. A recovery also wakes the workers that are
//! backing off ([`Health::recoveries`]).
//!
//! Reports come from two witnesses: pushes (the workers' batches) and checks (the probe, a
//! connect). A Redis episode in which a push failed ends only when a push succeeds: the probe's
//! small write can succeed while every batch is refused (memory hovering at `maxmemory`, a
//! script command denied by an ACL, a cluster node that owns the probe's key but not the
//! queue's), and letting it end the episode would log one outage and one recovery a second.
//! The probe's success then only wakes the workers, once per failed push, so that a batch tries
//! again at once. Should no push fail for [`PIN_WINDOW`] (nothing left to push: the rows were
//! delivered by another relay, or deleted), a check ends the episode again.
//!
//! Failures that name no dependency state ([`Reason::Other`]: an SQL error, a bug) are not
//! outages: they are logged once per run of failing batches.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

pub use crate::error::Dependency;
use crate::error::{Error, Reason};
use crate::report::Interruption;
use crate::table::TableName;
use crate::telemetry::events::{self, Event as _};

mod episode;

use self::episode::{Change, Episode, Witness};
pub use self::episode::{DISK_FULL_QUIET, PIN_WINDOW};

/// A worker that has not looped for this long is considered stuck: longer than the worst
/// legitimate gap (30 s backoff cap plus a batch bounded by the push and statement timeouts).
pub const STALL_LIMIT: Duration = Duration::from_secs(120);

/// Panics in a row (with no batch completed in between) after which `/healthz` fails, so that
/// Kubernetes restarts a process whose tasks keep dying although they are restarted.
pub const PANIC_LIMIT: u64 = 3;

/// Shared health state of one relay process.
#[derive(Debug, Default)]
pub struct Health {
    postgres: Episode,
    redis: Episode,
    table: Episode,
    table_name: TableName,
    heartbeat_ms: AtomicU64,
    /// Bumped on every recovery, so that workers backing off (up to 30 s) resume at once.
    recoveries: watch::Sender<u64>,
    /// Whether batches are failing for a reason that is no dependency's state.
    batches_failing: AtomicBool,
    /// Panics since the last completed batch, and the last panic's message.
    panics_in_a_row: AtomicU64,
    last_panic: Mutex<String>,
}

impl Health {
    /// Health of a relay on `table` (named in the logs and `/readyz` when it is missing).
    pub fn for_table(table: TableName) -> Self {
        Health {
            table_name: table,
            ..Health::default()
        }
    }

    fn dep(&self, d: Dependency) -> &Episode {
        match d {
            Dependency::Postgres => &self.postgres,
            Dependency::Redis => &self.redis,
        }
    }

    /// Records that `d` answered just now. Logs the recovery if it was down.
    pub fn ok(&self, d: Dependency) {
        self.ok_at(d, Instant::now());
    }

    /// Records that a batch's request to `d` sent at `sent` succeeded (for Redis: a push was
    /// acknowledged). Logs the recovery if it was down.
    ///
    /// An answer to a request sent before the current outage began says nothing about the
    /// outage (a push that got through just before Redis died, reported after another worker
    /// saw it die), so it does not end it: the recovery is logged once, when it happens.
    pub fn ok_at(&self, d: Dependency, sent: Instant) {
        self.answered(d, sent, Witness::Push, false);
    }

    /// Records that a request to `d` sent at `sent` wrote new rows (a batch handed rows back
    /// or moved them to the dead letters): it also ends a `disk full` episode, which a mere
    /// answer does not ([`DISK_FULL_QUIET`]).
    pub fn wrote_at(&self, d: Dependency, sent: Instant) {
        self.answered(d, sent, Witness::Push, true);
    }

    /// Records that a check of `d` (the probe) sent at `sent` succeeded. Ends an episode like
    /// [`Health::ok_at`], except a Redis episode in which a push failed: that one only a push
    /// ends, and the check merely wakes the workers (once per failed push).
    pub fn check_ok_at(&self, d: Dependency, sent: Instant) {
        self.answered(d, sent, Witness::Check, false);
    }

    fn answered(&self, d: Dependency, sent: Instant, witness: Witness, wrote: bool) {
        match self.dep(d).ok_at(sent, witness, wrote) {
            Change::None | Change::Began { .. } => {}
            Change::Nudge => self.recovered(),
            Change::First => events::DependencyConnected { dependency: d }.emit(),
            Change::Ended {
                lasted,
                failures,
                reason,
            } => {
                events::DependencyRecovered {
                    dependency: d,
                    reason,
                    outage: lasted,
                    failed_tries: failures,
                }
                .emit();
                self.recovered();
            }
        }
    }

    /// Records that `d` failed just now for `reason`, as a check (a connect, the probe). Logs
    /// the episode once, when it begins.
    pub fn failed(&self, d: Dependency, reason: Reason, error: &dyn std::fmt::Display) {
        self.failed_by(d, Instant::now(), reason, error, Witness::Check);
    }

    /// Records that a request to `d` sent at `sent` failed for `reason` with `error`. Logs the
    /// episode once, when it begins.
    ///
    /// A request sent before `d` last recovered (a push stuck in a stall that times out after
    /// the probe saw the end of it) does not begin a new episode.
    ///
    /// This is a batch's failure: a Redis episode it begins or continues ends only when a push
    /// succeeds ([`Health::check_ok_at`]).
    pub fn failed_at(
        &self,
        d: Dependency,
        sent: Instant,
        reason: Reason,
        error: &dyn std::fmt::Display,
    ) {
        self.failed_by(d, sent, reason, error, Witness::Push);
    }

    /// Records that a check of `d` (the probe) sent at `sent` failed for `reason`.
    pub fn check_failed_at(
        &self,
        d: Dependency,
        sent: Instant,
        reason: Reason,
        error: &dyn std::fmt::Display,
    ) {
        self.failed_by(d, sent, reason, error, Witness::Check);
    }

    fn failed_by(
        &self,
        d: Dependency,
        sent: Instant,
        reason: Reason,
        error: &dyn std::fmt::Display,
        witness: Witness,
    ) {
        let pin = witness == Witness::Push && d == Dependency::Redis;
        if let Change::Began { was_up } = self.dep(d).failed_at(sent, reason, error, pin) {
            events::DependencyDown {
                dependency: d,
                reason,
                error,
                was_up,
            }
            .emit();
        }
    }

    /// Records the failure of a batch begun at `sent`: against the dependency and reason the
    /// error names; the outbox table when it is missing; otherwise as a failing batch.
    pub fn failed_with_at(&self, e: &Error, sent: Instant) {
        self.failed_for(e.dependency(), e.reason(), sent, e, Witness::Push);
    }

    /// Records a batch's partial failure (`Report::interrupted`, `Report::unsettled`) like
    /// [`Health::failed_with_at`] records an error.
    pub fn interrupted_at(&self, cut: &Interruption, sent: Instant) {
        self.failed_for(Some(cut.dependency), cut.reason, sent, cut, Witness::Push);
    }

    /// Records the failure of a check (the probe) sent at `sent`, as [`Health::failed_with_at`].
    pub fn check_failed_with_at(&self, e: &Error, sent: Instant) {
        self.failed_for(e.dependency(), e.reason(), sent, e, Witness::Check);
    }

    fn failed_for(
        &self,
        dependency: Option<Dependency>,
        reason: Reason,
        sent: Instant,
        e: &dyn std::fmt::Display,
        witness: Witness,
    ) {
        match dependency {
            Some(Dependency::Postgres) if reason == Reason::TableMissing => {
                self.answered(Dependency::Postgres, sent, witness, false);
                self.table_missing_at(sent, e);
            }
            Some(d) if reason != Reason::Other => self.failed_by(d, sent, reason, e, witness),
            _ => {
                if !self.batches_failing.swap(true, Ordering::AcqRel) {
                    events::BatchesFailing { error: e }.emit();
                }
            }
        }
    }

    /// Records that the outbox table was found by a request sent at `sent`.
    pub fn table_present_at(&self, sent: Instant) {
        if let Change::Ended { lasted, .. } = self.table.ok_at(sent, Witness::Check, false) {
            events::OutboxTablePresent {
                table: &self.table_name,
                outage: lasted,
            }
            .emit();
            self.recovered();
        }
    }

    /// Records that a request sent at `sent` found no outbox table (or schema, or database).
    pub fn table_missing_at(&self, sent: Instant, error: &dyn std::fmt::Display) {
        if let Change::Began { .. } = self
            .table
            .failed_at(sent, Reason::TableMissing, error, false)
        {
            events::OutboxTableMissing {
                table: &self.table_name,
                error,
            }
            .emit();
        }
    }

    /// A batch completed (whatever it found): ends a run of failing batches and of panics.
    pub fn batch_completed(&self) {
        self.panics_in_a_row.store(0, Ordering::Release);
        if self.batches_failing.swap(false, Ordering::AcqRel) {
            events::BatchesSucceedAgain.emit();
        }
    }

    /// Records that the task `task` panicked with `message` (it is being restarted).
    pub fn panicked(&self, task: &str, message: &str) {
        let n = self.panics_in_a_row.fetch_add(1, Ordering::AcqRel) + 1;
        *self.last_panic.lock().expect("not poisoned") = format!("{task}: {message}");
        events::TaskPanicked {
            task,
            message,
            panics_in_a_row: n,
        }
        .emit();
    }

    fn recovered(&self) {
        self.recoveries.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Changes whenever a dependency or the table recovers from an episode.
    pub fn recoveries(&self) -> watch::Receiver<u64> {
        self.recoveries.subscribe()
    }

    /// Whether `d` answered last time it was asked.
    pub fn is_up(&self, d: Dependency) -> bool {
        self.dep(d).is_up()
    }

    /// Whether the outbox table was present last time it was looked for.
    pub fn table_present(&self) -> bool {
        self.table.is_up()
    }

    /// `Ok` when ready, otherwise one line per thing that is not, naming its reason, e.g.
    /// `redis: out of memory (OOM command not allowed ...)`.
    pub fn readiness(&self) -> Result<(), Vec<String>> {
        let mut why = Vec::new();
        for d in [Dependency::Postgres, Dependency::Redis] {
            if !self.is_up(d) {
                why.push(format!("{}: {}", d.as_str(), self.dep(d).why()));
            }
        }
        if self.is_up(Dependency::Postgres) && !self.table_present() {
            why.push(format!(
                "outbox table {}: {}; run `jobrelay migrate`",
                self.table_name,
                self.table.why()
            ));
        }
        if why.is_empty() {
            Ok(())
        } else {
            Err(why)
        }
    }

    /// `Ok` while the relay's loops are alive: a worker looped within [`STALL_LIMIT`], and its
    /// tasks did not panic [`PANIC_LIMIT`] times in a row without completing a batch.
    pub fn liveness(&self) -> Result<(), String> {
        let panics = self.panics_in_a_row.load(Ordering::Acquire);
        if panics >= PANIC_LIMIT {
            let last = self.last_panic.lock().expect("not poisoned").clone();
            return Err(format!(
                "relay tasks panicked {panics} times in a row, last: {last}"
            ));
        }
        match self.since_heartbeat() {
            Some(d) if d > STALL_LIMIT => Err(format!(
                "relay loop stalled: no worker iteration for {}s",
                d.as_secs()
            )),
            _ => Ok(()),
        }
    }

    /// A worker loop is alive: called once per iteration.
    pub fn beat(&self) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis() as u64;
        self.heartbeat_ms.store(now, Ordering::Release);
    }

    /// Time since the last worker heartbeat (None before the first).
    pub fn since_heartbeat(&self) -> Option<Duration> {
        let last = self.heartbeat_ms.load(Ordering::Acquire);
        if last == 0 {
            return None;
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis() as u64;
        Some(Duration::from_millis(now.saturating_sub(last)))
    }
}

#[cfg(test)]
mod tests;
