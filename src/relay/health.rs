//! What the relay knows about its dependencies, shared by workers, probes and metrics.
//!
//! Workers and the probe task report successes and failures here, each with the time its
//! request was sent; the first failure after a success logs the outage once, and the first
//! success after it logs the recovery once. A report about a request sent before the last
//! change of state is old news and is ignored, so overlapping requests (two workers and the
//! probe) cannot make one outage look like several. A recovery also wakes the workers that are
//! backing off ([`Health::recoveries`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

use crate::error::Error;
use crate::telemetry::metrics;

/// A dependency of the relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dependency {
    /// The outbox database.
    Postgres,
    /// The job store.
    Redis,
}

impl Dependency {
    /// The label used in logs and `jobrelay_up{dependency}`.
    pub fn as_str(self) -> &'static str {
        match self {
            Dependency::Postgres => "postgres",
            Dependency::Redis => "redis",
        }
    }

    /// The dependency a transient error came from, if it says.
    pub fn of(e: &Error) -> Option<Dependency> {
        match e {
            Error::Database(_) | Error::Migrate(_) => Some(Dependency::Postgres),
            Error::Redis(_) | Error::Refused { .. } => Some(Dependency::Redis),
            Error::Timeout { what, .. } if what.starts_with("postgres") => {
                Some(Dependency::Postgres)
            }
            Error::Timeout { what, .. } if what.starts_with("redis") => Some(Dependency::Redis),
            _ => None,
        }
    }
}

#[derive(Debug, Default)]
struct DepState {
    /// Starts false: nothing is "up" until it has answered once. Mirrors the state under
    /// `changes` for lock-free reads (readiness, `is_up`).
    up: AtomicBool,
    changes: Mutex<Changes>,
}

#[derive(Debug, Default)]
struct Changes {
    /// When the current state (up, or down) began; None before the first report.
    since: Option<Instant>,
    /// Failed tries in the current outage.
    failures: u64,
}

/// Shared health state of one relay process.
#[derive(Debug, Default)]
pub struct Health {
    postgres: DepState,
    redis: DepState,
    schema: AtomicBool,
    heartbeat_ms: AtomicU64,
    /// Bumped on every recovery, so that workers backing off (up to 30 s) resume at once.
    recoveries: watch::Sender<u64>,
}

impl Health {
    fn dep(&self, d: Dependency) -> &DepState {
        match d {
            Dependency::Postgres => &self.postgres,
            Dependency::Redis => &self.redis,
        }
    }

    /// Records that `d` answered just now. Logs the recovery if it was down.
    pub fn ok(&self, d: Dependency) {
        self.ok_at(d, Instant::now());
    }

    /// Records that `d` answered a request sent at `sent`. Logs the recovery if it was down.
    ///
    /// An answer to a request sent before the current outage began says nothing about the
    /// outage (a push that got through just before Redis died, reported after another worker
    /// saw it die), so it does not end it: the recovery is logged once, when it happens.
    pub fn ok_at(&self, d: Dependency, sent: Instant) {
        let state = self.dep(d);
        if state.up.load(Ordering::Acquire) {
            return;
        }
        let mut changes = state.changes.lock().expect("not poisoned");
        if state.up.load(Ordering::Acquire) || changes.since.is_some_and(|since| sent < since) {
            return;
        }
        state.up.store(true, Ordering::Release);
        metrics::up(d.as_str(), true);
        match changes.since {
            Some(since) => {
                tracing::info!(
                    dependency = d.as_str(),
                    outage_seconds = since.elapsed().as_secs_f64(),
                    failed_tries = changes.failures,
                    "{} recovered",
                    d.as_str()
                );
                self.recoveries.send_modify(|n| *n = n.wrapping_add(1));
            }
            None => tracing::info!(dependency = d.as_str(), "{} connected", d.as_str()),
        }
        changes.since = Some(Instant::now());
        changes.failures = 0;
    }

    /// Changes whenever a dependency recovers from an outage.
    pub fn recoveries(&self) -> watch::Receiver<u64> {
        self.recoveries.subscribe()
    }

    /// Records that `d` failed just now with `error`. Logs the outage once, when it begins.
    pub fn failed(&self, d: Dependency, error: &dyn std::fmt::Display) {
        self.failed_at(d, Instant::now(), error);
    }

    /// Records that a request to `d` sent at `sent` failed with `error`. Logs the outage once,
    /// when it begins.
    ///
    /// A request sent before `d` last recovered (a push stuck in a stall that times out after
    /// the probe saw the end of it) does not begin a new outage.
    pub fn failed_at(&self, d: Dependency, sent: Instant, error: &dyn std::fmt::Display) {
        let state = self.dep(d);
        let mut changes = state.changes.lock().expect("not poisoned");
        let was_up = state.up.load(Ordering::Acquire);
        if !was_up && changes.since.is_some() {
            changes.failures += 1;
            return;
        }
        if was_up && changes.since.is_some_and(|since| sent < since) {
            return;
        }
        state.up.store(false, Ordering::Release);
        metrics::up(d.as_str(), false);
        changes.since = Some(Instant::now());
        changes.failures = 1;
        if was_up {
            tracing::warn!(dependency = d.as_str(), error = %error,
                "{} unavailable; retrying with backoff", d.as_str());
        } else {
            tracing::warn!(dependency = d.as_str(), error = %error,
                "{} not reachable yet; retrying with backoff", d.as_str());
        }
    }

    /// Records a transient error of a step begun at `sent` against the dependency it came from.
    pub fn failed_with_at(&self, e: &Error, sent: Instant) {
        if let Some(d) = Dependency::of(e) {
            self.failed_at(d, sent, e);
        } else {
            tracing::warn!(error = %e, "relay step failed");
        }
    }

    /// Whether `d` answered last time it was asked.
    pub fn is_up(&self, d: Dependency) -> bool {
        self.dep(d).up.load(Ordering::Acquire)
    }

    /// Records whether the outbox table is present.
    pub fn set_schema(&self, present: bool) {
        self.schema.store(present, Ordering::Release);
    }

    /// Ready: Postgres and Redis reachable and the schema present.
    pub fn is_ready(&self) -> bool {
        self.is_up(Dependency::Postgres)
            && self.is_up(Dependency::Redis)
            && self.schema.load(Ordering::Acquire)
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
mod tests {
    use super::*;

    fn later() -> Instant {
        std::thread::sleep(Duration::from_millis(2));
        Instant::now()
    }

    #[test]
    fn reports_about_requests_older_than_the_state_change_are_ignored() {
        let h = Health::default();
        let d = Dependency::Redis;
        h.ok(d);
        assert!(h.is_up(d));
        let sent_before_outage = later();
        h.failed_at(d, later(), &"down");
        assert!(!h.is_up(d));
        // A push that got through just before the outage does not end it.
        h.ok_at(d, sent_before_outage);
        assert!(!h.is_up(d));
        let sent_during_outage = later();
        h.ok_at(d, later());
        assert!(h.is_up(d));
        // A push stuck during the outage that fails after the recovery does not begin another.
        h.failed_at(d, sent_during_outage, &"timed out");
        assert!(h.is_up(d));
        h.failed_at(d, later(), &"down again");
        assert!(!h.is_up(d));
    }
}
