//! One relay step: claim a batch, push it, delete what Redis acknowledged, commit.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use sqlx::{Connection as _, PgConnection, PgPool};

use self::settle::{Failed, Fate};
use super::claim_kind::{self, ClaimKind, Seen};
use super::cursor::{ClaimCursor, Claimed, Turn};
use super::prepared::{self, PreparedClaims};
use super::queries::{self, Queries};
use super::row::{ClaimedRow, PendingRow, RowMeta, SharedOptions};
use crate::backoff::per_job_delay;
use crate::error::{Dependency, Error, ErrorClass, Reason, Result};
use crate::job::Job;
use crate::job::{JobResult, Outcome};
use crate::report::{Interruption, Report};
use crate::sink::JobSink;
use crate::telemetry::events::{self, Event as _, Failures};
use uuid::Uuid;

mod settings;
mod settle;

pub use self::settings::BatchSettings;

/// Runs batches for one worker: one [`JobSink`], one connection at a time from the pool.
pub struct Batcher<S> {
    pool: PgPool,
    queries: Arc<Queries>,
    settings: Arc<BatchSettings>,
    sink: S,
    cursor: Arc<ClaimCursor>,
    /// The claim this worker runs next ([`ClaimKind::next`], as a `u8`): a table whose rows
    /// have no key is claimed with the cheapest statement.
    claim_kind: AtomicU8,
    /// The follow claim's window ([`claim_kind::follow_window`]).
    follow_window: AtomicUsize,
    /// Claims of heads to run before following keys again ([`ClaimKind::next_paused`]).
    follow_pause: AtomicU32,
    /// Whether claims run as named statements (`--prepared-statements`, [`super::prepared`]).
    prepared: Arc<PreparedClaims>,
}

/// What [`Batcher::claim_push_settle`] leaves for the transaction's end.
struct Step {
    report: Report,
    /// Ids of the rows whose jobs Redis acknowledged.
    acknowledged: Vec<i64>,
    /// Rows the claim moved to the dead letters itself (over `--max-job-size`).
    buried: u64,
    /// The first of them: `(id, uuid)`.
    buried_first: Option<(i64, Uuid)>,
    /// Why the failed rows could not be handed back; `None` when they were (or none failed).
    hand_back_failed: Option<Error>,
}

impl Step {
    fn of(report: Report) -> Self {
        Step {
            report,
            acknowledged: Vec::new(),
            buried: 0,
            buried_first: None,
            hand_back_failed: None,
        }
    }
}

/// The claimed rows, decoded ([`Batcher::decode`]).
struct Decoded {
    metas: Vec<RowMeta>,
    jobs: Vec<Job>,
    failed: Vec<Failed>,
    /// Rows the claim moved to the dead letters itself (over `--max-job-size`).
    buried: u64,
    /// The first of them: `(id, uuid)`.
    buried_first: Option<(i64, Uuid)>,
}

impl<S: JobSink> Batcher<S> {
    /// A batcher claiming from `pool` with `queries`.
    pub fn new(pool: PgPool, queries: Arc<Queries>, settings: Arc<BatchSettings>, sink: S) -> Self {
        Batcher {
            pool,
            queries,
            sink,
            cursor: Arc::default(),
            // Nothing seen yet: the claim that takes any row and plans faster than runs.
            claim_kind: AtomicU8::new(ClaimKind::Heads.to_u8()),
            follow_window: AtomicUsize::new(1),
            follow_pause: AtomicU32::new(0),
            prepared: Arc::new(PreparedClaims::new(settings.prepared_statements)),
            settings,
        }
    }

    /// Shares `prepared` (whether claims are named statements) with the other batchers of the
    /// same relay: one that finds they cannot be ends them for all.
    pub fn with_prepared(mut self, prepared: Arc<PreparedClaims>) -> Self {
        self.prepared = prepared;
        self
    }

    /// Shares `cursor` (where claims start, [`super::cursor`]) with the other batchers of the
    /// same relay; a new batcher has a cursor of its own.
    pub fn with_cursor(mut self, cursor: Arc<ClaimCursor>) -> Self {
        self.cursor = cursor;
        self
    }

    /// The claim cursor.
    pub fn cursor(&self) -> &ClaimCursor {
        &self.cursor
    }

    /// Starts with the claim `kind` (a new batcher starts with [`ClaimKind::Heads`]).
    pub fn starting_with(self, kind: ClaimKind) -> Self {
        self.set_claim_kind(kind);
        self
    }

