//! Collecting jobs, writing their rows in the caller's transaction, and the fast path.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use redis::aio::ConnectionLike;
use sqlx::{Acquire, PgConnection, PgExecutor, Postgres};
use uuid::Uuid;

use super::builder::IntoJob;
use super::sql::Sql;
use crate::defaults::{DEFAULT_DEDUP_TTL, DEFAULT_PUSH_TIMEOUT};
use crate::error::{Error, ErrorClass, Result};
use crate::job::Job;
use crate::redis::enqueue::{Enqueuer, JobResult, Outcome};
use crate::redis::layout::LayoutKind;
use crate::table::TableName;

/// What a producer shares with the relay: the outbox table, the Redis key namespace and the
/// dedup TTL; plus the bound on a fast-path push.
///
/// Make one per application (it is cheap to clone) with the same `--table`, `--namespace`
/// and `--dedup-ttl` as the relay, and call [`Producer::pending`] once per transaction.
/// Defaults match the relay's: table `pending_jobs`, dedup TTL 15 minutes, push timeout 5 s.
///
/// ```
/// use std::time::Duration;
/// use jobrelay::{producer::Producer, TableName};
///
/// let producer = Producer::new("app1:")
///     .table(TableName::parse("billing.jobs").expect("a valid table name"))
///     .dedup_ttl(Duration::from_secs(3600));
/// assert_eq!(producer.table_name().to_string(), "billing.jobs");
/// assert_eq!(producer.enqueuer().namespace(), "app1:");
/// ```
#[derive(Debug, Clone)]
pub struct Producer {
    inner: Arc<Inner>,
}

#[derive(Debug, Clone)]
struct Inner {
    enqueuer: Enqueuer,
    table: TableName,
    /// Rendered once per table, shared by every `PendingJobs` of this producer.
    sql: Arc<Sql>,
    push_timeout: Duration,
}

impl Producer {
    /// A producer writing to `pending_jobs` and pushing keys under `namespace` (e.g.
    /// `"app1:"`, or `""` for none: the relay's `--namespace`).
    pub fn new(namespace: impl Into<String>) -> Self {
        let table = TableName::default();
        Producer {
            inner: Arc::new(Inner {
                enqueuer: Enqueuer::new(namespace, DEFAULT_DEDUP_TTL),
                sql: Arc::new(Sql::new(&table)),
                table,
                push_timeout: DEFAULT_PUSH_TIMEOUT,
            }),
        }
    }

    /// Writes to `table` (the relay's `--table`) instead of `pending_jobs`. The table must
    /// exist (`jobrelay migrate --table T`, or `SELECT jobrelay_create_outbox('T')`).
    #[must_use]
    pub fn table(self, table: TableName) -> Self {
        self.with(|i| {
            i.sql = Arc::new(Sql::new(&table));
            i.table = table;
        })
    }

    /// Sets how long the dedup markers written by the fast path live (the relay's
    /// `--dedup-ttl`; `Duration::ZERO`: forever). Default: 15 minutes.
    #[must_use]
    pub fn dedup_ttl(self, ttl: Duration) -> Self {
        self.with(|i| i.enqueuer = i.enqueuer.clone().with_dedup_ttl(ttl))
    }

    /// Writes the fast path's jobs in `layout` (the relay's `--layout`): the same keys, wire
    /// format and script as the relay. Default: [`LayoutKind::Jobrelay`].
    #[must_use]
    pub fn layout(self, layout: LayoutKind) -> Self {
        self.with(|i| i.enqueuer = i.enqueuer.clone().with_layout(layout))
    }

    /// Bounds each fast-path push (the relay's `--push-timeout`); a push that takes longer
    /// fails with [`Error::Timeout`] and leaves the rows to the relay. Default: 5 s.
    #[must_use]
    pub fn push_timeout(self, timeout: Duration) -> Self {
        self.with(|i| i.push_timeout = timeout)
    }

    /// The enqueuer the fast path runs: the same algorithm and script as the relay.
    pub fn enqueuer(&self) -> &Enqueuer {
        &self.inner.enqueuer
    }

