//! Where a claim starts looking (docs/guarantees.md#where-a-claim-looks).
//!
//! A claim takes the lowest claimable ids. Walking the primary key from the lowest id costs
//! nothing extra while Postgres can clean up: the index entries of rows deleted by earlier
//! claims are marked dead the first time a scan passes them, or vacuumed away. While a long
//! transaction holds the xmin horizon neither happens, and every claim from the bottom walks
//! over every row ever claimed since that transaction began: the claim grows linearly with the
//! transaction's age (89 ms after 5 minutes at 1,500 rows/s).
//!
//! So a relay's claims start at a trailing **mark**: the highest id its claims took at least
//! [`TRAIL`] ago, or [`TRAIL_IDS`] below the last id taken, whichever is higher. Rows below the mark that become claimable later are rows that committed out
//! of id order more than [`TRAIL`] after a higher id was taken, rows handed back (a retry keeps
//! its id), rows a failed batch released, rows whose `available_at` was in the future, and
//! conveyor parents whose children have just gone. A **catch-up** finds them: a claim from
//! the lowest id, continued from its last id while it comes back full, due
//!
//! - [`FIRST_CATCH_UP`] after the previous one ended, or [`CATCH_UP_COST`] times as long as the
//!   previous one took, whichever is longer, but at most [`LAST_CATCH_UP`] after it: without a
//!   held horizon a catch-up costs what any claim costs and runs every second; with one, its
//!   share of the relay's time stays at most 1/[`CATCH_UP_COST`];
//! - at once after a batch handed rows back to be claimed at once (kept rows), and about
//!   [`FIRST_CATCH_UP`] after a batch handed rows back for a retry.
//!
//! A row below the mark is therefore found at the latest [`LAST_CATCH_UP`] plus one catch-up's
//! time after it became claimable (plus the poll interval, when the relay is idle). The mark
//! only narrows where a claim looks: a claim still locks with `FOR UPDATE SKIP LOCKED` and
//! deletes in the transaction that pushed, so no row is delivered twice because of it.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// How far behind its latest claims a relay's mark stays: a row that commits this long after
/// a higher id was taken is still found by the next plain claim.
pub const TRAIL: Duration = Duration::from_millis(250);
/// ... but at most this many ids behind the latest claim's last id: while a backlog drains at
/// 50,000 rows/s, a second's trail would be 50,000 index entries that every claim walks (dead
/// ones, which a held horizon keeps, cost a heap visit each).
pub const TRAIL_IDS: i64 = 10_000;
/// The shortest time between two catch-ups.
pub const FIRST_CATCH_UP: Duration = Duration::from_secs(1);
/// The longest time between two catch-ups.
pub const LAST_CATCH_UP: Duration = Duration::from_secs(60);
/// A catch-up that took `d` is followed by the next one after `CATCH_UP_COST * d` (bounded by
/// [`FIRST_CATCH_UP`] and [`LAST_CATCH_UP`]).
pub const CATCH_UP_COST: u32 = 100;

/// The lowest id a claim may ask for: a catch-up starts here.
pub const BOTTOM: i64 = i64::MIN;

/// One relay's claim cursor, shared by its workers.
#[derive(Debug)]
pub struct ClaimCursor {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// `(start, highest id taken)` of claims not yet [`TRAIL`] old, oldest first.
    recent: VecDeque<(Instant, i64)>,
    /// The highest id taken by a claim at least [`TRAIL`] old.
    mark: Option<i64>,
    /// While a catch-up is under way: where its next claim starts.
    catch_up_from: Option<i64>,
    /// A worker is running a catch-up claim.
    catching_up: bool,
    /// When the next catch-up is due.
    next_catch_up: Instant,
    /// The id ranges of the rows each unfinished turn's claim holds, by turn:
    /// [`Turn::holds`], [`ClaimCursor::held`].
    held: Vec<(u64, i64, i64)>,
    /// The number of the next turn.
    turns: u64,
}

impl Default for ClaimCursor {
    /// A fresh cursor: its first claim is a catch-up (from the lowest id).
    fn default() -> Self {
        ClaimCursor {
            state: Mutex::new(State {
                recent: VecDeque::new(),
                mark: None,
                catch_up_from: None,
                catching_up: false,
                next_catch_up: Instant::now(),
                held: Vec::new(),
                turns: 0,
            }),
        }
    }
}

/// One claim's leave: where it starts. Report how it went with [`Turn::finish`]; a turn
/// dropped without (the batch failed) lets another claim catch up.
#[derive(Debug)]
pub struct Turn<'a> {
    cursor: &'a ClaimCursor,
    /// Its number, for [`Turn::holds`].
    number: u64,
    started: Instant,
    /// The claim takes ids `>= from`.
    pub from: i64,
    /// The claim is (part of) a catch-up.
    pub catch_up: bool,
}

