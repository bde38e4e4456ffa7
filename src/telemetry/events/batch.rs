//! What a batch did: its jobs' outcomes and failures, the rows it moved to the dead letters,
//! its duration.

use std::fmt::Display;
use std::time::Duration;

use uuid::Uuid;

use super::Event;
use crate::error::{Error, ErrorClass, Reason};
use crate::job::Outcome;
use crate::report::Report;
use crate::telemetry::{metrics, redact};

/// Failed jobs by kind and reason: the labels of `jobrelay_job_failures_total`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Failures {
    counts: [[u64; Reason::ALL.len()]; ErrorClass::ALL.len()],
}

impl Failures {
    /// Counts `n` failures of `kind` for `reason`.
    pub fn add(&mut self, kind: ErrorClass, reason: Reason, n: u64) {
        self.counts[kind.index()][reason.index()] += n;
    }

    /// Failures of `kind`, whatever their reason.
    pub fn of_kind(&self, kind: ErrorClass) -> u64 {
        self.counts[kind.index()].iter().sum()
    }

    /// `(kind, reason, count)` for every count that is not zero.
    pub fn iter(&self) -> impl Iterator<Item = (ErrorClass, Reason, u64)> + '_ {
        ErrorClass::ALL
            .iter()
            .zip(&self.counts)
            .flat_map(|(k, counts)| {
                Reason::ALL
                    .iter()
                    .zip(counts)
                    .filter(|(_, n)| **n > 0)
                    .map(move |(r, n)| (*k, *r, *n))
            })
    }
}

/// Redis answered a batch's push: every job has an outcome or a failure. Counts the outcomes
/// (`jobrelay_jobs_relayed_total`; `late` jobs are counted by [`LateJob`]) and the failures
/// (`jobrelay_job_failures_total{kind, reason}`); when Redis refused jobs (per-job failures),
/// logs WARN `jobs refused by redis; kept for retry` once for the batch.
#[derive(Debug)]
pub struct BatchAnswered<'a> {
    /// Jobs per outcome, indexed like [`Outcome::ALL`].
    pub outcomes: &'a [u64; Outcome::ALL.len()],
    /// The batch's failed jobs, rows that never became jobs included.
    pub failures: &'a Failures,
    /// The first refusal's error (per-job failures), for the log line.
    pub first_refusal: Option<&'a str>,
}

impl Event for BatchAnswered<'_> {
    fn emit(self) {
        for o in Outcome::ALL.into_iter().filter(|o| *o != Outcome::Late) {
            metrics::relayed(o, self.outcomes[o.index()]);
        }
        for (kind, reason, n) in self.failures.iter() {
            metrics::failures(kind, reason, n);
        }
        let refused = self.failures.of_kind(ErrorClass::PerJob);
        if refused > 0 {
            tracing::warn!(
                refused,
                first_error = self.first_refusal.unwrap_or_default(),
                "jobs refused by redis; kept for retry"
            );
        }
    }
}

/// A batch's push failed as a whole: nothing was acknowledged and every row is kept, so every
/// job of it is a transient failure with the error's reason, or a config one when a
/// configuration error refused the push (Redis's eviction policy). No log line: the failure is
/// the dependency's, whose episode [`crate::relay::health`] logs once.
#[derive(Debug)]
pub struct PushFailed<'a> {
    /// Jobs the push carried.
    pub jobs: u64,
    /// Why it failed.
    pub error: &'a Error,
}

impl Event for PushFailed<'_> {
    fn emit(self) {
        let kind = match self.error.class() {
            ErrorClass::Config => ErrorClass::Config,
            _ => ErrorClass::Transient,
        };
        metrics::failures(kind, self.error.reason(), self.jobs);
    }
}

/// Redis answered one job with an outcome: its relay lag. No log line (one per job).
#[derive(Debug)]
pub struct JobAnswered {
    /// From the row's `created_at` to the answer, in seconds.
    pub lag_seconds: f64,
}

impl Event for JobAnswered {
    fn emit(self) {
        metrics::relay_lag(self.lag_seconds);
    }
}

