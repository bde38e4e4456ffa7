//! What the workers are doing, as the wake-up lock sees it: when they last claimed rows (the
//! relay is awake), and whether one waits for a wake-up.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// How long after the last non-empty claim the relay stays awake.
pub const AWAKE_WINDOW: Duration = Duration::from_secs(1);

/// When the workers last claimed rows, how many of them wait for a wake-up, and when one last
/// polled while idle.
#[derive(Debug)]
pub struct Activity {
    base: Instant,
    /// Milliseconds since `base` of the last mark, plus one (0: never).
    last: AtomicU64,
    pub(super) changed: Notify,
    /// Workers between batches, waiting for a wake-up ([`Activity::waiting`]).
    waiting: AtomicUsize,
    /// A worker began to wait.
    pub(super) waiting_began: Notify,
    /// Milliseconds since `base` of the relay's last idle poll, plus one (0: never).
    idle_polled: AtomicU64,
    /// The newest wake-up a worker took ([`Activity::take_wake`]).
    woken: AtomicU64,
    /// A worker whose batch came back full asks for one more ([`Activity::recruit`]).
    recruited: Notify,
}

impl Default for Activity {
    fn default() -> Self {
        Activity {
            base: Instant::now(),
            last: AtomicU64::new(0),
            changed: Notify::new(),
            waiting: AtomicUsize::new(0),
            waiting_began: Notify::new(),
            idle_polled: AtomicU64::new(0),
            woken: AtomicU64::new(0),
            recruited: Notify::new(),
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

    /// A worker waits for a wake-up until the guard is dropped: the awake poll runs for it.
    pub fn waiting(&self) -> Waiting<'_> {
        self.waiting.fetch_add(1, Ordering::AcqRel);
        self.waiting_began.notify_one();
        Waiting(self)
    }

    /// A worker's idle wait of `interval` (`--poll-interval`) ran out with no wake-up: whether
    /// it should look for rows. One worker of the relay does, per interval; the others, whose
    /// waits run out at other moments of it, go back to waiting. Each look is a claim (a
    /// transaction, and a statement parsed and planned), and an idle fleet of 24 relays of 2
    /// workers spent most of its Postgres CPU on them. A backlog that arrives unannounced
    /// still draws every worker: the wake-up lock's poll wakes them once one claims rows, and
    /// without the lock, each idle worker's turn to look comes within an interval.
    pub fn take_idle_poll(&self, interval: Duration) -> bool {
        let now = self.base.elapsed().as_millis() as u64 + 1;
        let last = self.idle_polled.load(Ordering::Acquire);
        // A tenth of the interval's slack: the poller's own next wait ends a little more than
        // an interval after its last look began, never less.
        let recent = (interval.as_millis() as u64).saturating_mul(9) / 10;
        if last != 0 && now.saturating_sub(last) < recent {
            return false;
        }
        self.idle_polled
            .compare_exchange(last, now, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// A waiting worker saw wake-up `generation` (the wake channel's counter): whether it is
    /// the one to claim. One worker a wake-up: a claim looks at every claimable row, and the
    /// relay's other workers, woken with it, would each run a claim (parsed and planned) that
    /// finds the rows locked by the first. The wake-up lock's poll wakes a worker every
    /// millisecond while rows wait, so a backlog still draws every worker within a few.
    pub fn take_wake(&self, generation: u64) -> bool {
        self.woken.fetch_max(generation, Ordering::AcqRel) < generation
    }

    /// A worker's batch came back full (more rows wait): one more waiting worker claims
    /// ([`Activity::recruited`]), and so on while batches come back full. A backlog that
    /// arrives with one wake-up (a transaction of many rows, one notification) draws every
    /// worker within a few batches, also without the wake-up lock's poll (too few
    /// connections for it, or its session lost).
    pub fn recruit(&self) {
        self.recruited.notify_one();
    }

    /// Resolves when a worker asked for one more ([`Activity::recruit`]): one waiting worker.
    pub async fn recruited(&self) {
        self.recruited.notified().await;
    }

    /// Whether a worker waits for a wake-up.
    pub fn anyone_waiting(&self) -> bool {
        self.waiting.load(Ordering::Acquire) > 0
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

/// A worker waiting for a wake-up, from [`Activity::waiting`].
#[derive(Debug)]
pub struct Waiting<'a>(&'a Activity);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}
