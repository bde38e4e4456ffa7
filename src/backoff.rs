//! Exponential backoff with jitter and a cap.

use std::time::Duration;

use rand::Rng;

/// Exponential backoff: `base`, doubling per failure up to `cap`, each delay drawn uniformly
/// from its upper half ("equal jitter") so that many relays that failed together do not retry
/// together, while no delay falls below half its nominal value.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    base: Duration,
    cap: Duration,
    failures: u32,
}

impl Backoff {
    /// The relay's reconnect backoff for Redis or Postgres outages: 100 ms doubling to 30 s.
    pub(crate) fn transient() -> Self {
        Backoff::new(Duration::from_millis(100), Duration::from_secs(30))
    }

    /// A backoff starting at `base` and never exceeding `cap`.
    pub(crate) fn new(base: Duration, cap: Duration) -> Self {
        Backoff {
            base,
            cap,
            failures: 0,
        }
    }

    /// The delay before the next try; counts one more failure.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let nominal = nominal(self.base, self.cap, self.failures);
        self.failures = self.failures.saturating_add(1);
        jitter(nominal)
    }

    /// Forgets the failures: the next delay is `base` again.
    pub(crate) fn reset(&mut self) {
        self.failures = 0;
    }

    /// Failures counted since the last reset.
    pub(crate) fn failures(&self) -> u32 {
        self.failures
    }
}

/// The delay before a job's next attempt after `attempts` failed ones (docs/guarantees.md#failure-classes): 1 s doubling,
/// capped at 5 minutes, with jitter.
pub(crate) fn per_job_delay(attempts: u32) -> Duration {
    jitter(nominal(
        Duration::from_secs(1),
        Duration::from_secs(300),
        attempts.saturating_sub(1),
    ))
}

fn nominal(base: Duration, cap: Duration, failures: u32) -> Duration {
    let factor = 1u32.checked_shl(failures.min(31)).unwrap_or(u32::MAX);
    base.saturating_mul(factor).min(cap)
}

fn jitter(d: Duration) -> Duration {
    let half = d / 2;
    half + rand::rng().random_range(Duration::ZERO..=half)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap_with_jitter() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(30));
        let mut nominal_ms = 100u64;
        for _ in 0..20 {
            let d = b.next_delay();
            assert!(
                d >= Duration::from_millis(nominal_ms / 2),
                "{d:?} < half of {nominal_ms}ms"
            );
            assert!(
                d <= Duration::from_millis(nominal_ms),
                "{d:?} > {nominal_ms}ms"
            );
            nominal_ms = (nominal_ms * 2).min(30_000);
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }

    #[test]
    fn per_job_delay_is_capped_at_five_minutes() {
        assert!(per_job_delay(1) <= Duration::from_secs(1));
        assert!(per_job_delay(3) >= Duration::from_secs(2));
        assert!(per_job_delay(3) <= Duration::from_secs(4));
        assert!(per_job_delay(1000) <= Duration::from_secs(300));
        assert!(per_job_delay(1000) >= Duration::from_secs(150));
    }
}
