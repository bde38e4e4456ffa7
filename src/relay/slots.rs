//! The relay's view of the fleet's claim slots, shared by its workers.
//!
//! A claim needs one of `--claim-slots` advisory locks (see [`super::Queries::claim`]). While a
//! fleet drains a backlog, the slots are busy and most workers find none. Without this gate
//! every one of them would ask again and again, each ask a transaction; with it, one worker per
//! relay (the scout) asks, after a wait that starts at [`FIRST_WAIT`] and doubles up to the poll
//! interval, while the relay's other workers sit still. When the scout gets a slot, the others
//! are released at once: another slot may be free too.
//!
//! A worker whose batch held a slot and came back full keeps its **turn**: its next claim goes
//! at once, whatever the gate says, and its success releases nobody. While a fleet drains a
//! backlog, the slots' holders thus claim back to back and the other workers ask at the
//! scout's pace. Releasing every waiting worker at each of a holder's batches instead sent
//! the relay's other workers to ask for a slot after every batch, all of them in vain: a
//! transaction each, for nothing (measured in the fleet benchmark, 6 relays x 4 workers).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The first wait after finding every slot taken (a slot taken by another relay's idle poll is
/// free again within a millisecond); it doubles while that goes on, up to the poll interval.
pub(crate) const FIRST_WAIT: Duration = Duration::from_millis(25);

/// Shared by the workers of one relay.
#[derive(Debug)]
pub(crate) struct SlotGate {
    base: Instant,
    /// Milliseconds since `base` until which no worker of this relay asks for a slot; 0: open.
    closed_until: AtomicU64,
    /// The current wait, in milliseconds.
    wait_ms: AtomicU64,
    /// A worker is out asking while the gate is closed.
    scouting: AtomicBool,
    opened: Notify,
}

impl Default for SlotGate {
    fn default() -> Self {
        SlotGate {
            base: Instant::now(),
            closed_until: AtomicU64::new(0),
            wait_ms: AtomicU64::new(FIRST_WAIT.as_millis() as u64),
            scouting: AtomicBool::new(false),
            opened: Notify::new(),
        }
    }
}

impl SlotGate {
    fn now_ms(&self) -> u64 {
        self.base.elapsed().as_millis() as u64 + 1
    }

    /// Whether a worker is kept from asking now.
    #[cfg(test)]
    pub(crate) fn is_closed(&self) -> bool {
        self.closed_until.load(Ordering::Acquire) != 0
    }

    /// Waits until this worker may claim: at once while the gate is open or when `turn` (its
    /// last batch held a slot and came back full); otherwise once the wait is over and no
    /// other worker of the relay is asking, or when the gate opens. `None` if `shutdown` fired
    /// first. Report the claim's answer on the [`Pass`]; a pass dropped without an answer (the
    /// batch failed or panicked) lets another worker ask.
    pub(crate) async fn admit(&self, shutdown: &CancellationToken, turn: bool) -> Option<Pass<'_>> {
        if turn {
            return Some(Pass {
                gate: self,
                scout: false,
            });
        }
        loop {
            let opened = self.opened.notified();
            tokio::pin!(opened);
            opened.as_mut().enable();
            let until = self.closed_until.load(Ordering::Acquire);
            if until == 0 {
                return Some(Pass {
                    gate: self,
                    scout: false,
                });
            }
            let now = self.now_ms();
            let pause = if now >= until {
                if self
                    .scouting
                    .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    return Some(Pass {
                        gate: self,
                        scout: true,
                    });
                }
                // Another worker is asking; its answer opens or re-closes the gate.
                Duration::from_millis(self.wait_ms.load(Ordering::Acquire))
            } else {
                Duration::from_millis(until - now)
            };
            tokio::select! {
                _ = shutdown.cancelled() => return None,
                _ = &mut opened => {}
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }
}

/// Leave to claim once, from [`SlotGate::admit`].
#[derive(Debug)]
pub(crate) struct Pass<'a> {
    gate: &'a SlotGate,
    scout: bool,
}