/// Conveyor layout: a job whose parent or predecessor had already finished, relayed as a job
/// of its own (WARN, and `outcome="late"`).
#[derive(Debug)]
pub struct LateJob {
    /// The job.
    pub uuid: Uuid,
    /// Its row's id.
    pub id: i64,
    /// Its parent, if it named one.
    pub parent: Option<Uuid>,
    /// Its predecessor, if it named one.
    pub predecessor: Option<Uuid>,
}

impl Event for LateJob {
    fn emit(self) {
        let name = |u: Option<Uuid>| u.map(|u| u.to_string()).unwrap_or_default();
        tracing::warn!(uuid = %self.uuid, id = self.id,
            parent = name(self.parent),
            predecessor = name(self.predecessor),
            "late job: its parent or predecessor had already finished; \
             relayed as a job of its own");
        metrics::relayed(Outcome::Late, 1);
    }
}

/// Conveyor layout: the housekeeping found jobs whose parent or predecessor closed while they
/// were pushed, and relayed them as jobs of their own (WARN, and `outcome="late"`).
#[derive(Debug)]
pub struct LateJobsRepaired {
    /// How many.
    pub jobs: u64,
}

impl Event for LateJobsRepaired {
    fn emit(self) {
        if self.jobs == 0 {
            return;
        }
        tracing::warn!(
            jobs = self.jobs,
            "late jobs: their parent or predecessor closed while they were pushed; relayed as jobs of their own"
        );
        metrics::relayed(Outcome::Late, self.jobs);
    }
}

/// Rows named one by one in [`RowsDeadLettered`]'s `jobs`; the rest are counted.
pub const DEAD_ROWS_NAMED: usize = 10;

/// Characters of one row's reason in [`RowsDeadLettered`]'s `jobs`; a longer one is cut
/// (ending in `...`).
pub const DEAD_REASON_CHARS: usize = 300;

/// One dead-lettered row: its uuid, its id, why.
#[derive(Debug)]
pub struct DeadRow<'a> {
    /// The job's uuid.
    pub uuid: Uuid,
    /// The row's id (kept in the dead-letter table: `dead-letter requeue --id`).
    pub id: i64,
    /// Why it was dead-lettered (its last error).
    pub error: &'a str,
}

/// Failed rows moved to the dead-letter table (WARN, `jobrelay_jobs_dead_lettered_total`):
/// `rows`, and `jobs` naming each of the first [`DEAD_ROWS_NAMED`] rows
/// (`<uuid> (id <id>): <error>`, the error cut at [`DEAD_REASON_CHARS`], separated by `; `),
/// then `and N more`.
#[derive(Debug)]
pub struct RowsDeadLettered<'a> {
    /// How many.
    pub rows: u64,
    /// The first ones, in the order they were moved (only the first [`DEAD_ROWS_NAMED`] are
    /// named).
    pub first: &'a [DeadRow<'a>],
}

impl RowsDeadLettered<'_> {
    /// The `jobs` field.
    fn jobs(&self) -> String {
        let mut named: Vec<String> = self
            .first
            .iter()
            .take(DEAD_ROWS_NAMED)
            .map(|r| {
                let mut error: String = r.error.chars().take(DEAD_REASON_CHARS).collect();
                if r.error.chars().nth(DEAD_REASON_CHARS).is_some() {
                    error.push_str("...");
                }
                format!("{} (id {}): {error}", r.uuid, r.id)
            })
            .collect();
        let more = self.rows.saturating_sub(named.len() as u64);
        if more > 0 {
            named.push(format!("and {more} more"));
        }
        named.join("; ")
    }
}

impl Event for RowsDeadLettered<'_> {
    fn emit(self) {
        metrics::dead_lettered(self.rows);
        tracing::warn!(rows = self.rows, jobs = %self.jobs(),
            "rows moved to the dead-letter table");
    }
}

/// Rows over `--max-job-size` that the claim moved to the dead-letter table, once the batch
/// committed them (WARN, `jobrelay_jobs_dead_lettered_total`).
#[derive(Debug)]
pub struct OversizeRowsDeadLettered {
    /// How many.
    pub rows: u64,
    /// The first one's id.
    pub first_id: i64,
    /// The first one's uuid.
    pub first_uuid: Uuid,
    /// `--max-job-size`.
    pub max_job_bytes: usize,
}

