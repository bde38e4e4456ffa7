//! Collecting a transaction's jobs and writing their rows in it; the fast path after the
//! commit is in [`fast_path`].

mod fast_path;

pub use self::fast_path::{FastPathError, PushReport, Stage};

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

use super::builder::IntoJob;
use super::settings::Producer;
use crate::error::{Error, Result};
use crate::job::Job;

/// A pending row written by [`PendingJobs::create_pending`]: its `id` (claim order) and the
/// job's `uuid`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RowRef {
    /// The row's `id`.
    pub id: i64,
    /// The job's uuid (the row's `uuid`).
    pub uuid: Uuid,
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

impl Producer {
    /// An empty collection of jobs, for one transaction.
    pub fn pending(&self) -> PendingJobs {
        PendingJobs {
            producer: self.clone(),
            jobs: Vec::new(),
            state: Vec::new(),
            index: HashMap::new(),
        }
    }
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
        let mut options = Vec::with_capacity(n);
        let mut ordering_keys = Vec::with_capacity(n);
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
            options.push(job.options_json());
            ordering_keys.push(job.ordering_key.as_deref());
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
            .bind(&options)
            .bind(&ordering_keys)
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

    fn push_job(&mut self, job: Job) -> Uuid {
        let uuid = job.uuid;
        self.index.insert(uuid, self.jobs.len());
        self.jobs.push(job);
        self.state.push(State::default());
        uuid
    }
}

fn already_added(uuid: Uuid) -> Error {
    Error::invalid(
        "uuid",
        format!("a job with uuid {uuid} was already added to this collection"),
    )
}
