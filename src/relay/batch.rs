//! One relay step: claim a batch, push it, delete what Redis acknowledged, commit.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use sqlx::{PgConnection, PgPool};

use super::queries::Queries;
use super::report::Report;
use super::row::{PendingRow, RowMeta};
use super::sink::JobSink;
use crate::backoff::per_job_delay;
use crate::enqueue::Outcome;
use crate::error::{Error, ErrorClass, Result};
use crate::telemetry::metrics;

/// How a batch is claimed and what happens to rows that fail.
#[derive(Debug, Clone)]
pub struct BatchSettings {
    /// Rows claimed per transaction.
    pub batch_size: usize,
    /// Attempts after which a refused row moves to the dead-letter table.
    pub max_attempts: u32,
    /// Client-side bound on each statement (claim, hand-back, commit), on top of the server's
    /// `statement_timeout`: a Postgres that stops answering cannot hold a worker.
    pub statement_timeout: Duration,
}

/// Runs batches for one worker: one [`JobSink`], one connection at a time from the pool.
pub struct Batcher<S> {
    pool: PgPool,
    queries: Arc<Queries>,
    settings: Arc<BatchSettings>,
    sink: S,
}

/// A row that did not make it, on its way back to the table or to the dead letters.
struct Failed {
    row: PendingRow,
    error: String,
    retry_in: Option<Duration>,
}

impl<S: JobSink> Batcher<S> {
    /// A batcher claiming from `pool` with `queries`.
    pub fn new(pool: PgPool, queries: Arc<Queries>, settings: Arc<BatchSettings>, sink: S) -> Self {
        Batcher {
            pool,
            queries,
            settings,
            sink,
        }
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
        let mut tx = self.bounded("postgres begin", self.pool.begin()).await?;
        let begun = started.elapsed();
        let mut report = self.claim_push_settle(&mut tx, older_than).await?;
        report.stages.begin = begun;
        if report.claimed > 0 {
            let committing = Instant::now();
            self.bounded("postgres commit", tx.commit()).await?;
            report.stages.commit = committing.elapsed();
            metrics::batch_duration(started.elapsed());
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
                "batch committed"
            );
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
    ) -> Result<Report> {
        let claiming = Instant::now();
        let mut rows: Vec<PendingRow> = self
            .bounded(
                "postgres claim",
                sqlx::query_as(&self.queries.claim)
                    .bind(self.settings.batch_size as i64)
                    .bind(older_than.map(|d| d.as_secs_f64()))
                    .fetch_all(&mut *conn),
            )
            .await?;
        let mut report = Report {
            claimed: rows.len() as u64,
            ..Report::default()
        };
        report.stages.claim = claiming.elapsed();
        if rows.is_empty() {
            return Ok(report);
        }
        rows.sort_unstable_by_key(|r| r.id);

        let mut metas: Vec<RowMeta> = Vec::with_capacity(rows.len());
        let mut jobs = Vec::with_capacity(rows.len());
        let mut failed: Vec<Failed> = Vec::new();
        for row in rows {
            match row.into_job() {
                Ok((meta, job)) => {
                    metas.push(meta);
                    jobs.push(job);
                }
                Err(failed_row) => {
                    let (mut row, e) = *failed_row;
                    // A failed attempt like any other, though the last one (SPEC 5.4).
                    row.attempts = row.attempts.saturating_add(1);
                    report.invalid += 1;
                    failed.push(Failed {
                        row,
                        error: e.to_string(),
                        retry_in: None,
                    });
                }
            }
        }

        let pushing = Instant::now();
        let results = if jobs.is_empty() {
            Vec::new()
        } else {
            self.sink
                .push(&jobs)
                .await
                .and_then(|results| {
                    // A row is deleted unless its result says otherwise: a result missing for
                    // a job would delete its row without a push. Treat the batch as failed.
                    if results.len() == jobs.len() {
                        Ok(results)
                    } else {
                        Err(Error::Redis(redis::RedisError::from((
                            redis::ErrorKind::ClientError,
                            "sink answered the wrong number of results",
                            format!("{} results for {} jobs", results.len(), jobs.len()),
                        ))))
                    }
                })
                .inspect_err(|_| {
                    metrics::failures(ErrorClass::Transient, jobs.len() as u64);
                })?
        };
        let now = Utc::now();
        let mut first_refusal: Option<String> = None;
        for ((meta, job), result) in metas.iter().zip(&jobs).zip(results) {
            match result {
                Ok(outcome) => {
                    report.outcomes[outcome.index()] += 1;
                    metrics::relay_lag((now - job.created_at).as_seconds_f64());
                }
                Err(e) => {
                    let class = e.class();
                    let attempts = meta.attempts.saturating_add(1);
                    let retry_in = match class {
                        ErrorClass::Transient => {
                            metrics::failures(ErrorClass::Transient, jobs.len() as u64);
                            return Err(e);
                        }
                        ErrorClass::Permanent => {
                            report.invalid += 1;
                            None
                        }
                        ErrorClass::PerJob => {
                            report.refused += 1;
                            first_refusal.get_or_insert_with(|| e.to_string());
                            (attempts < self.settings.max_attempts as i32)
                                .then(|| per_job_delay(attempts as u32))
                        }
                    };
                    tracing::debug!(uuid = %job.uuid, id = meta.id, attempts, error = %e, "job failed");
                    let meta = RowMeta {
                        id: meta.id,
                        attempts,
                    };
                    failed.push(Failed {
                        row: PendingRow::from_job(meta, job),
                        error: e.to_string(),
                        retry_in,
                    });
                }
            }
        }
        for o in Outcome::ALL {
            metrics::relayed(o, report.outcome(o));
        }
        metrics::failures(ErrorClass::PerJob, report.refused);
        metrics::failures(ErrorClass::Permanent, report.invalid);
        if let Some(first) = first_refusal {
            tracing::warn!(refused = report.refused, first_error = %first, "jobs refused by redis; kept for retry");
        }
        report.stages.push = pushing.elapsed();
        if !failed.is_empty() {
            let settling = Instant::now();
            self.settle_failures(conn, failed, &mut report).await?;
            report.stages.settle = settling.elapsed();
        }
        Ok(report)
    }