impl Event for OversizeRowsDeadLettered {
    fn emit(self) {
        metrics::dead_lettered(self.rows);
        tracing::warn!(rows = self.rows, first_id = self.first_id, first_uuid = %self.first_uuid,
            max_job_bytes = self.max_job_bytes,
            "rows over --max-job-size moved to the dead-letter table");
    }
}

/// A batch that claimed rows committed (`jobrelay_batch_duration_seconds`; DEBUG `batch
/// committed` with its counts).
#[derive(Debug)]
pub struct BatchCommitted<'a> {
    /// What it did.
    pub report: &'a Report,
    /// From its start (a connection acquired) to its commit.
    pub duration: Duration,
}

impl Event for BatchCommitted<'_> {
    fn emit(self) {
        metrics::batch_duration(self.duration);
        let report = self.report;
        tracing::debug!(
            claimed = report.claimed,
            queued = report.outcome(Outcome::Queued),
            scheduled = report.outcome(Outcome::Scheduled),
            children = report.outcome(Outcome::Children),
            on_complete = report.outcome(Outcome::OnComplete),
            duplicates = report.outcome(Outcome::Duplicate),
            refused = report.refused,
            invalid = report.invalid,
            dead_lettered = report.dead_lettered,
            kept = report.kept,
            held = report.held,
            passed_over = report.passed_over,
            claim_ms = report.stages.claim.as_secs_f64() * 1000.0,
            "batch committed"
        );
    }
}

/// A batch whose failed rows could not be handed back was rolled back, and the rows whose jobs
/// Redis acknowledged were deleted on their own (`jobrelay_batch_duration_seconds`; DEBUG).
pub struct BatchSettledApart<'a> {
    /// Rows whose jobs Redis acknowledged.
    pub acknowledged: usize,
    /// Of those, rows deleted (the others another worker had claimed meanwhile).
    pub deleted: u64,
    /// Rows left pending as they were.
    pub not_handed_back: u64,
    /// Why the hand-back failed.
    pub error: &'a dyn Display,
    /// From the batch's start to the end of the deletes.
    pub duration: Duration,
}

impl Event for BatchSettledApart<'_> {
    fn emit(self) {
        metrics::batch_duration(self.duration);
        tracing::debug!(acknowledged = self.acknowledged, deleted = self.deleted,
            not_handed_back = self.not_handed_back,
            error = %redact::scrub(&self.error.to_string()),
            "hand-back failed: the acknowledged rows deleted on their own, the rest left pending as they were");
    }
}

#[cfg(test)]
mod dead_rows_tests {
    use super::*;

    #[test]
    fn the_dead_rows_are_named_up_to_the_bound_then_counted() {
        let long = "x".repeat(DEAD_REASON_CHARS + 5);
        let first: Vec<DeadRow<'_>> = (0..DEAD_ROWS_NAMED as i64)
            .map(|id| DeadRow {
                uuid: Uuid::nil(),
                id,
                error: if id == 0 { &long } else { "refused" },
            })
            .collect();
        let jobs = RowsDeadLettered {
            rows: 13,
            first: &first,
        }
        .jobs();
        let entries: Vec<&str> = jobs.split("; ").collect();
        assert_eq!(entries.len(), DEAD_ROWS_NAMED + 1, "{jobs}");
        let cut = format!(
            "{} (id 0): {}...",
            Uuid::nil(),
            "x".repeat(DEAD_REASON_CHARS)
        );
        assert_eq!(entries[0], cut);
        assert_eq!(entries[1], format!("{} (id 1): refused", Uuid::nil()));
        assert_eq!(entries[DEAD_ROWS_NAMED], "and 3 more");
        let one = RowsDeadLettered {
            rows: 1,
            first: &first[1..2],
        };
        assert_eq!(one.jobs(), format!("{} (id 1): refused", Uuid::nil()));
    }
}
