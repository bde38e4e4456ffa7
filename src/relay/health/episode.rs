//! One dependency's episode: up or down, since when, why, and which reports may change it
//! (docs in the parent module).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::error::Reason;
use crate::telemetry::redact;

/// A `disk full` episode ends when the relay writes a row again (a hand-back, a dead letter),
/// or once Postgres has answered for this long without a write failing for lack of space. A
/// read, or a probe's tiny write into a page with room left, succeeds on a full disk: it ends
/// nothing. Longer than the workers' backoff cap (30 s), so that rows still failing to be
/// handed back fail again within it.
pub const DISK_FULL_QUIET: Duration = Duration::from_secs(60);

/// How long after the last failed push a Redis episode stays one that only a push can end.
/// Longer than the workers' longest backoff (30 s) and a push (`--push-timeout`, 5 s): while
/// rows wait, a push fails again well within it (the probe wakes the workers every second).
pub const PIN_WINDOW: Duration = Duration::from_secs(40);

#[derive(Debug, Default)]
pub(super) struct Episode {
    /// Starts false: nothing is "up" until it has answered once. Mirrors the state under
    /// `changes` for lock-free reads (readiness, `is_up`).
    pub(super) up: AtomicBool,
    pub(super) changes: Mutex<Changes>,
}

#[derive(Debug, Default)]
pub(super) struct Changes {
    /// When the current state (up, or down) began; None before the first report.
    pub(super) since: Option<Instant>,
    /// Failed tries in the current episode.
    pub(super) failures: u64,
    /// Why it is down (while down).
    pub(super) reason: Option<Reason>,
    /// When the last failed request of the episode was sent.
    pub(super) last_failed: Option<Instant>,
    /// The last error of the episode, free of secrets.
    pub(super) error: String,
    /// When a push last failed in this episode: until [`PIN_WINDOW`] after it, only a push
    /// ends it.
    pub(super) pinned: Option<Instant>,
    /// A check succeeded since the last failed push, and woke the workers.
    pub(super) nudged: bool,
}

/// Who reports: a push (a worker's batch) or a check (the probe, a connect).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Witness {
    Push,
    Check,
}

/// What a report changed.
pub(super) enum Change {
    /// Nothing to say.
    None,
    /// First answer ever.
    First,
    /// Down after being up; or down from the start.
    Began { was_up: bool },
    /// Up after an episode.
    Ended {
        lasted: Duration,
        failures: u64,
        reason: Reason,
    },
    /// A check succeeded during an episode only a push can end: let the workers try.
    Nudge,
}

impl Episode {
    /// An answer to a request sent at `sent` by `witness`; `wrote`: it wrote new rows (which
    /// needed room).
    pub(super) fn ok_at(&self, sent: Instant, witness: Witness, wrote: bool) -> Change {
        if self.up.load(Ordering::Acquire) {
            return Change::None;
        }
        let mut c = self.changes.lock().expect("not poisoned");
        if self.up.load(Ordering::Acquire) || c.since.is_some_and(|since| sent < since) {
            return Change::None;
        }
        if c.reason == Some(Reason::DiskFull)
            && !wrote
            && c.last_failed.is_some_and(|t| t.elapsed() < DISK_FULL_QUIET)
        {
            // Says nothing about the disk (docs/metrics.md#failure-reasons).
            return Change::None;
        }
        let pinned = c
            .pinned
            .is_some_and(|at| sent.saturating_duration_since(at) < PIN_WINDOW);
        if witness == Witness::Check && pinned {
            if c.nudged {
                return Change::None;
            }
            c.nudged = true;
            return Change::Nudge;
        }
        c.pinned = None;
        c.nudged = false;
        self.up.store(true, Ordering::Release);
        let change = match c.since {
            Some(since) => Change::Ended {
                lasted: since.elapsed(),
                failures: c.failures,
                reason: c.reason.unwrap_or(Reason::Other),
            },
            None => Change::First,
        };
        c.since = Some(Instant::now());
        c.failures = 0;
        c.reason = None;
        c.last_failed = None;
        change
    }

    /// `pin`: only a push may end the episode this failure begins or continues.
    pub(super) fn failed_at(
        &self,
        sent: Instant,
        reason: Reason,
        error: &dyn std::fmt::Display,
        pin: bool,
    ) -> Change {
        let mut c = self.changes.lock().expect("not poisoned");
        let was_up = self.up.load(Ordering::Acquire);
        if !was_up && c.since.is_some() {
            c.failures += 1;
            c.last_failed = c.last_failed.max(Some(sent));
            if c.reason == Some(Reason::LockWait) && reason == Reason::Timeout {
                // A claim that timed out waiting for the lock: still the lock wait, whose
                // holder the probe named.
                return Change::None;
            }
            c.reason = Some(reason);
            c.error = redact::scrub(&error.to_string()).into_owned();
            if pin {
                c.pinned = Some(sent.max(c.pinned.unwrap_or(sent)));
                c.nudged = false;
            }
            return Change::None;
        }
        if was_up && c.since.is_some_and(|since| sent < since) {
            return Change::None;
        }
        self.up.store(false, Ordering::Release);
        c.since = Some(Instant::now());
        c.failures = 1;
        c.last_failed = Some(sent);
        c.reason = Some(reason);
        c.error = redact::scrub(&error.to_string()).into_owned();
        c.pinned = pin.then_some(sent);
        c.nudged = false;
        Change::Began { was_up }
    }

    pub(super) fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// `reason (error)` while down.
    pub(super) fn why(&self) -> String {
        let c = self.changes.lock().expect("not poisoned");
        match c.reason {
            Some(r) if c.error.is_empty() => r.to_string(),
            // The line names the dependency already (`postgres: too many connections (...)`).
            Some(r) => format!("{r} ({})", crate::error::without_dependency(&c.error)),
            None => "not checked yet".to_owned(),
        }
    }
}