    /// Runs `kind` next; a follow claim after another claim starts with
    /// [`claim_kind::first_follow_window`].
    fn set_claim_kind(&self, kind: ClaimKind) {
        if kind == ClaimKind::Follow && self.claim_kind() != ClaimKind::Follow {
            self.follow_window.store(
                claim_kind::first_follow_window(self.settings.batch_size),
                Ordering::Relaxed,
            );
        }
        self.claim_kind.store(kind.to_u8(), Ordering::Relaxed);
    }

    /// The claim this batcher runs next ([`ClaimKind::next`]).
    pub fn claim_kind(&self) -> ClaimKind {
        ClaimKind::from_u8(self.claim_kind.load(Ordering::Relaxed))
    }

    /// The sink.
    pub fn sink(&self) -> &S {
        &self.sink
    }

    /// Runs one batch; `older_than` restricts it to rows created at least that long ago (the
    /// sweep). On `Err` (transient) the transaction rolled back: every claimed row is pending
    /// again with its attempts unchanged.
    pub async fn run_once(&self, older_than: Option<Duration>) -> Result<Report> {
        let started = Instant::now();
        let mut conn = crate::db::acquire(
            &self.pool,
            self.settings.statement_timeout,
            "postgres connection",
        )
        .await?;
        let turn = self.cursor.start();
        let result = self
            .in_transaction(&mut conn, older_than, &turn, started)
            .await;
        if let Ok(report) = &result {
            turn.finish(Claimed {
                last_id: report.last_id,
                full: report.more,
                kept: report.kept > 0 || report.held > 0 || report.passed_over,
                handed_back: report.refused > 0,
                took: report.stages.claim,
            });
        }
        if let Err(e) = &result {
            if e.dependency() == Some(Dependency::Postgres) && e.reason() == Reason::ReadOnly {
                // A session that cannot write (a demoted primary still answering, a database
                // made read-only) stays so: let the pool open a new one, which may reach the
                // new primary.
                let _ = tokio::time::timeout(self.settings.statement_timeout, conn.close()).await;
            } else if matches!(
                e,
                Error::Timeout {
                    dependency: crate::error::Dependency::Postgres,
                    ..
                }
            ) {
                // A statement that did not answer (a primary gone silent): the session is
                // dropped at once, not handed back to the pool to be checked.
                drop(conn.detach());
            }
        }
        result
    }

    async fn in_transaction(
        &self,
        conn: &mut PgConnection,
        older_than: Option<Duration>,
        turn: &Turn<'_>,
        started: Instant,
    ) -> Result<Report> {
        // BEGIN with the relay's settings for this transaction only (works through PgBouncer
        // in either mode, leaks into no other session), and the planner settings every
        // statement on the outbox needs ([`queries::PLANNER_SETTINGS`]).
        let begin = format!(
            "{}; {}",
            crate::db::begin_statement(
                self.settings.statement_timeout,
                self.settings.idle_in_transaction_timeout,
            ),
            queries::PLANNER_SET_LOCAL
        );
        let mut tx = self
            .bounded("postgres begin", conn.begin_with(begin))
            .await?;
        let begun = started.elapsed();
        let step = self.claim_push_settle(&mut tx, older_than, turn).await?;
        let mut report = step.report;
        report.stages.begin = begun;
        if let Some(e) = step.hand_back_failed {
            // The failed rows could not be written back (a full disk, say), and Redis holds
            // the others' jobs: rolling the batch back and leaving it there would push them
            // again, as new jobs once their markers expire. Instead the batch is rolled back
            // (every row back as it was, the failed ones too) and the acknowledged rows alone
            // are deleted, which needs no new space.
            let settling = Instant::now();
            if self
                .bounded("postgres rollback", tx.rollback())
                .await
                .is_err()
            {
                // The session is in no state to go on: the server rolls the batch back when
                // it drops it, and the batch is retried as after any failure.
                return Err(e);
            }
            let deleted = self
                .settle_acknowledged(conn, &step.acknowledged, &e, step.buried, &mut report)
                .await?;
            report.stages.settle += settling.elapsed();
            events::BatchSettledApart {
                acknowledged: step.acknowledged.len(),
                deleted,
                not_handed_back: report.kept,
                error: &e,
                duration: started.elapsed(),
            }
            .emit();
            return Ok(report);
        }
        if report.claimed > 0 {
            let committing = Instant::now();
            self.bounded("postgres commit", tx.commit()).await?;
            report.stages.commit = committing.elapsed();
            if let Some((first_id, first_uuid)) = step.buried_first {
                // Moved by the claim itself, and so only once the batch committed.
                events::OversizeRowsDeadLettered {
                    rows: step.buried,
                    first_id,
                    first_uuid,
                    max_job_bytes: self.settings.max_job_bytes,
                }
                .emit();
            }
            events::BatchCommitted {
                report: &report,
                duration: started.elapsed(),
            }
            .emit();
        } else {
            // Nothing was written; let the connection go back clean.
            self.bounded("postgres rollback", tx.rollback()).await?;
        }
        Ok(report)
    }

