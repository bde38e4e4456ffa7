//! Which of the three claims a worker runs next (docs/guarantees.md#per-key-order).
//!
//! All three take rows in `id` order and keep each key's order; they differ in what they cost
//! Postgres to plan (every claim is planned anew unless `--prepared-statements`: an unnamed
//! statement, for PgBouncer) and in what they take of a key:
//!
//! - [`ClaimKind::Unkeyed`]: rows without an ordering key only, the cheapest to plan. Run while
//!   the claims see no keyed row at or above where they look.
//! - [`ClaimKind::Heads`]: any row, but a keyed row only at the head of its key: one row per
//!   key, each tested with one probe of the key's index. Planned in about half the time
//!   `Runs` takes more than `Unkeyed`, and cheaper to run when the keys of a batch are
//!   distinct: a trickle of keyed rows, or thousands of interleaved keys.
//! - [`ClaimKind::Runs`]: any row, and a key's run of rows from its head in one claim (a hot
//!   key's thousand rows go in one script call). Run once a claim left rows of a key behind
//!   its head, and then while the claims see keyed rows: going back to heads between two
//!   workers' claims of one hot key made one-row batches (a drain of one key at a third of
//!   its rate).
//!
//! A claim that comes back empty says nothing of the rows (no row returns the flags): after
//! `Unkeyed`, the next claim is `Heads`, which leaves no row unclaimed; `Heads` and `Runs`
//! stay (a `Runs` claim comes back empty when every row it locked waits behind another
//! worker's rows of the same hot key).

/// The claim a worker runs ([`super::queries::Queries::claim_for`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaimKind {
    /// Rows without an ordering key only.
    Unkeyed,
    /// Any row; a keyed row only at the head of its key.
    Heads,
    /// Any row; a key's run of rows from its head.
    Runs,
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
}

impl ClaimKind {
    /// Every claim.
    pub const ALL: [ClaimKind; 3] = [ClaimKind::Unkeyed, ClaimKind::Heads, ClaimKind::Runs];

    /// The claim to run after this one saw `seen`.
    pub fn next(self, seen: Seen) -> ClaimKind {
        if seen.empty {
            // A claim of keyed rows stays: its rows may all have waited behind another
            // worker's (a hot key), and heads would probe each of them.
            match self {
                ClaimKind::Unkeyed => ClaimKind::Heads,
                kind => kind,
            }
        } else if !seen.keyed {
            ClaimKind::Unkeyed
        } else if seen.held || self == ClaimKind::Runs {
            ClaimKind::Runs
        } else {
            ClaimKind::Heads
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
            _ => ClaimKind::Runs,
        }
    }
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
    fn the_kind_survives_its_atomic() {
        for kind in ClaimKind::ALL {
            assert_eq!(ClaimKind::from_u8(kind.to_u8()), kind);
        }
    }
}
