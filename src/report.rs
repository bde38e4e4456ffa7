//! What a batch, or a sweep, did.

use std::fmt;
use std::time::Duration;

use crate::error::{Dependency, Reason};
use crate::job::Outcome;

/// Counts of one or more batches.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Rows claimed.
    pub claimed: u64,
    /// Nothing was claimed because every claim slot (`--claim-slots`) was taken by other
    /// workers of the fleet: look again after the poll interval, not at every wake-up.
    pub no_slot: bool,
    /// The batch stopped at a limit (`--batch-size` rows or `--batch-max-bytes`): more rows
    /// may be waiting, claim again at once.
    pub more: bool,
    /// The highest id claimed (where the relay's claims go on: its claim cursor).
    pub last_id: Option<i64>,
    /// Jobs per outcome, indexed like [`Outcome::ALL`].
    pub outcomes: [u64; Outcome::ALL.len()],
    /// Jobs the script refused (per-job failures); their rows were kept for a retry or
    /// dead-lettered at `--max-attempts`.
    pub refused: u64,
    /// Rows that can never become a valid job (permanent failures).
    pub invalid: u64,
    /// Rows moved to the dead-letter table.
    pub dead_lettered: u64,
    /// Rows whose push Redis did not acknowledge while it acknowledged others of the batch:
    /// kept untouched (attempts unchanged) for the next batch.
    pub kept: u64,
    /// Rows handed back untouched (attempts unchanged) behind an earlier row of their ordering
    /// key that did not go in this batch (docs/guarantees.md#per-key-order).
    pub held: u64,
    /// The claim locked rows it left for a later claim: rows of a key whose earlier row was
    /// pending outside the claim (another worker's, backing off, not due) or dead-lettered.
    pub passed_over: bool,
    /// Why some rows were kept: the failure that interrupted the push. The batch committed
    /// what Redis acknowledged; the relay backs off as after a transient failure.
    pub interrupted: Option<Interruption>,
    /// Rows this batch wrote anew: handed back to the outbox (refused, kept) or moved to the
    /// dead-letter table. Writes that needed room: they end a `disk full` episode.
    pub handed_back: u64,
    /// Why the rows that failed could not be handed back (a full disk, say): the batch was
    /// rolled back, and the rows whose jobs Redis acknowledged were deleted on their own
    /// (counted as delivered); the others are pending again as they were, counted in `kept`.
    pub unsettled: Option<Interruption>,
    /// Where the time went (summed over batches): for benchmarks and profiling.
    pub stages: StageTimes,
}

/// A transient failure in the middle of a batch's push.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interruption {
    /// The dependency that failed.
    pub dependency: Dependency,
    /// Why.
    pub reason: Reason,
    /// The error, as text.
    pub error: String,
}

impl fmt::Display for Interruption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.error)
    }
}

/// Time spent per stage of a batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StageTimes {
    /// BEGIN (including acquiring a pooled connection).
    pub begin: Duration,
    /// The claim statement (DELETE ... RETURNING), rows decoded.
    pub claim: Duration,
    /// Building the jobs and the Redis push, results checked.
    pub push: Duration,
    /// Handing failed rows back or to the dead letters.
    pub settle: Duration,
    /// COMMIT.
    pub commit: Duration,
}

impl Report {
    /// Jobs with this outcome.
    pub fn outcome(&self, o: Outcome) -> u64 {
        self.outcomes[o.index()]
    }

    /// Rows whose job reached Redis or was already there (their rows were deleted).
    pub fn delivered(&self) -> u64 {
        self.outcomes.iter().sum()
    }

    /// Rows not delivered by this run: refused or invalid.
    pub fn failed(&self) -> u64 {
        self.refused + self.invalid
    }

    /// Adds another report's counts to this one.
    pub fn add(&mut self, other: &Report) {
        self.claimed += other.claimed;
        self.more = other.more;
        self.last_id = self.last_id.max(other.last_id);
        for (a, b) in self.outcomes.iter_mut().zip(other.outcomes) {
            *a += b;
        }
        self.refused += other.refused;
        self.invalid += other.invalid;
        self.dead_lettered += other.dead_lettered;
        self.kept += other.kept;
        self.held += other.held;
        self.passed_over |= other.passed_over;
        if other.interrupted.is_some() {
            self.interrupted.clone_from(&other.interrupted);
        }
        self.handed_back += other.handed_back;
        if other.unsettled.is_some() {
            self.unsettled.clone_from(&other.unsettled);
        }
        self.stages.begin += other.stages.begin;
        self.stages.claim += other.stages.claim;
        self.stages.push += other.stages.push;
        self.stages.settle += other.stages.settle;
        self.stages.commit += other.stages.commit;
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "claimed={}", self.claimed)?;
        for o in Outcome::ALL {
            if o == Outcome::Late && self.outcome(o) == 0 {
                // Only the conveyor layout has late jobs; the line stays as it was otherwise.
                continue;
            }
            let name = if o == Outcome::Duplicate {
                "duplicates"
            } else {
                o.as_str()
            };
            write!(f, " {name}={}", self.outcome(o))?;
        }
        write!(
            f,
            " failed={} dead_lettered={}",
            self.failed(),
            self.dead_lettered
        )?;
        if self.kept > 0 {
            write!(f, " kept={}", self.kept)?;
        }
        if self.held > 0 {
            write!(f, " held={}", self.held)?;
        }
        Ok(())
    }
}