    async fn claim_push_settle(
        &self,
        conn: &mut PgConnection,
        older_than: Option<Duration>,
        turn: &Turn<'_>,
    ) -> Result<Step> {
        let claiming = Instant::now();
        let kind = self.claim_kind();
        let named = self.prepared.on();
        let claim = self.queries.claim_for(kind, named);
        // The follow claim looks at a window of rows, not a batch, and takes `$7` more behind
        // each head.
        let batch = self.settings.batch_size;
        let looked_at = match kind {
            ClaimKind::Follow => self.follow_window.load(Ordering::Relaxed),
            _ => batch,
        };
        // Unnamed (here and below) unless --prepared-statements: a named statement outlives
        // the transaction on its server connection, which PgBouncer in transaction mode hands
        // to other clients (docs/cli.md#postgres-connections).
        let query = sqlx::query_as(claim)
            .persistent(named)
            .bind(looked_at as i64)
            .bind(older_than.map(|d| d.as_secs_f64()))
            .bind(self.settings.max_batch_bytes as i64)
            .bind(self.settings.max_job_bytes as i64)
            .bind(self.settings.claim_slots.unwrap_or(0) as i32)
            .bind(turn.from);
        let query = if kind == ClaimKind::Follow {
            query.bind(claim_kind::followed_per_head(batch, looked_at) as i64)
        } else {
            query
        };
        let claimed: Result<Vec<ClaimedRow>> = self
            .bounded("postgres claim", query.fetch_all(&mut *conn))
            .await;
        let not_kept = match &claimed {
            Err(e) if named && prepared::not_kept(e) => Some(e.to_string()),
            Ok(rows)
                if named
                    && rows
                        .iter()
                        .any(|c| c.statement != Some(self.queries.claim_tag)) =>
            {
                Some(
                    "a claim's rows came from another client's statement of the same name"
                        .to_owned(),
                )
            }
            _ => None,
        };
        if let Some(why) = not_kept {
            // Nothing pushed: the transaction rolls back (what another's statement did in it
            // too), and the batch is claimed again at once, unnamed.
            self.prepared.give_up(&why);
            return Ok(Step::of(Report {
                more: true,
                ..Report::default()
            }));
        }
        let claimed = claimed?;
        let ids = claimed.iter().map(|c| c.row.id);
        if let (Some(lo), Some(hi)) = (ids.clone().min(), ids.max()) {
            turn.holds(lo, hi);
        }
        // The flags but `buried` are the statement's, the same on every row.
        let first = claimed.first();
        // The rows taken within the window the claim looked at: all but those the follow
        // claim took following their key, above it. Only these move the cursor: the rows in
        // between, of other keys, are still to be claimed.
        let window_end = first.and_then(|c| c.window_end).unwrap_or(i64::MAX);
        let in_window = claimed.iter().filter(|c| c.row.id <= window_end).count();
        if kind == ClaimKind::Follow && !claimed.is_empty() {
            self.follow_window.store(
                claim_kind::follow_window(batch, claimed.len(), in_window),
                Ordering::Relaxed,
            );
        }
        let seen = Seen {
            empty: claimed.is_empty(),
            keyed: first.is_some_and(|c| c.keyed),
            held: first.is_some_and(|c| c.held),
            runs_beyond: match kind {
                ClaimKind::Follow => claimed.len() >= 2 * in_window && in_window > 0,
                ClaimKind::Heads => claimed.len() >= batch,
                ClaimKind::Unkeyed | ClaimKind::Runs => false,
            },
        };
        let mut report = Report {
            claimed: claimed.len() as u64,
            // After a follow claim, claim again at once: its window is small, and may have held
            // only rows waiting behind other keys' heads (then heads, over a batch, looks
            // further). The claim after the last rows comes back empty and says no more.
            more: claimed.len() >= batch
                || claimed.iter().any(|c| c.capped)
                || kind == ClaimKind::Follow,
            // Rows a claim locked and left behind their key's head, and keyed rows the unkeyed
            // claim left: looked for again at once (a catch-up).
            passed_over: seen.held || (seen.keyed && kind == ClaimKind::Unkeyed),
            last_id: claimed
                .iter()
                .map(|c| c.row.id)
                .filter(|&id| id <= window_end)
                .max(),
            ..Report::default()
        };
        report.stages.claim = claiming.elapsed();
        let (next, pause) = kind.next_paused(seen, self.follow_pause.load(Ordering::Relaxed));
        self.follow_pause.store(pause, Ordering::Relaxed);
        self.set_claim_kind(next);
        if claimed.is_empty() {
            if self.settings.claim_slots.is_some() {
                // Empty table, or no free slot? Only an idle poll pays this round trip.
                let held: Option<String> = self
                    .bounded(
                        "postgres claim",
                        sqlx::query_scalar(&self.queries.slot_held)
                            .persistent(false)
                            .fetch_one(&mut *conn),
                    )
                    .await?;
                report.no_slot = held.as_deref() == Some("false");
            }
            return Ok(Step::of(report));
        }

        let mut failures = Failures::default();
        let decoded = self.decode(claimed, &mut report, &mut failures);
        let (metas, jobs, mut failed) = (decoded.metas, decoded.jobs, decoded.failed);
        let pushing = Instant::now();
        let results = self.push(&jobs).await?;
        let acknowledged = self.classify(metas, jobs, results, &mut failed, &mut report, failures);
        report.stages.push = pushing.elapsed();
        report.handed_back = decoded.buried;
        let mut hand_back_failed = None;
        if !failed.is_empty() {
            let settling = Instant::now();
            if let Err(e) = self.settle_failures(conn, failed, &mut report).await {
                hand_back_failed = Some(e);
            }
            report.stages.settle = settling.elapsed();
        }
        Ok(Step {
            report,
            acknowledged,
            buried: decoded.buried,
            buried_first: decoded.buried_first,
            hand_back_failed,
        })
    }

