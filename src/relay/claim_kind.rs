//! Which of the four claims a worker runs next (docs/guarantees.md#per-key-order).
//!
//! All four take rows in `id` order and keep each key's order; they differ in what they cost
//! Postgres to plan (every claim is planned anew unless `--prepared-statements`: an unnamed
//! statement, for PgBouncer) and in what they take of a key:
//!
//! - [`ClaimKind::Unkeyed`]: rows without an ordering key only, the cheapest to plan. Run while
//!   the claims see no keyed row at or above where they look.
//! - [`ClaimKind::Heads`]: any row, but a keyed row only at the head of its key: one row per
//!   key, each tested with one probe of the key's index. Planned in about half the time
//!   `Runs` takes more than `Unkeyed`, and cheaper to run when the keys of a batch are
//!   distinct and end there: a trickle of keyed rows, or thousands of keys of a row each.
//! - [`ClaimKind::Runs`]: any row, and a key's run of rows from its head in one claim (a hot
//!   key's thousand rows go in one script call). Run once a claim left rows of a key behind
//!   its head, and then while the claims see keyed rows: going back to heads between two
//!   workers' claims of one hot key made one-row batches (a drain of one key at a third of
//!   its rate).
//! - [`ClaimKind::Follow`]: key heads among the first rows (a window smaller than a batch),
//!   and each head's key followed through its index beyond the window, as far as its rows are
//!   claimable and free: one probe for a key's head, not one per row. Tried once a claim of
//!   heads came back full (a batch of distinct keys: thousands of interleaved keys, where
//!   heads would probe every row; a trickle never fills a batch), and run while a key's rows
//!   come in runs; the relay sizes the window from the runs it followed
//!   ([`follow_window`]). Where keys have one row each it would cost a look more per key than
//!   heads: it goes back to heads once the runs it follows are shorter than two rows, for
//!   [`FOLLOW_PAUSE`] claims at least.
//!
//! A claim that comes back empty says nothing of the rows (no row returns the flags): after
//! `Unkeyed` or `Follow` (whose small window may hold only rows waiting behind their keys'
//! heads), the next claim is `Heads`, at once, which leaves no row unclaimed; `Heads` and `Runs`
//! stay (a `Runs` claim comes back empty when every row it locked waits behind another
//! worker's rows of the same hot key).

/// The claim a worker runs ([`super::queries::Queries::claim_for`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ClaimKind {
    /// Rows without an ordering key only.
    Unkeyed,
    /// Any row; a keyed row only at the head of its key.
    Heads,
    /// Any row; a key's run of rows from its head.
    Runs,
    /// Any row of a window; a keyed row at the head of its key, followed by its key's next rows.
    Follow,
}

/// What a claim's rows said, for the choice of the next claim.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// No row came back.
    pub empty: bool,
    /// Keyed rows wait at or above where the claim looked (flag `keyed`).
    pub keyed: bool,
    /// The claim locked rows of a key behind the rows it took (flag `held`).
    pub held: bool,
    /// Heads: it came back full, a batch of distinct keys' heads, whose keys may go on beyond
    /// it (follow is tried). Follow: the runs it followed were two rows long or more, on
    /// average.
    pub runs_beyond: bool,
}

impl ClaimKind {
    /// Every claim.
    pub const ALL: [ClaimKind; 4] = [
        ClaimKind::Unkeyed,
        ClaimKind::Heads,
        ClaimKind::Runs,
        ClaimKind::Follow,
    ];

    /// The claim to run after this one saw `seen`.
    pub fn next(self, seen: Seen) -> ClaimKind {
        if seen.empty {
            // A claim of keyed rows stays: its rows may all have waited behind another
            // worker's (a hot key), and heads would probe each of them.
            // A follow claim's window may hold only rows behind other keys' heads (a row not
            // due, a row another worker holds): heads, over a whole batch, looks further.
            match self {
                ClaimKind::Unkeyed | ClaimKind::Follow => ClaimKind::Heads,
                kind => kind,
            }
        } else if !seen.keyed {
            ClaimKind::Unkeyed
        } else if self == ClaimKind::Follow && seen.runs_beyond {
            ClaimKind::Follow
        } else if seen.held || self == ClaimKind::Runs {
            ClaimKind::Runs
        } else if seen.runs_beyond {
            ClaimKind::Follow
        } else {
            ClaimKind::Heads
        }
    }

    /// The claim to run after this one saw `seen`, and the follow pause after it, `pause`
    /// being the pause before: [`ClaimKind::next`], but that a follow claim whose runs were
    /// shorter than two rows pauses follow for [`FOLLOW_PAUSE`] claims, during which a claim
    /// that would bring follow brings heads and counts one down.
    pub fn next_paused(self, seen: Seen, pause: u32) -> (ClaimKind, u32) {
        let next = self.next(seen);
        if self == ClaimKind::Follow && !seen.empty && !seen.runs_beyond {
            (next, FOLLOW_PAUSE)
        } else if next == ClaimKind::Follow && self != ClaimKind::Follow && pause > 0 {
            (ClaimKind::Heads, pause - 1)
        } else {
            (next, pause)
        }
    }

    /// As a `u8`, for an atomic.
    pub(crate) fn to_u8(self) -> u8 {
        self as u8
    }