    /// Puts failed rows back (attempts + 1, delayed) or moves them to the dead letters.
    async fn settle_failures(
        &self,
        conn: &mut PgConnection,
        failed: Vec<Failed>,
        report: &mut Report,
    ) -> Result<()> {
        let (retry, dead): (Vec<Failed>, Vec<Failed>) =
            failed.into_iter().partition(|f| f.retry_in.is_some());
        if !retry.is_empty() {
            self.hand_back(conn, &self.queries.retry, retry).await?;
        }
        if !dead.is_empty() {
            let n = dead.len() as u64;
            let first = dead[0].error.clone();
            self.hand_back(conn, &self.queries.dead_letter, dead)
                .await?;
            report.dead_lettered += n;
            metrics::dead_lettered(n);
            tracing::warn!(rows = n, first_error = %first, "rows moved to the dead-letter table");
        }
        Ok(())
    }

    async fn hand_back(&self, conn: &mut PgConnection, sql: &str, rows: Vec<Failed>) -> Result<()> {
        let n = rows.len();
        let mut id = Vec::with_capacity(n);
        let mut uuid = Vec::with_capacity(n);
        let mut queue = Vec::with_capacity(n);
        let mut job_type = Vec::with_capacity(n);
        let mut payload = Vec::with_capacity(n);
        let mut parent = Vec::with_capacity(n);
        let mut pred = Vec::with_capacity(n);
        let mut dead_parent = Vec::with_capacity(n);
        let mut run_at = Vec::with_capacity(n);
        let mut headers = Vec::with_capacity(n);
        let mut created_at = Vec::with_capacity(n);
        let mut attempts = Vec::with_capacity(n);
        let mut delay = Vec::with_capacity(n);
        let mut last_error = Vec::with_capacity(n);
        for f in rows {
            let r = f.row;
            id.push(r.id);
            uuid.push(r.uuid);
            queue.push(r.queue);
            job_type.push(r.job_type);
            payload.push(r.payload);
            parent.push(r.parent_uuid);
            pred.push(r.predecessor_uuid);
            dead_parent.push(r.dead_parent);
            run_at.push(r.run_at);
            headers.push(r.headers);
            created_at.push(r.created_at);
            attempts.push(r.attempts);
            delay.push(f.retry_in.unwrap_or_default().as_secs_f64());
            last_error.push(f.error);
        }
        self.bounded(
            "postgres hand-back",
            sqlx::query(sql)
                .bind(id)
                .bind(uuid)
                .bind(queue)
                .bind(job_type)
                .bind(payload)
                .bind(parent)
                .bind(pred)
                .bind(dead_parent)
                .bind(run_at)
                .bind(headers)
                .bind(created_at)
                .bind(attempts)
                .bind(delay)
                .bind(last_error)
                .execute(conn),
        )
        .await?;
        Ok(())
    }

    async fn bounded<T, E: Into<Error>>(
        &self,
        what: &'static str,
        fut: impl std::future::Future<Output = std::result::Result<T, E>>,
    ) -> Result<T> {
        let after = self.settings.statement_timeout;
        match tokio::time::timeout(after, fut).await {
            Ok(r) => r.map_err(Into::into),
            Err(_) => Err(Error::Timeout { what, after }),
        }
    }
}