/// What a claim did, for [`Turn::finish`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Claimed {
    /// The highest id it took, if any.
    pub last_id: Option<i64>,
    /// It stopped at a limit (rows or bytes): more may wait right above `last_id`.
    pub full: bool,
    /// Some rows went back to the table claimable at once (a push cut short): the mark must
    /// not hide them.
    pub kept: bool,
    /// Some rows went back to the table for a retry.
    pub handed_back: bool,
    /// How long the claim statement took.
    pub took: Duration,
}

impl State {
    /// Turn `number`'s rows are no longer held ([`Turn::holds`]).
    fn release(&mut self, number: u64) {
        self.held.retain(|&(n, _, _)| n != number);
    }
}

impl ClaimCursor {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state stays consistent at every await-free step: a poisoned lock is still usable.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Where the next claim starts: a catch-up if one is due and no other worker runs one,
    /// otherwise just above the mark.
    pub fn start(&self) -> Turn<'_> {
        let now = Instant::now();
        let mut s = self.lock();
        s.turns += 1;
        let number = s.turns;
        let newest = s.recent.back().map(|&(_, id)| id);
        while let Some(&(at, id)) = s.recent.front() {
            let far = newest.is_some_and(|n| n.saturating_sub(id) >= TRAIL_IDS);
            if now.duration_since(at) < TRAIL && !far {
                break;
            }
            s.mark = Some(s.mark.map_or(id, |m| m.max(id)));
            s.recent.pop_front();
        }
        if !s.catching_up && (s.catch_up_from.is_some() || now >= s.next_catch_up) {
            s.catching_up = true;
            let from = s.catch_up_from.unwrap_or(BOTTOM);
            return Turn {
                cursor: self,
                number,
                started: now,
                from,
                catch_up: true,
            };
        }
        let from = s.mark.map_or(BOTTOM, |m| m.saturating_add(1));
        Turn {
            cursor: self,
            number,
            started: now,
            from,
            catch_up: false,
        }
    }

    /// The mark (for tests and benchmarks): claims start above it.
    pub fn mark(&self) -> Option<i64> {
        self.lock().mark
    }

    /// The id ranges of the rows the relay's claims hold until their batches end: the wake-up
    /// lock's poll looks past them ([`Turn::holds`]).
    pub fn held(&self) -> Vec<(i64, i64)> {
        self.lock()
            .held
            .iter()
            .map(|&(_, lo, hi)| (lo, hi))
            .collect()
    }

    /// Makes the next claim a catch-up.
    pub fn catch_up_now(&self) {
        self.lock().next_catch_up = Instant::now();
    }
}