    /// From [`ClaimKind::to_u8`].
    pub(crate) fn from_u8(n: u8) -> ClaimKind {
        match n {
            0 => ClaimKind::Unkeyed,
            1 => ClaimKind::Heads,
            2 => ClaimKind::Runs,
            _ => ClaimKind::Follow,
        }
    }
}

/// The window of the follow claim after one that took `taken` rows, `in_window` of them
/// within its window, for batches of `batch` rows: as many key heads as make a batch with the
/// runs just followed behind them.
pub fn follow_window(batch: usize, taken: usize, in_window: usize) -> usize {
    let batch = batch.max(1);
    if in_window == 0 {
        return batch;
    }
    // batch / (taken / in_window), rounded up.
    (batch * in_window)
        .div_ceil(taken.max(in_window))
        .clamp(1, batch)
}

/// After a follow claim whose runs were shorter than two rows, the claims of heads a worker
/// runs before it follows keys again, whatever they see: keys of one or two rows each would
/// otherwise bring a small follow claim after every claim of heads.
pub const FOLLOW_PAUSE: u32 = 16;

/// The window of a worker's first follow claim, for batches of `batch` rows: runs of 20
/// rows assumed until one is seen.
pub fn first_follow_window(batch: usize) -> usize {
    (batch / 20).max(1)
}

/// How many rows the follow claim takes behind each head of a `window`: at most a batch of
/// `batch` rows in all.
pub fn followed_per_head(batch: usize, window: usize) -> usize {
    (batch / window.max(1)).saturating_sub(1)
}

#[cfg(test)]
mod tests {
    use super::ClaimKind::{self, *};
    use super::Seen;

    fn seen(keyed: bool, held: bool) -> Seen {
        Seen {
            empty: false,
            keyed,
            held,
            runs_beyond: false,
        }
    }

    fn beyond(held: bool) -> Seen {
        Seen {
            runs_beyond: true,
            ..seen(true, held)
        }
    }

    #[test]
    fn an_empty_claim_leaves_no_row_behind_and_keeps_a_claim_of_runs() {
        let empty = Seen {
            empty: true,
            ..Seen::default()
        };
        assert_eq!(Unkeyed.next(empty), Heads);
        assert_eq!(Heads.next(empty), Heads);
        assert_eq!(Runs.next(empty), Runs);
        assert_eq!(Follow.next(empty), Heads);
    }

    #[test]
    fn without_keyed_rows_the_claim_is_the_unkeyed_one() {
        for kind in ClaimKind::ALL {
            assert_eq!(kind.next(seen(false, false)), Unkeyed, "{kind:?}");
        }
    }

    #[test]
    fn rows_left_behind_their_head_bring_runs_which_stays_while_keyed_rows_wait() {
        for kind in ClaimKind::ALL {
            assert_eq!(kind.next(seen(true, true)), Runs, "{kind:?}");
        }
        assert_eq!(Runs.next(seen(true, false)), Runs);
        // A claim of distinct keys, full or not, stays with heads.
        assert_eq!(Heads.next(seen(true, false)), Heads);
        assert_eq!(Unkeyed.next(seen(true, false)), Heads);
    }

    #[test]
    fn keys_going_on_beyond_a_claim_of_heads_bring_follow_while_it_follows_runs() {
        assert_eq!(Heads.next(beyond(false)), Follow);
        // A hot key within the claim: runs, which take it without a look per row.
        assert_eq!(Heads.next(beyond(true)), Runs);
        assert_eq!(Runs.next(beyond(false)), Runs);
        assert_eq!(Follow.next(beyond(false)), Follow);
        assert_eq!(Follow.next(beyond(true)), Follow);
        // Runs shorter than two rows: follow costs more than heads (runs when it left rows
        // behind their key's head, as every claim).
        assert_eq!(Follow.next(seen(true, false)), Heads);
    }

    #[test]
    fn the_window_makes_a_batch_of_the_runs_just_followed() {
        use super::{first_follow_window, follow_window, followed_per_head};
        // Runs of 20: 50 heads of 1,000 rows, each followed by 19 more at most.
        assert_eq!(follow_window(1000, 1000, 50), 50);
        assert_eq!(followed_per_head(1000, 50), 19);
        // Runs of one row: the whole batch is heads, followed by none (and the next claim is
        // heads).
        assert_eq!(follow_window(1000, 50, 50), 1000);
        assert_eq!(followed_per_head(1000, 1000), 0);
        // Runs of two.
        assert_eq!(follow_window(1000, 100, 50), 500);
        assert_eq!(followed_per_head(1000, 500), 1);
        // One hot key: one head, followed by the rest of a batch.
        assert_eq!(follow_window(1000, 1000, 1), 1);
        assert_eq!(followed_per_head(1000, 1), 999);
        // Nothing in the window taken: the whole batch.
        assert_eq!(follow_window(1000, 0, 0), 1000);
        assert_eq!(first_follow_window(1000), 50);
        assert_eq!(first_follow_window(10), 1);
        assert_eq!(follow_window(10, 10, 1), 1);
    }

    #[test]
    fn the_kind_survives_its_atomic() {
        for kind in ClaimKind::ALL {
            assert_eq!(ClaimKind::from_u8(kind.to_u8()), kind);
        }
    }
}