impl Pass<'_> {
    /// Every slot was taken: close the gate for the current wait, and double the wait (up to
    /// `longest`) for the next time.
    pub(crate) fn none_free(self, longest: Duration) {
        let gate = self.gate;
        let wait = gate.wait_ms.load(Ordering::Acquire);
        let next = (wait * 2).min(longest.as_millis().max(1) as u64);
        gate.wait_ms.store(next.max(1), Ordering::Release);
        gate.closed_until
            .store(gate.now_ms() + wait, Ordering::Release);
    }

    /// The claim held a slot. A scout's slot opens the gate and releases the relay's waiting
    /// workers at once (another slot may be free too); any other worker's slot is the one it
    /// was admitted for, and says nothing about the others.
    pub(crate) fn got_one(self) {
        let gate = self.gate;
        if self.scout && gate.closed_until.swap(0, Ordering::AcqRel) != 0 {
            gate.wait_ms
                .store(FIRST_WAIT.as_millis() as u64, Ordering::Release);
            gate.opened.notify_waiters();
        }
    }
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        if self.scout {
            self.gate.scouting.store(false, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test(start_paused = true)]
    async fn one_worker_asks_while_the_others_wait_and_a_slot_releases_them() {
        let gate = Arc::new(SlotGate::default());
        let stop = CancellationToken::new();
        let pass = gate
            .admit(&stop, false)
            .await
            .expect("an open gate admits at once");
        pass.none_free(Duration::from_secs(1));
        assert!(gate.is_closed());

        let started = tokio::time::Instant::now();
        let scout = gate
            .admit(&stop, false)
            .await
            .expect("the scout is admitted after the wait");
        assert!(started.elapsed() >= FIRST_WAIT);

        // While the scout asks, a second worker waits, however long.
        let other = {
            let (gate, stop) = (gate.clone(), stop.clone());
            tokio::spawn(async move { gate.admit(&stop, false).await.is_some() })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(
            !other.is_finished(),
            "a second worker asked while the scout did"
        );

        // The scout gets a slot: the gate opens and the other worker goes at once.
        scout.got_one();
        let waited = tokio::time::Instant::now();
        assert!(other.await.unwrap());
        assert!(waited.elapsed() < Duration::from_millis(1));
        assert!(!gate.is_closed());
    }

    #[tokio::test(start_paused = true)]
    async fn the_wait_doubles_up_to_the_poll_interval_and_resets_when_a_slot_is_found() {
        let gate = SlotGate::default();
        let stop = CancellationToken::new();
        let mut waits = Vec::new();
        let mut pass = gate.admit(&stop, false).await.unwrap();
        for _ in 0..7 {
            pass.none_free(Duration::from_millis(300));
            let started = tokio::time::Instant::now();
            pass = gate.admit(&stop, false).await.unwrap();
            waits.push(started.elapsed().as_millis());
        }
        assert_eq!(waits, [25, 50, 100, 200, 300, 300, 300]);
        pass.got_one();
        gate.admit(&stop, false)
            .await
            .unwrap()
            .none_free(Duration::from_millis(300));
        let started = tokio::time::Instant::now();
        gate.admit(&stop, false).await.unwrap();
        assert_eq!(started.elapsed().as_millis(), 25);
    }

    #[tokio::test(start_paused = true)]
    async fn a_worker_with_its_turn_passes_a_closed_gate_and_releases_nobody() {
        let gate = Arc::new(SlotGate::default());
        let stop = CancellationToken::new();
        // Worker 1 holds a slot; worker 2 found none and closed the gate.
        let holder = gate.admit(&stop, false).await.unwrap();
        gate.admit(&stop, false)
            .await
            .unwrap()
            .none_free(Duration::from_secs(1));
        holder.got_one();
        assert!(gate.is_closed(), "a holder's slot opened the gate");
        // Its next claim goes at once, through the closed gate.
        let started = tokio::time::Instant::now();
        let holder = gate.admit(&stop, true).await.unwrap();
        assert_eq!(started.elapsed(), Duration::ZERO);
        // Worker 2 waits for the scout's pace, not for the holder's batches.
        let other = {
            let (gate, stop) = (gate.clone(), stop.clone());
            tokio::spawn(async move { gate.admit(&stop, false).await.map(|p| p.scout) })
        };
        tokio::time::sleep(Duration::from_millis(1)).await;
        holder.got_one();
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(!other.is_finished(), "the holder's batch released a waiter");
        assert_eq!(other.await.unwrap(), Some(true));
        assert!(started.elapsed() >= FIRST_WAIT);
    }

    #[tokio::test(start_paused = true)]
    async fn a_scout_whose_batch_failed_lets_another_worker_ask() {
        let gate = SlotGate::default();
        let stop = CancellationToken::new();
        gate.admit(&stop, false)
            .await
            .unwrap()
            .none_free(Duration::from_secs(1));
        let scout = gate.admit(&stop, false).await.unwrap();
        let started = tokio::time::Instant::now();
        let waiting = tokio::time::timeout(Duration::from_secs(1), gate.admit(&stop, false)).await;
        assert!(
            waiting.is_err(),
            "a second worker asked while the scout did"
        );
        drop(scout); // its batch failed (or panicked) without an answer
        let second = gate.admit(&stop, false).await;
        assert!(second.is_some());
        assert!(started.elapsed() < Duration::from_millis(1100));
        drop(second);
        stop.cancel();
        assert!(gate.is_closed());
    }
}