    /// The outbox table.
    pub fn table_name(&self) -> &TableName {
        &self.inner.table
    }

    /// An empty collection of jobs, for one transaction.
    pub fn pending(&self) -> PendingJobs {
        PendingJobs {
            producer: self.clone(),
            jobs: Vec::new(),
            state: Vec::new(),
            index: HashMap::new(),
        }
    }

    fn with(self, change: impl FnOnce(&mut Inner)) -> Self {
        let mut inner = Arc::unwrap_or_clone(self.inner);
        change(&mut inner);
        Producer {
            inner: Arc::new(inner),
        }
    }
}

impl Default for Producer {
    /// [`Producer::new`] with no namespace: the relay's defaults.
    fn default() -> Self {
        Producer::new("")
    }
}

/// A pending row written by [`PendingJobs::create_pending`]: its `id` (claim order) and the
/// job's `uuid`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RowRef {
    /// The row's `id`.
    pub id: i64,
    /// The job's uuid (the row's `uuid`).
    pub uuid: Uuid,
}

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

/// What this collection knows about one job.
#[derive(Debug, Clone, Copy, Default)]
struct State {
    /// The row written by `create_pending`.
    row: Option<i64>,
    /// Redis accepted the job (through this collection).
    acked: bool,
    /// The row was deleted by this collection (or found gone while deleting it).
    deleted: bool,
}

/// The jobs of one transaction: the pending-job pattern's `JobScheduler`.
///
/// 1. [`add`](Self::add) jobs while the transaction runs (nothing is written yet);
/// 2. [`create_pending`](Self::create_pending) writes their rows in the transaction, with one
///    statement;
/// 3. after `commit`, [`push_and_delete`](Self::push_and_delete) pushes them to Redis at once
///    and deletes their rows (the fast path). Skipping step 3 is fine: the relay delivers the
///    rows within its poll interval (at once, if it listens for notifications).
///
/// Guarantees: the rows are invisible to the relay until the transaction commits and vanish
/// with it if it rolls back; every committed job reaches Redis at least once, and the dedup
/// marker `jobs:<uuid>` makes a second push (fast path racing the relay, or a crash between
/// push and delete) a no-op `duplicate` while the marker lives (`--dedup-ttl`).
///
/// A `PendingJobs` belongs to one transaction: after a rollback, drop it and start over.
///
/// ```no_run
/// use jobrelay::producer::{JobBuilder, Producer};
///
/// # async fn demo(pool: sqlx::PgPool, mut redis: redis::aio::MultiplexedConnection)
/// #     -> Result<(), Box<dyn std::error::Error>> {
/// let producer = Producer::new("app1:");
/// let mut jobs = producer.pending();
///
/// let mut tx = pool.begin().await?;
/// let id: i64 = sqlx::query_scalar("INSERT INTO things (name) VALUES ('x') RETURNING id")
///     .fetch_one(&mut *tx)
///     .await?;
/// jobs.add(JobBuilder::new("default", "ProcessThing").json(&serde_json::json!({ "id": id })))?;
/// jobs.create_pending(&mut tx).await?;
/// tx.commit().await?;
///
/// // Optional: push now instead of waiting for the relay. On failure the rows stay.
/// if let Err(e) = jobs.push_and_delete(&mut redis, &pool).await {
///     eprintln!("{e}; the relay will deliver");
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct PendingJobs {
    producer: Producer,
    /// The jobs in the order added; kept contiguous so that a push needs no copy.
    jobs: Vec<Job>,
    /// One entry per job.
    state: Vec<State>,
    /// Job uuid to index, to refuse a uuid added twice and to match returned rows.
    index: HashMap<Uuid, usize>,
}

