//! The episodes of the relay's dependencies (Postgres, Redis, the outbox table), of failing
//! batches, and the panics of its tasks. [`crate::relay::health`] decides when an episode
//! begins and ends, and emits each of these once per change of state.

use std::fmt::Display;
use std::time::Duration;

use super::Event;
use crate::error::{Dependency, Reason};
use crate::table::TableName;
use crate::telemetry::{metrics, redact};

/// A dependency answered for the first time (INFO `<dep> connected`, `jobrelay_up` 1).
#[derive(Debug)]
pub struct DependencyConnected {
    /// Which.
    pub dependency: Dependency,
}

impl Event for DependencyConnected {
    fn emit(self) {
        let name = self.dependency.as_str();
        metrics::up(name, true);
        tracing::info!(dependency = name, "{name} connected");
    }
}

/// A dependency's outage began (WARN `<dep> unavailable; retrying with backoff`, or `<dep> not
/// reachable yet; ...` when it never answered; `jobrelay_up` 0).
pub struct DependencyDown<'a> {
    /// Which.
    pub dependency: Dependency,
    /// Why ([`Reason`]: the name `/readyz` and `jobrelay check` use too).
    pub reason: Reason,
    /// The error (scrubbed of secrets here).
    pub error: &'a dyn Display,
    /// It had answered before (an outage), or not yet since the start.
    pub was_up: bool,
}

impl Event for DependencyDown<'_> {
    fn emit(self) {
        let name = self.dependency.as_str();
        metrics::up(name, false);
        let error = redact::scrub(&self.error.to_string()).into_owned();
        let reason = self.reason.as_str();
        if self.was_up {
            tracing::warn!(dependency = name, reason, error = %error,
                "{name} unavailable; retrying with backoff");
        } else {
            tracing::warn!(dependency = name, reason, error = %error,
                "{name} not reachable yet; retrying with backoff");
        }
    }
}

/// A dependency's outage ended (INFO `<dep> recovered`, `jobrelay_up` 1).
#[derive(Debug)]
pub struct DependencyRecovered {
    /// Which.
    pub dependency: Dependency,
    /// The reason the outage began with.
    pub reason: Reason,
    /// How long it lasted.
    pub outage: Duration,
    /// Failures reported during it.
    pub failed_tries: u64,
}

impl Event for DependencyRecovered {
    fn emit(self) {
        let name = self.dependency.as_str();
        metrics::up(name, true);
        tracing::info!(
            dependency = name,
            reason = self.reason.as_str(),
            outage_seconds = self.outage.as_secs_f64(),
            failed_tries = self.failed_tries,
            "{name} recovered"
        );
    }
}

/// The outbox table is missing (ERROR). No metric of its own: `/readyz` fails, and the
/// backlog gauges stop being sampled.
pub struct OutboxTableMissing<'a> {
    /// The table.
    pub table: &'a TableName,
    /// What Postgres said (scrubbed here).
    pub error: &'a dyn Display,
}

impl Event for OutboxTableMissing<'_> {
    fn emit(self) {
        tracing::error!(table = %self.table, error = %redact::scrub(&self.error.to_string()),
            "outbox table {} does not exist: run `jobrelay migrate` (checking again quietly)",
            self.table);
    }
}

/// The outbox table is there again (INFO). No metric, as [`OutboxTableMissing`].
#[derive(Debug)]
pub struct OutboxTablePresent<'a> {
    /// The table.
    pub table: &'a TableName,
    /// How long it was missing.
    pub outage: Duration,
}

impl Event for OutboxTablePresent<'_> {
    fn emit(self) {
        tracing::info!(table = %self.table, outage_seconds = self.outage.as_secs_f64(),
            "outbox table {} present", self.table);
    }
}

/// Batches began failing for a reason that names no dependency's state (WARN). Their jobs
/// are counted by [`super::PushFailed`] when a push failed; a failed claim has no job to count.
pub struct BatchesFailing<'a> {
    /// The first error (scrubbed here).
    pub error: &'a dyn Display,
}

impl Event for BatchesFailing<'_> {
    fn emit(self) {
        tracing::warn!(error = %redact::scrub(&self.error.to_string()),
            "relay batches failing; retrying with backoff");
    }
}

/// A batch completed after [`BatchesFailing`] (INFO).
#[derive(Debug)]
pub struct BatchesSucceedAgain;

impl Event for BatchesSucceedAgain {
    fn emit(self) {
        tracing::info!("relay batches succeed again");
    }
}

/// A relay task panicked and is being restarted (ERROR, `jobrelay_task_panics_total{task}`).
#[derive(Debug)]
pub struct TaskPanicked<'a> {
    /// `worker`, `probe`, `listener`, `wakeup`, ...
    pub task: &'a str,
    /// The panic's message.
    pub message: &'a str,
    /// Panics with no batch completed in between, this one included.
    pub panics_in_a_row: u64,
}

impl Event for TaskPanicked<'_> {
    fn emit(self) {
        metrics::task_panicked(self.task);
        tracing::error!(task = self.task, panic = %self.message, panics_in_a_row = self.panics_in_a_row,
            "relay task panicked; its batch rolled back, restarting it");
    }
}