    /// Turns claimed rows into jobs, in `id` order. Rows that can never become a job are
    /// failed permanently (counted in `failures`); rows the claim itself dead-lettered (over
    /// `--max-job-size`) are only counted, and logged once the batch commits.
    fn decode(
        &self,
        mut claimed: Vec<ClaimedRow>,
        report: &mut Report,
        failures: &mut Failures,
    ) -> Decoded {
        claimed.sort_unstable_by_key(|c| c.row.id);
        let mut metas: Vec<RowMeta> = Vec::with_capacity(claimed.len());
        let mut jobs = Vec::with_capacity(claimed.len());
        let mut failed: Vec<Failed> = Vec::new();
        let mut buried_first: Option<(i64, Uuid)> = None;
        let mut buried = 0;
        let mut options = SharedOptions::default();
        // Ordering keys whose row failed here, with that row's uuid: their later rows of the
        // batch are held (handed back as they were), never pushed ahead of it.
        let mut stopped: HashMap<String, Uuid> = HashMap::new();
        for c in claimed {
            let row = c.row;
            if let Some(behind) = row.ordering_key.as_ref().and_then(|k| stopped.get(k)) {
                report.held += 1;
                failed.push(Failed {
                    error: Error::Held {
                        uuid: row.uuid,
                        key: row.ordering_key.clone().unwrap_or_default(),
                        behind: *behind,
                    }
                    .to_string(),
                    row,
                    fate: Fate::Retry(Duration::ZERO),
                });
                continue;
            }
            if c.buried {
                buried += 1;
                buried_first.get_or_insert((row.id, row.uuid));
                if let Some(key) = row.ordering_key {
                    stopped.insert(key, row.uuid);
                }
                continue;
            }
            match row.into_job(&mut options) {
                Ok((meta, job)) => {
                    metas.push(meta);
                    jobs.push(job);
                }
                Err(failed_row) => {
                    let (mut row, e) = *failed_row;
                    if let Some(key) = &row.ordering_key {
                        stopped.insert(key.clone(), row.uuid);
                    }
                    // A failed attempt like any other, though the last one (docs/guarantees.md#failure-classes).
                    row.attempts = row.attempts.saturating_add(1);
                    report.invalid += 1;
                    failures.add(ErrorClass::Permanent, e.reason(), 1);
                    failed.push(Failed {
                        row,
                        error: e.to_string(),
                        fate: Fate::Dead,
                    });
                }
            }
        }
        if buried > 0 {
            report.invalid += buried;
            report.dead_lettered += buried;
            // A job too large (`Error::TooLarge`): permanent, about the job itself.
            failures.add(ErrorClass::Permanent, Reason::Other, buried);
        }
        Decoded {
            metas,
            jobs,
            failed,
            buried,
            buried_first,
        }
    }