impl PendingJobs {
    /// Adds a job (a [`JobBuilder`](super::JobBuilder) or a [`Job`]) and returns its uuid,
    /// generated if none was set. Writes nothing: see [`PendingJobs::create_pending`].
    ///
    /// Refused with [`Error::InvalidJob`] naming the field when the job is invalid, or `uuid`
    /// when a job with the same uuid was already added.
    ///
    /// ```
    /// use jobrelay::producer::{JobBuilder, Producer};
    ///
    /// let mut jobs = Producer::default().pending();
    /// let uuid = jobs.add(JobBuilder::new("default", "SendMail").payload(b"hi".to_vec()))?;
    /// assert_eq!(uuid.get_version_num(), 4);
    /// let err = jobs.add(JobBuilder::new("no spaces", "SendMail")).unwrap_err();
    /// assert!(matches!(err, jobrelay::Error::InvalidJob { field: "queue", .. }));
    /// # Ok::<(), jobrelay::Error>(())
    /// ```
    pub fn add(&mut self, job: impl IntoJob) -> Result<Uuid> {
        let job = job.into_job()?;
        if self.index.contains_key(&job.uuid) {
            return Err(already_added(job.uuid));
        }
        Ok(self.push_job(job))
    }

    /// Adds several jobs, all or none: if one is refused, none is added. Returns their uuids
    /// in order.
    ///
    /// ```
    /// use jobrelay::producer::{JobBuilder, Producer};
    ///
    /// let mut jobs = Producer::default().pending();
    /// let uuids = jobs.add_all((1..=3).map(|i| {
    ///     JobBuilder::new("default", "Resize").json(&serde_json::json!({ "image": i }))
    /// }))?;
    /// assert_eq!(uuids.len(), 3);
    /// assert_eq!(jobs.len(), 3);
    /// # Ok::<(), jobrelay::Error>(())
    /// ```
    pub fn add_all<J: IntoJob>(&mut self, jobs: impl IntoIterator<Item = J>) -> Result<Vec<Uuid>> {
        let mut built = Vec::new();
        let mut seen = HashSet::new();
        for job in jobs {
            let job = job.into_job()?;
            if self.index.contains_key(&job.uuid) || !seen.insert(job.uuid) {
                return Err(already_added(job.uuid));
            }
            built.push(job);
        }
        Ok(built.into_iter().map(|job| self.push_job(job)).collect())
    }

    /// The jobs, in the order added.
    pub fn jobs(&self) -> &[Job] {
        &self.jobs
    }

    /// How many jobs were added.
    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    /// Whether no job was added.
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    /// The rows written by [`PendingJobs::create_pending`] and not deleted by this collection.
    pub fn rows(&self) -> Vec<RowRef> {
        self.jobs
            .iter()
            .zip(&self.state)
            .filter(|(_, s)| !s.deleted)
            .filter_map(|(j, s)| s.row.map(|id| RowRef { id, uuid: j.uuid }))
            .collect()
    }