impl Turn<'_> {
    /// The claim locked rows with ids from `lo` to `hi`, which stay locked (and, to any
    /// other snapshot, pending) until the batch ends: [`ClaimCursor::held`] until the turn is
    /// finished or dropped. The wake-up lock's poll looks past them: rows a batch of this
    /// relay is pushing are no reason to wake another worker, whose claim would skip them
    /// (each wake-up a claim parsed and planned for nothing, every millisecond of a steady
    /// stream). A row that commits within the range meanwhile, out of id order, is found by
    /// the next claim: the poll's after the batch, or one woken by a row above it.
    pub fn holds(&self, lo: i64, hi: i64) {
        let mut s = self.cursor.lock();
        s.release(self.number);
        s.held.push((self.number, lo, hi));
    }

    /// Records what the claim took (after its transaction committed).
    pub fn finish(self, claimed: Claimed) {
        let now = Instant::now();
        let mut s = self.cursor.lock();
        s.release(self.number);
        if let Some(last) = claimed.last_id {
            s.recent.push_back((self.started, last));
        }
        if self.catch_up {
            s.catching_up = false;
            match claimed.last_id {
                Some(last) if claimed.full && !claimed.kept => {
                    s.catch_up_from = Some(last.saturating_add(1));
                }
                Some(_) if claimed.kept => {
                    // Start this part again: the kept rows are below its last id.
                }
                _ => {
                    s.catch_up_from = None;
                    let pause = claimed
                        .took
                        .saturating_mul(CATCH_UP_COST)
                        .clamp(FIRST_CATCH_UP, LAST_CATCH_UP);
                    s.next_catch_up = now + pause;
                }
            }
        }
        if claimed.kept {
            s.next_catch_up = now;
        } else if claimed.handed_back {
            s.next_catch_up = s.next_catch_up.min(now + FIRST_CATCH_UP);
        }
        std::mem::forget(self);
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut s = self.cursor.lock();
        s.release(self.number);
        if self.catch_up {
            // The claim failed: the catch-up is still due, from where it was.
            s.catching_up = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn took(ms: u64) -> Claimed {
        Claimed {
            took: Duration::from_millis(ms),
            ..Claimed::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_claim_catches_up_and_the_mark_trails_the_claims() {
        let c = ClaimCursor::default();
        let t = c.start();
        assert!(t.catch_up);
        assert_eq!(t.from, BOTTOM);
        t.finish(Claimed {
            last_id: Some(100),
            ..took(1)
        });
        // Within TRAIL the claims still start at the bottom.
        let t = c.start();
        assert!(!t.catch_up);
        assert_eq!(t.from, BOTTOM);
        t.finish(Claimed {
            last_id: Some(200),
            ..took(1)
        });
        tokio::time::advance(TRAIL).await;
        // Both claims are TRAIL old now: claims start above them.
        let t = c.start();
        assert!(!t.catch_up);
        assert_eq!(t.from, 201);
        drop(t);
        assert_eq!(c.mark(), Some(200));
        // The catch-up comes FIRST_CATCH_UP after the first one ended.
        tokio::time::advance(FIRST_CATCH_UP - TRAIL).await;
        let t = c.start();
        assert!(t.catch_up);
        assert_eq!(t.from, BOTTOM);
        // A second worker meanwhile claims above the mark.
        let other = c.start();
        assert!(!other.catch_up);
        assert_eq!(other.from, 201);
        drop(other);
        t.finish(took(2));
    }

    #[tokio::test(start_paused = true)]
    async fn the_rows_a_turn_holds_are_held_until_it_ends() {
        let c = ClaimCursor::default();
        let (a, b) = (c.start(), c.start());
        a.holds(10, 20);
        b.holds(30, 40);
        assert_eq!(c.held(), vec![(10, 20), (30, 40)]);
        a.finish(Claimed {
            last_id: Some(20),
            ..took(1)
        });
        assert_eq!(c.held(), vec![(30, 40)]);
        // A failed batch's turn is dropped.
        drop(b);
        assert_eq!(c.held(), vec![]);
    }

    #[tokio::test(start_paused = true)]
    async fn while_a_backlog_drains_the_mark_trails_by_ids_not_a_second() {
        let c = ClaimCursor::default();
        c.start().finish(Claimed {
            last_id: Some(1_000),
            full: true,
            ..took(1)
        });
        for last in [2_000, 11_000, 12_000] {
            c.start().finish(Claimed {
                last_id: Some(last),
                full: true,
                ..took(1)
            });
        }
        // 12,000 - 2,000 >= TRAIL_IDS: the claims up to 2,000 are behind the mark already.
        let t = c.start();
        assert_eq!(c.mark(), Some(2_000));
        drop(t);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_catch_up_goes_on_from_its_last_id_and_a_failed_one_starts_again() {
        let c = ClaimCursor::default();
        let t = c.start();
        t.finish(Claimed {
            last_id: Some(1000),
            full: true,
            ..took(5)
        });
        let t = c.start();
        assert!(t.catch_up);
        assert_eq!(t.from, 1001);
        drop(t); // failed
        let t = c.start();
        assert!(t.catch_up);
        assert_eq!(t.from, 1001);
        // Rows kept by an interrupted push: the same part again.
        t.finish(Claimed {
            last_id: Some(2000),
            full: true,
            kept: true,
            ..took(5)
        });
        let t = c.start();
        assert!(t.catch_up);
        assert_eq!(t.from, 1001);
        t.finish(Claimed {
            last_id: Some(1500),
            ..took(5)
        });
        assert!(!c.start().catch_up);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_catch_up_comes_back_less_often_but_within_the_bound() {
        let c = ClaimCursor::default();
        c.start().finish(took(100));
        let pause = Duration::from_millis(100) * CATCH_UP_COST;
        tokio::time::advance(pause - Duration::from_millis(1)).await;
        assert!(!c.start().catch_up);
        tokio::time::advance(Duration::from_millis(1)).await;
        let t = c.start();
        assert!(t.catch_up);
        t.finish(took(10_000));
        tokio::time::advance(LAST_CATCH_UP - Duration::from_millis(1)).await;
        assert!(!c.start().catch_up);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(c.start().catch_up);
    }

    #[tokio::test(start_paused = true)]
    async fn rows_handed_back_bring_the_catch_up_forward() {
        let c = ClaimCursor::default();
        c.start().finish(took(1000)); // next catch-up in 50 s
        let t = c.start();
        assert!(!t.catch_up);
        t.finish(Claimed {
            last_id: Some(10),
            handed_back: true,
            ..took(1)
        });
        tokio::time::advance(FIRST_CATCH_UP).await;
        let t = c.start();
        assert!(t.catch_up);
        t.finish(took(1000));
        let t = c.start();
        assert!(!t.catch_up);
        t.finish(Claimed {
            last_id: Some(20),
            kept: true,
            ..took(1)
        });
        assert!(c.start().catch_up);
    }
}