    /// Pushes the jobs; one result per job. `Err`: nothing was acknowledged (roll back).
    async fn push(&self, jobs: &[Job]) -> Result<Vec<JobResult>> {
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let results = self.sink.push(jobs).await.and_then(|results| {
            // A row is deleted unless its result says otherwise: a result missing for a job
            // would delete its row without a push. Treat the batch as failed.
            if results.len() == jobs.len() {
                Ok(results)
            } else {
                Err(Error::Contract {
                    dependency: None,
                    what: "sink answered the wrong number of results",
                    detail: format!("{} results for {} jobs", results.len(), jobs.len()),
                })
            }
        });
        results.inspect_err(|e| {
            events::PushFailed {
                jobs: jobs.len() as u64,
                error: e,
            }
            .emit()
        })
    }

    /// Counts each job's result; the jobs that did not make it join `failed` with their fate,
    /// each as the row it was claimed as ([`PendingRow::rejoin`]: its values moved back, not
    /// copied). Emits what Redis answered, with the batch's `failures` so far (rows that never
    /// became jobs). Returns the ids of the rows whose jobs Redis acknowledged.
    fn classify(
        &self,
        metas: Vec<RowMeta>,
        jobs: Vec<Job>,
        results: Vec<JobResult>,
        failed: &mut Vec<Failed>,
        report: &mut Report,
        mut failures: Failures,
    ) -> Vec<i64> {
        let now = Utc::now();
        let mut acknowledged = Vec::with_capacity(jobs.len());
        let mut first_refusal: Option<String> = None;
        for ((meta, job), result) in metas.into_iter().zip(jobs).zip(results) {
            let e = match result {
                Ok(outcome) => {
                    report.outcomes[outcome.index()] += 1;
                    if outcome == Outcome::Late {
                        events::LateJob {
                            uuid: job.uuid,
                            id: meta.id,
                            parent: job.parent_uuid,
                            predecessor: job.predecessor_uuid,
                        }
                        .emit();
                    }
                    events::JobAnswered {
                        lag_seconds: (now - job.created_at).as_seconds_f64(),
                    }
                    .emit();
                    acknowledged.push(meta.id);
                    continue;
                }
                Err(e @ Error::Held { .. }) => {
                    // Not its failure: back as it was, behind the key's earlier row.
                    report.held += 1;
                    failed.push(Failed {
                        row: PendingRow::rejoin(meta, job),
                        error: e.to_string(),
                        fate: Fate::Retry(Duration::ZERO),
                    });
                    continue;
                }
                Err(e) => e,
            };
            let mut attempts = meta.attempts.saturating_add(1);
            failures.add(e.class(), e.reason(), 1);
            let fate = match e.class() {
                // A configuration error (Redis's eviction policy) keeps the rows as an outage does.
                ErrorClass::Transient | ErrorClass::Config => {
                    // Not acknowledged while others were: kept as it was, for the next batch.
                    report.kept += 1;
                    attempts = meta.attempts;
                    if report.interrupted.is_none() {
                        report.interrupted = Some(Interruption {
                            dependency: e.dependency().unwrap_or(Dependency::Redis),
                            reason: e.reason(),
                            error: e.to_string(),
                        });
                    }
                    Fate::Retry(Duration::ZERO)
                }
                ErrorClass::Permanent => {
                    report.invalid += 1;
                    Fate::Dead
                }
                ErrorClass::PerJob => {
                    report.refused += 1;
                    first_refusal.get_or_insert_with(|| e.to_string());
                    if attempts < self.settings.max_attempts as i32 {
                        Fate::Retry(per_job_delay(attempts as u32))
                    } else {
                        Fate::Dead
                    }
                }
            };
            tracing::debug!(uuid = %job.uuid, id = meta.id, attempts, error = %e, "job failed");
            let mut row = PendingRow::rejoin(meta, job);
            row.attempts = attempts;
            failed.push(Failed {
                row,
                error: e.to_string(),
                fate,
            });
        }
        events::BatchAnswered {
            outcomes: &report.outcomes,
            failures: &failures,
            first_refusal: first_refusal.as_deref(),
        }
        .emit();
        acknowledged
    }

    async fn bounded<T, E: Into<Error>>(
        &self,
        what: &'static str,
        fut: impl std::future::Future<Output = std::result::Result<T, E>>,
    ) -> Result<T> {
        let after = self.settings.statement_timeout;
        crate::error::within(crate::error::Dependency::Postgres, what, after, fut).await
    }
}