    /// Writes a pending row for every job that has none yet, with ONE statement
    /// (`INSERT ... SELECT FROM unnest(...)`), and returns the new rows in the order the jobs
    /// were added (which is also their `id` order, the order a relay worker delivers them).
    ///
    /// Pass the caller's transaction as `&mut tx` (or `&mut *tx`): the rows then become visible
    /// (to the relay and to the fast path) only when it commits, and vanish if it rolls back. On
    /// a connection outside a transaction they are committed at once. Each job's `created_at`
    /// becomes the row's (the transaction's start), so the fast path and the relay push
    /// identical bytes.
    ///
    /// A failure (a CHECK constraint, a missing table, a lost connection) aborts the
    /// caller's transaction as any failed statement does; the collection is unchanged. With no
    /// job to write, nothing is sent.
    ///
    /// ```no_run
    /// # async fn demo(pool: sqlx::PgPool) -> Result<(), jobrelay::Error> {
    /// use jobrelay::producer::{JobBuilder, Producer};
    ///
    /// let mut jobs = Producer::default().pending();
    /// jobs.add(JobBuilder::new("default", "Reindex"))?;
    /// let mut tx = pool.begin().await?;
    /// let rows = jobs.create_pending(&mut tx).await?;
    /// tx.commit().await?;
    /// println!("row {} holds job {}", rows[0].id, rows[0].uuid);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn create_pending(&mut self, conn: &mut PgConnection) -> Result<Vec<RowRef>> {
        let todo: Vec<usize> = (0..self.jobs.len())
            .filter(|&i| self.state[i].row.is_none())
            .collect();
        if todo.is_empty() {
            return Ok(Vec::new());
        }
        let n = todo.len();
        let mut uuids = Vec::with_capacity(n);
        let mut queues = Vec::with_capacity(n);
        let mut job_types = Vec::with_capacity(n);
        let mut payloads = Vec::with_capacity(n);
        let mut parents = Vec::with_capacity(n);
        let mut predecessors = Vec::with_capacity(n);
        let mut dead_parents = Vec::with_capacity(n);
        let mut run_ats = Vec::with_capacity(n);
        let mut headers = Vec::with_capacity(n);
        for &i in &todo {
            let job = &self.jobs[i];
            uuids.push(job.uuid);
            queues.push(job.queue.as_str());
            job_types.push(job.job_type.as_str());
            payloads.push(job.payload.as_slice());
            parents.push(job.parent_uuid);
            predecessors.push(job.predecessor_uuid);
            dead_parents.push(job.dead_parent);
            run_ats.push(job.run_at);
            headers.push(job.headers_json());
        }
        let rows: Vec<(i64, Uuid, DateTime<Utc>)> = sqlx::query_as(&self.producer.inner.sql.insert)
            .bind(&uuids)
            .bind(&queues)
            .bind(&job_types)
            .bind(&payloads)
            .bind(&parents)
            .bind(&predecessors)
            .bind(&dead_parents)
            .bind(&run_ats)
            .bind(&headers)
            .fetch_all(conn)
            .await?;
        if rows.len() != n {
            // Only a rule or trigger on the table that swallows rows could do this.
            return Err(Error::Database(sqlx::Error::Protocol(format!(
                "inserted {} of {n} pending rows into {}",
                rows.len(),
                self.producer.inner.table
            ))));
        }
        let mut written = Vec::with_capacity(n);
        for (id, uuid, created_at) in rows {
            let Some(&i) = self.index.get(&uuid) else {
                return Err(Error::Database(sqlx::Error::Protocol(format!(
                    "the insert returned uuid {uuid}, which was not sent"
                ))));
            };
            self.state[i].row = Some(id);
            self.jobs[i].created_at = created_at;
            written.push((i, RowRef { id, uuid }));
        }
        written.sort_unstable_by_key(|(i, _)| *i);
        Ok(written.into_iter().map(|(_, r)| r).collect())
    }

    /// The fast path: pushes the jobs whose rows this collection wrote and that are still
    /// pending, then deletes the rows of the jobs Redis accepted; call it after the
    /// transaction of [`PendingJobs::create_pending`] committed.
    ///
    /// It works as the relay does, in a short transaction of its own on `db` (a `&PgPool`, or
    /// a `&mut PgConnection` that is not inside the producer's transaction): lock the rows by
    /// `(id, uuid)` with `FOR UPDATE SKIP LOCKED` (one statement), push them with the enqueue
    /// algorithm ([`Enqueuer::enqueue_batch`]: one atomic script call per 1,000 jobs, with the
    /// relay's dedup), delete the accepted ones (one statement), commit. Hence:
    ///
    /// - rows a running relay holds are skipped, not waited for; rows already relayed, or
    ///   never committed (the transaction rolled back), are not pushed ([`PushReport::skipped`]);
    /// - in a layout that holds rows until they are due (`--layout celery`), a job whose `run_at`
    ///   is still ahead is not pushed either ([`PushReport::skipped`]): its row waits for the relay;
    /// - a job the script refuses keeps its row, unchanged, for the relay
    ///   ([`PushReport::refused`]); the others are deleted;
    /// - [`Producer::push_timeout`] bounds each script call against one deadline: the jobs of
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
            .holds_until_due();
        let now = Utc::now();
        move |job: &Job| !holds || job.run_at.is_none_or(|t| t <= now)
    }

    fn push_job(&mut self, job: Job) -> Uuid {
        let uuid = job.uuid;
        self.index.insert(uuid, self.jobs.len());
        self.jobs.push(job);
        self.state.push(State::default());
        uuid
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

fn already_added(uuid: Uuid) -> Error {
    Error::invalid(
        "uuid",
        format!("a job with uuid {uuid} was already added to this collection"),
    )
}
