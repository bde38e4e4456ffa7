//! The fast path: after the commit, push the collection's jobs at once and delete their rows,
//! as the relay would (lock by `(id, uuid)` with `SKIP LOCKED`, push, delete the acknowledged
//! ones), so that a job need not wait for the relay; the relay stays the safety net.

use std::borrow::Cow;
use std::collections::HashSet;

use chrono::Utc;
use redis::aio::ConnectionLike;
use sqlx::{Acquire, PgExecutor, Postgres};
use uuid::Uuid;

use super::{PendingJobs, RowRef};
use crate::broker::enqueue::{JobResult, Outcome};
use crate::error::{Error, ErrorClass, Result};
use crate::job::Job;

/// What a fast-path call did with each job.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct PushReport {
    /// Jobs Redis accepted, with their outcome ([`Outcome::Duplicate`]: the job was already
    /// there, e.g. the relay got to it first). In the order they were added.
    pub pushed: Vec<(Uuid, Outcome)>,
    /// Jobs the enqueue script refused (e.g. `WRONGTYPE` on a key they need). Nothing of them
    /// was written and their rows stay: the relay retries them with backoff and moves them to
    /// the dead-letter table after `--max-attempts`.
    pub refused: Vec<(Uuid, Error)>,
    /// Jobs not pushed by [`PendingJobs::push_and_delete`] because their row was not pending
    /// for it: a relay holds it or has already relayed it, or it was never committed (the
    /// transaction rolled back, or [`PendingJobs::create_pending`] was not called). Either way
    /// there is nothing for this call to do. Also, in a layout whose runner has no scheduled
    /// set (`--layout celery`), jobs whose `run_at` is still ahead: their rows stay, and the
    /// relay sends them once they are due.
    pub skipped: Vec<Uuid>,
    /// Rows deleted.
    pub deleted: u64,
}

impl PushReport {
    /// How many jobs had outcome `o`.
    pub fn count(&self, o: Outcome) -> usize {
        self.pushed.iter().filter(|(_, x)| *x == o).count()
    }
}

/// The step of the fast path that failed; see [`FastPathError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Beginning the transaction or locking the rows. Nothing was pushed.
    Claim,
    /// Pushing to Redis (unreachable, timed out, READONLY, ...). Some jobs may have landed,
    /// each completely, with its dedup marker; the relay's later push of their rows turns into
    /// `duplicate`.
    Push,
    /// Deleting the rows (or committing the delete). The jobs are in Redis; the relay will
    /// push their rows again and find them `duplicate` (until the dedup TTL runs out).
    Delete,
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stage::Claim => "locking the pending rows",
            Stage::Push => "pushing to redis",
            Stage::Delete => "deleting the pending rows",
        })
    }
}

/// The fast path failed. Nothing is lost: the rows named in `rows_left` are still in the
/// table and the relay (daemon or `--sweep`) delivers them, once each.
#[derive(Debug, thiserror::Error)]
#[error("fast path failed while {stage}; {} pending row(s) left for the relay", rows_left.len())]
#[non_exhaustive]
pub struct FastPathError {
    /// Where it failed.
    pub stage: Stage,
    /// The rows of this collection that are still in the table, for the relay.
    pub rows_left: Vec<RowRef>,
    /// Why.
    #[source]
    pub source: Error,
}

impl FastPathError {
    /// The class of the underlying error (usually [`ErrorClass::Transient`]).
    pub fn class(&self) -> ErrorClass {
        self.source.class()
    }
}

