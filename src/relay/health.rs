//! What the relay knows about its dependencies, shared by workers, probes and metrics.
//!
//! Workers and the probe task report successes and failures here; the first failure after a
//! success logs the outage once, and the first success after it logs the recovery once.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

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
    /// Starts false: nothing is "up" until it has answered once.
    up: AtomicBool,
    /// When the current outage began (None while up, or before the first answer).
    down_since: Mutex<Option<(Instant, u64)>>,
}

/// Shared health state of one relay process.
#[derive(Debug, Default)]
pub struct Health {
    postgres: DepState,
    redis: DepState,
    schema: AtomicBool,
    heartbeat_ms: AtomicU64,
}

impl Health {
    fn dep(&self, d: Dependency) -> &DepState {
        match d {
            Dependency::Postgres => &self.postgres,
            Dependency::Redis => &self.redis,
        }
    }

    /// Records that `d` answered. Logs the recovery if it was down.
    pub fn ok(&self, d: Dependency) {
        let state = self.dep(d);
        if !state.up.swap(true, Ordering::AcqRel) {
            metrics::up(d.as_str(), true);
            let outage = state.down_since.lock().expect("not poisoned").take();
            match outage {
                Some((since, failures)) => tracing::info!(
                    dependency = d.as_str(),
                    outage_seconds = since.elapsed().as_secs_f64(),
                    failed_tries = failures,
                    "{} recovered", d.as_str()
                ),
                None => tracing::info!(dependency = d.as_str(), "{} connected", d.as_str()),
            }
        }
    }

    /// Records that `d` failed with `error`. Logs the outage once, when it begins.
    pub fn failed(&self, d: Dependency, error: &dyn std::fmt::Display) {
        let state = self.dep(d);
        let was_up = state.up.swap(false, Ordering::AcqRel);
        let mut down = state.down_since.lock().expect("not poisoned");
        match down.as_mut() {
            Some((_, failures)) => *failures += 1,
            None => {
                *down = Some((Instant::now(), 1));
                metrics::up(d.as_str(), false);
                if was_up {
                    tracing::warn!(dependency = d.as_str(), error = %error,
                        "{} unavailable; retrying with backoff", d.as_str());
                } else {
                    tracing::warn!(dependency = d.as_str(), error = %error,
                        "{} not reachable yet; retrying with backoff", d.as_str());
                }
            }
        }
    }

    /// Records a transient error against the dependency it came from.
    pub fn failed_with(&self, e: &Error) {
        if let Some(d) = Dependency::of(e) {
            self.failed(d, e);
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