impl PendingJobs {
    /// The fast path: pushes the jobs whose rows this collection wrote and that are still
    /// pending, then deletes the rows of the jobs Redis accepted; call it after the
    /// transaction of [`PendingJobs::create_pending`] committed.
    ///
    /// It works as the relay does, in a short transaction of its own on `db` (a `&PgPool`, or
    /// a `&mut PgConnection` that is not inside the producer's transaction): lock the rows by
    /// `(id, uuid)` with `FOR UPDATE SKIP LOCKED` (one statement), push them with the enqueue
    /// algorithm ([`Enqueuer::enqueue_batch`](crate::Enqueuer::enqueue_batch): one atomic script call per 1,000 jobs, with the
    /// relay's dedup), delete the accepted ones (one statement), commit. Hence:
    ///
    /// - rows a running relay holds are skipped, not waited for; rows already relayed, or
    ///   never committed (the transaction rolled back), are not pushed ([`PushReport::skipped`]);
    /// - in a layout that holds rows until they are due (`--layout celery`), a job whose `run_at`
    ///   is still ahead is not pushed either ([`PushReport::skipped`]): its row waits for the relay;
    /// - a job the script refuses keeps its row, unchanged, for the relay
    ///   ([`PushReport::refused`]); the others are deleted;
    /// - [`Producer::push_timeout`](super::super::Producer::push_timeout) bounds each script call against one deadline: the jobs of
    ///   calls answered before it are deleted, the others keep their rows (refused, transient);
    /// - if the push fails as a whole (Redis down, or its first call times out), the transaction
    ///   rolls back: every row stays for the relay, and the error says so
    ///   ([`FastPathError::rows_left`]). A job that reached Redis anyway is then relayed as
    ///   `duplicate`: each job lands once.
    ///
    /// ```no_run
    /// # async fn demo(pool: sqlx::PgPool, mut jobs: jobrelay::producer::PendingJobs)
    /// #     -> Result<(), Box<dyn std::error::Error>> {
    /// let client = redis::Client::open("redis://127.0.0.1:6379")?;
    /// let mut redis = client.get_multiplexed_async_connection().await?;
    /// match jobs.push_and_delete(&mut redis, &pool).await {
    ///     Ok(report) => {
    ///         for (uuid, e) in &report.refused {
    ///             eprintln!("job {uuid} refused ({e}); its row stays for the relay");
    ///         }
    ///     }
    ///     Err(e) => eprintln!("{e}"), // nothing lost: the relay delivers `e.rows_left`
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn push_and_delete<'a, C, A>(
        &mut self,
        redis: &mut C,
        db: A,
    ) -> Result<PushReport, FastPathError>
    where
        C: ConnectionLike + Send,
        A: Acquire<'a, Database = Postgres>,
    {
        let mut report = PushReport::default();
        let mut candidates = Vec::new();
        let due = self.due();
        for (i, s) in self.state.iter().enumerate() {
            match s.row {
                Some(_) if s.deleted => {}
                Some(_) if due(&self.jobs[i]) => candidates.push(i),
                _ => report.skipped.push(self.jobs[i].uuid),
            }
        }
        if candidates.is_empty() {
            return Ok(report);
        }
        let (ids, uuids) = self.keys(&candidates);
        let mut tx = match db.begin().await {
            Ok(tx) => tx,
            Err(e) => return Err(self.failed(Stage::Claim, e.into())),
        };
        let claimed: Vec<i64> = match sqlx::query_scalar(&self.producer.inner.sql.claim)
            .persistent(false)
            .bind(&ids)
            .bind(&uuids)
            .fetch_all(&mut *tx)
            .await
        {
            Ok(claimed) => claimed,
            Err(e) => return Err(self.failed(Stage::Claim, e.into())),
        };
        let claimed: HashSet<i64> = claimed.into_iter().collect();
        let mut take = Vec::with_capacity(claimed.len());
        for i in candidates {
            if claimed.contains(&self.state[i].row.expect("a candidate has a row")) {
                take.push(i);
            } else {
                report.skipped.push(self.jobs[i].uuid);
            }
        }
        if take.is_empty() {
            let _ = tx.rollback().await;
            return Ok(report);
        }

        let results = match self.enqueue(redis, &take).await {
            Ok(results) => results,
            Err(e) => {
                let _ = tx.rollback().await;
                return Err(self.failed(Stage::Push, e));
            }
        };
        let acked = self.record(&take, results, &mut report);

        if !acked.is_empty() {
            let (ids, uuids) = self.keys(&acked);
            let deleted = sqlx::query(&self.producer.inner.sql.delete)
                .persistent(false)
                .bind(&ids)
                .bind(&uuids)
                .execute(&mut *tx)
                .await;
            match deleted {
                Ok(done) => report.deleted = done.rows_affected(),
                Err(e) => {
                    let _ = tx.rollback().await;
                    return Err(self.failed(Stage::Delete, e.into()));
                }
            }
        }
        if let Err(e) = tx.commit().await {
            return Err(self.failed(Stage::Delete, e.into()));
        }
        for &i in &acked {
            self.state[i].deleted = true;
        }
        Ok(report)
    }

    /// Pushes every job Redis has not yet accepted through this collection, without touching
    /// Postgres (the pattern's `PushJobs`). Call it after commit; then call
    /// [`PendingJobs::delete_pending`]. Prefer [`PendingJobs::push_and_delete`], which also
    /// refuses to push jobs whose transaction rolled back and never waits for a relay's locks;
    /// use this pair for special error handling.
    ///
    /// The outer error means the push as a whole failed: the rows are untouched, and
    /// [`FastPathError::rows_left`] lists them. Refused jobs are in [`PushReport::refused`];
    /// [`PushReport::skipped`] lists only the jobs not yet due in a layout that holds rows until
    /// they are due (`--layout celery`): they are not pushed.
    ///
    /// ```no_run
    /// # use jobrelay::producer::PendingJobs;
    /// # use redis::aio::MultiplexedConnection;
    /// # async fn demo(pool: sqlx::PgPool, mut jobs: PendingJobs, mut redis: MultiplexedConnection)
    /// #     -> Result<(), Box<dyn std::error::Error>> {
    /// let report = jobs.push(&mut redis).await?;
    /// println!("{} queued", report.count(jobrelay::Outcome::Queued));
    /// jobs.delete_pending(&pool).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn push<C>(&mut self, redis: &mut C) -> Result<PushReport, FastPathError>
    where
        C: ConnectionLike + Send,
    {
        let mut report = PushReport::default();
        let due = self.due();
        let mut take = Vec::new();
        for i in 0..self.jobs.len() {
            if self.state[i].acked || self.state[i].deleted {
                continue;
            }
            if due(&self.jobs[i]) {
                take.push(i);
            } else {
                report.skipped.push(self.jobs[i].uuid);
            }
        }
        if take.is_empty() {
            return Ok(report);
        }
        let results = self
            .enqueue(redis, &take)
            .await
            .map_err(|e| self.failed(Stage::Push, e))?;
        self.record(&take, results, &mut report);
        Ok(report)
    }

    /// Deletes, with one statement, the rows of the jobs that Redis accepted through
    /// [`PendingJobs::push`] (the pattern's `DeletePendingJobs`), and returns how many rows it
    /// deleted. Rows of jobs not pushed, or refused, are never deleted: they stay for the
    /// relay. Rows a relay holds are waited for (its transaction is bounded by its
    /// `--push-timeout`), and count as not deleted if the relay took them.
    ///
    /// `db` is a `&PgPool` or a `&mut PgConnection`; inside a transaction, the delete takes
    /// effect at its commit. On failure the rows stay, and the relay pushes them again as
    /// `duplicate`.
    ///
    /// ```no_run
    /// # async fn demo(pool: sqlx::PgPool, mut jobs: jobrelay::producer::PendingJobs)
    /// #     -> Result<(), jobrelay::producer::FastPathError> {
    /// let deleted = jobs.delete_pending(&pool).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn delete_pending<'e, E>(&mut self, db: E) -> Result<u64, FastPathError>
    where
        E: PgExecutor<'e>,
    {
        let todo: Vec<usize> = (0..self.jobs.len())
            .filter(|&i| {
                let s = self.state[i];
                s.acked && s.row.is_some() && !s.deleted
            })
            .collect();
        if todo.is_empty() {
            return Ok(0);
        }
        let (ids, uuids) = self.keys(&todo);
        let done = sqlx::query(&self.producer.inner.sql.delete)
            .persistent(false)
            .bind(&ids)
            .bind(&uuids)
            .execute(db)
            .await
            .map_err(|e| self.failed(Stage::Delete, e.into()))?;
        for &i in &todo {
            self.state[i].deleted = true;
        }
        Ok(done.rows_affected())
    }

    /// Whether the fast path may push a job now: always, except a job whose `run_at` is still
    /// ahead in a layout that holds rows until they are due (the relay sends it then).
    fn due(&self) -> impl Fn(&Job) -> bool {
        let holds = self
            .producer
            .inner
            .enqueuer
            .layout()
            .layout()
            .claim_needs()
            .holds_until_due;
        let now = Utc::now();
        move |job: &Job| !holds || job.run_at.is_none_or(|t| t <= now)
    }

    /// Runs the enqueue algorithm on the jobs at `take` (indexes in order), bounded by the
    /// producer's push timeout.
    async fn enqueue<C: ConnectionLike + Send>(
        &self,
        redis: &mut C,
        take: &[usize],
    ) -> Result<Vec<JobResult>> {
        let jobs: Cow<'_, [Job]> = if take.len() == self.jobs.len() {
            Cow::Borrowed(&self.jobs)
        } else {
            Cow::Owned(take.iter().map(|&i| self.jobs[i].clone()).collect())
        };
        self.producer
            .inner
            .enqueuer
            .enqueue_batch_within(redis, &jobs, self.producer.inner.push_timeout)
            .await
    }

    /// Records per-job results; returns the indexes Redis accepted.
    fn record(
        &mut self,
        take: &[usize],
        results: Vec<JobResult>,
        report: &mut PushReport,
    ) -> Vec<usize> {
        let mut acked = Vec::with_capacity(take.len());
        for (&i, result) in take.iter().zip(results) {
            let uuid = self.jobs[i].uuid;
            match result {
                Ok(outcome) => {
                    self.state[i].acked = true;
                    acked.push(i);
                    report.pushed.push((uuid, outcome));
                }
                Err(e) => report.refused.push((uuid, e)),
            }
        }
        acked
    }

    fn keys(&self, idx: &[usize]) -> (Vec<i64>, Vec<Uuid>) {
        idx.iter()
            .filter_map(|&i| self.state[i].row.map(|id| (id, self.jobs[i].uuid)))
            .unzip()
    }

    fn failed(&self, stage: Stage, source: Error) -> FastPathError {
        FastPathError {
            stage,
            rows_left: self.rows(),
            source,
        }
    }
}
