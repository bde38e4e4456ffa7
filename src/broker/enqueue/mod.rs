//! The Redis enqueue algorithm (docs/layouts/algorithm.md#the-enqueue-algorithm), as a library function.
//!
//! [`Enqueuer::enqueue_batch`] runs the algorithm for many jobs in one `EVALSHA` of the
//! layout's script ([`crate::broker::layout`]; loaded again whenever Redis answers `NOSCRIPT`, e.g.
//! after a restart). The script is atomic: a crash never leaves half of a job's writes behind. Inside it, each job is
//! checked (dedup marker, key types) before anything is written, so a job the script refuses
//! leaves no trace and its retry is not mistaken for a duplicate.

mod call;

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::Value;

use self::call::Call;
use crate::broker::layout::{Layout, LayoutKind};
use crate::error::{Error, Result};
use crate::job::Job;
pub use crate::job::{JobResult, Outcome};

/// Jobs per script call. Bounds how long one call blocks Redis (a few milliseconds).
pub const MAX_JOBS_PER_CALL: usize = 1000;

/// Default `--max-job-size`: the largest marshalled job relayed (larger ones are dead-lettered
/// as permanent failures). Measured: docs/benchmarks.md#the-byte-cap-and-the-job-size-limit.
pub const DEFAULT_MAX_JOB_BYTES: usize = 8 * 1024 * 1024;

/// Default bytes per script call and per batch (`--batch-max-bytes`). Measured:
/// docs/benchmarks.md#the-byte-cap-and-the-job-size-limit.
pub const DEFAULT_MAX_CALL_BYTES: usize = 8 * 1024 * 1024;

/// Whether the enqueuer validates each job ([`Job::validate`]) before it marshals it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Checks {
    /// Every public entry point: the caller's jobs may be anything.
    Validate,
    /// The relay's jobs, validated once as their rows became jobs.
    AlreadyValid,
}

/// Runs the enqueue algorithm against one Redis, under one key namespace.
///
/// Cheap to clone; holds no connection. Pass any redis-rs async connection
/// (`MultiplexedConnection`, `ConnectionManager`, ...) to its methods.
#[derive(Clone, Debug)]
pub struct Enqueuer {
    layout: &'static dyn Layout,
    namespace: String,
    dedup_ttl_ms: u64,
    max_job_bytes: usize,
    max_call_bytes: usize,
    script: redis::Script,
    repair: Option<redis::Script>,
}

impl Enqueuer {
    /// An enqueuer writing the `jobrelay` layout's keys under `namespace` (e.g. `"app1:"`, or
    /// `""` for none) whose dedup markers expire after `dedup_ttl` (`Duration::ZERO`: never),
    /// with the default size limits ([`DEFAULT_MAX_JOB_BYTES`], [`DEFAULT_MAX_CALL_BYTES`]).
    pub fn new(namespace: impl Into<String>, dedup_ttl: Duration) -> Self {
        let layout = LayoutKind::Jobrelay.layout();
        Enqueuer {
            layout,
            namespace: namespace.into(),
            dedup_ttl_ms: dedup_ttl.as_millis().try_into().unwrap_or(u64::MAX),
            max_job_bytes: DEFAULT_MAX_JOB_BYTES,
            max_call_bytes: DEFAULT_MAX_CALL_BYTES,
            script: redis::Script::new(layout.script()),
            repair: layout.repair_script().map(redis::Script::new),
        }
    }

    /// The same enqueuer with markers that expire after `dedup_ttl` (`Duration::ZERO`: never).
    pub fn with_dedup_ttl(mut self, dedup_ttl: Duration) -> Self {
        self.dedup_ttl_ms = dedup_ttl.as_millis().try_into().unwrap_or(u64::MAX);
        self
    }

    /// The same enqueuer writing another layout's keys and wire format.
    pub fn with_layout(mut self, layout: LayoutKind) -> Self {
        self.layout = layout.layout();
        self.script = redis::Script::new(self.layout.script());
        self.repair = self.layout.repair_script().map(redis::Script::new);
        self
    }

    /// The layout.
    pub fn layout(&self) -> LayoutKind {
        self.layout.kind()
    }

    /// Whether the layout needs [`Enqueuer::repair`] run regularly.
    pub fn needs_repair(&self) -> bool {
        self.repair.is_some()
    }

    /// Runs the layout's housekeeping once (nothing for a layout without any): in the conveyor
    /// layout, sets free the children and heirs stranded in the lists of a job whose close
    /// raced their push, for jobs watched at least `grace` ago, at most `limit` of them. The
    /// number of jobs set free (relayed as [`Outcome::Late`]).
    pub async fn repair<C: ConnectionLike + Send>(
        &self,
        con: &mut C,
        grace: Duration,
        limit: usize,
    ) -> Result<u64> {
        let Some(script) = &self.repair else {
            return Ok(0);
        };
        // The watch set, declared: a Redis Cluster routes the call by it (conveyor_repair.lua).
        Ok(script
            .key(format!("{}jobrelay:watch", self.namespace))
            .arg(&self.namespace)
            .arg(grace.as_millis() as u64)
            .arg(limit)
            .arg(self.dedup_ttl_ms)
            .invoke_async(con)
            .await?)
    }

    /// The dedup marker's key of a job; `None` in a layout whose markers are members of sets
    /// (the bullmq and rq layouts: [`crate::broker::layout::Layout::marks_in_sets`]).
    pub fn marker_key(&self, uuid: uuid::Uuid) -> Option<String> {
        if self.layout.marks_in_sets() {
            return None;
        }
        Some(self.layout.marker_key(&self.namespace, uuid))
    }

    /// The key of a queue's list.
    pub fn queue_key(&self, queue: &str) -> String {
        self.layout.queue_key(&self.namespace, queue)
    }

    /// The same enqueuer with other size limits: a job whose marshalled form exceeds
    /// `max_job_bytes` fails as [`Error::TooLarge`] (permanent, nothing sent), and one script
    /// call carries at most `max_call_bytes` (except a single job, which is never split).
    pub fn with_limits(mut self, max_job_bytes: usize, max_call_bytes: usize) -> Self {
        self.max_job_bytes = max_job_bytes.max(1);
        self.max_call_bytes = max_call_bytes.max(1);
        self
    }

    /// The key namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Enqueues one job; see [`Enqueuer::enqueue_batch`].
    pub async fn enqueue<C: ConnectionLike + Send>(
        &self,
        con: &mut C,
        job: &Job,
    ) -> Result<Outcome> {
        let mut results = self.enqueue_batch(con, std::slice::from_ref(job)).await?;
        results.pop().expect("one result per job")
    }

    /// Enqueues many jobs: one result per job, in the order given.
    ///
    /// The jobs go out in script calls of at most [`MAX_JOBS_PER_CALL`] jobs and the byte
    /// limit; each call is atomic. The outer `Err` means the first call failed (Redis
    /// unreachable, timeout, READONLY, OOM, ...): no job is acknowledged, though some may have
    /// been written, each completely, with its marker; retrying them is safe (they turn into
    /// [`Outcome::Duplicate`]). When a later call fails, the jobs of the calls before it keep
    /// their outcomes (Redis acknowledged them), and every job from the failed call on is
    /// [`Error::Unacknowledged`] (transient). An inner `Err` may also concern one job:
    /// [`Error::InvalidJob`] or [`Error::TooLarge`] (permanent, nothing sent) or
    /// [`Error::Refused`] (the script refused it, nothing written).
    pub async fn enqueue_batch<C: ConnectionLike + Send>(
        &self,
        con: &mut C,
        jobs: &[Job],
    ) -> Result<Vec<JobResult>> {
        self.enqueue_batch_until(con, jobs, None).await
    }

    /// [`Enqueuer::enqueue_batch`] with each script call bounded by `deadline` (an instant,
    /// and the timeout it came from, for the error): a call still unanswered then fails as
    /// [`Error::Timeout`], like any other failed call. So the jobs of the calls Redis answered
    /// keep their outcomes (the caller commits them) and only the rest are
    /// [`Error::Unacknowledged`]; if the first call times out, the outer `Err`.
    pub async fn enqueue_batch_until<C: ConnectionLike + Send>(
        &self,
        con: &mut C,
        jobs: &[Job],
        deadline: Option<(tokio::time::Instant, Duration)>,
    ) -> Result<Vec<JobResult>> {
        self.enqueue_checked(con, jobs, deadline, Checks::Validate)
            .await
    }

    /// [`Enqueuer::enqueue_batch_until`] for jobs their caller has validated (the checks of
    /// [`Job::validate`]): the relay's, whose rows are validated once, as they become jobs
    /// (`relay::row`). The other checks (the layout, the size) are made as always.
    pub(crate) async fn enqueue_validated_until<C: ConnectionLike + Send>(
        &self,
        con: &mut C,
        jobs: &[Job],
        deadline: Option<(tokio::time::Instant, Duration)>,
    ) -> Result<Vec<JobResult>> {
        self.enqueue_checked(con, jobs, deadline, Checks::AlreadyValid)
            .await
    }

    async fn enqueue_checked<C: ConnectionLike + Send>(
        &self,
        con: &mut C,
        jobs: &[Job],
        deadline: Option<(tokio::time::Instant, Duration)>,
        checks: Checks,
    ) -> Result<Vec<JobResult>> {
        let mut results: Vec<Option<JobResult>> = Vec::with_capacity(jobs.len());
        results.resize_with(jobs.len(), || None);
        let order = if self.layout.orders_flows() {
            dependents_first(jobs)
        } else {
            (0..jobs.len()).collect()
        };
        // Indexes (into `jobs`) of the jobs in the current call, and the call's size.
        let mut sent: Vec<usize> = Vec::with_capacity(jobs.len().min(MAX_JOBS_PER_CALL));
        let mut call_bytes = 0;
        let mut acknowledged = false;
        let mut call = self.new_call();
        let mut buf = Vec::new();
        // The key and route arguments are built in this one buffer, which the invocation
        // copies from: no `String` of its own for each key or route.
        let mut scratch = String::new();
        for i in order {
            let job = &jobs[i];
            buf.clear();
            if let Err(e) = self.marshal_checked(job, &mut buf, checks) {
                results[i] = Some(Err(e));
                continue;
            }
            let size = buf.len() + self.layout.args_overhead(&self.namespace, job, buf.len());
            if !sent.is_empty()
                && (sent.len() == MAX_JOBS_PER_CALL || call_bytes + size > self.max_call_bytes)
            {
                let answer = self
                    .call_until(con, &call, &sent, jobs, &mut results, deadline)
                    .await;
                if let Err(e) = answer {
                    return unacknowledged_from(e, acknowledged, &sent, jobs, results);
                }
                acknowledged = true;
                sent.clear();
                call_bytes = 0;
                call = self.new_call();
            }
            call.push(job, &buf, &mut scratch);
            sent.push(i);
            call_bytes += size;
        }
        if !sent.is_empty() {
            let answer = self
                .call_until(con, &call, &sent, jobs, &mut results, deadline)
                .await;
            if let Err(e) = answer {
                return unacknowledged_from(e, acknowledged, &sent, jobs, results);
            }
        }
        Ok(results
            .into_iter()
            .map(|r| r.expect("every job has a result"))
            .collect())
    }

    /// [`Enqueuer::enqueue_batch_until`] `timeout` from now: a first call unanswered by then
    /// fails the push as [`Error::Timeout`] (transient; its jobs may or may not have landed,
    /// each whole); the calls answered before keep their outcomes.
    pub async fn enqueue_batch_within<C: ConnectionLike + Send>(
        &self,
        con: &mut C,
        jobs: &[Job],
        timeout: Duration,
    ) -> Result<Vec<JobResult>> {
        let deadline = tokio::time::Instant::now() + timeout;
        self.enqueue_batch_until(con, jobs, Some((deadline, timeout)))
            .await
    }

    /// Validates (unless `checks` says it is) and marshals `job` into `buf`, refusing one the
    /// layout cannot express or over the size limit.
    fn marshal_checked(&self, job: &Job, buf: &mut Vec<u8>, checks: Checks) -> Result<()> {
        if checks == Checks::Validate {
            job.validate()?;
        }
        self.layout
            .encode(job, buf)
            .map_err(|reason| Error::Unfit {
                uuid: job.uuid,
                layout: self.layout.kind(),
                reason,
            })?;
        if buf.len() > self.max_job_bytes {
            return Err(Error::TooLarge {
                uuid: job.uuid,
                size: buf.len(),
                max: self.max_job_bytes,
            });
        }
        Ok(())
    }

    fn new_call(&self) -> Call<'_> {
        Call::new(
            self.layout,
            &self.script,
            &self.namespace,
            self.dedup_ttl_ms,
        )
    }

    async fn call_until<C: ConnectionLike + Send>(
        &self,
        con: &mut C,
        call: &Call<'_>,
        sent: &[usize],
        jobs: &[Job],
        results: &mut [Option<JobResult>],
        deadline: Option<(tokio::time::Instant, Duration)>,
    ) -> Result<()> {
        let call = self.call(con, call, sent, jobs, results);
        match deadline {
            None => call.await,
            Some((at, after)) => {
                tokio::time::timeout_at(at, call)
                    .await
                    .unwrap_or(Err(Error::Timeout {
                        dependency: crate::error::Dependency::Redis,
                        what: "redis push",
                        after,
                    }))
            }
        }
    }

    async fn call<C: ConnectionLike + Send>(
        &self,
        con: &mut C,
        call: &Call<'_>,
        sent: &[usize],
        jobs: &[Job],
        results: &mut [Option<JobResult>],
    ) -> Result<()> {
        let reply = call.send(con).await?;
        if reply.len() != sent.len() {
            return Err(Error::Contract {
                dependency: Some(crate::error::Dependency::Redis),
                what: "enqueue script answered the wrong number of results",
                detail: format!("{} results for {} jobs", reply.len(), sent.len()),
            });
        }
        for (&i, value) in sent.iter().zip(reply) {
            results[i] = Some(match value {
                Value::Int(code) => Outcome::from_code(code)
                    .ok_or_else(|| refused(&jobs[i], format!("unknown outcome code {code}"))),
                Value::BulkString(msg) => Err(refused(
                    &jobs[i],
                    String::from_utf8_lossy(&msg).into_owned(),
                )),
                Value::SimpleString(msg) => Err(refused(&jobs[i], msg)),
                other => Err(refused(&jobs[i], format!("unexpected reply {other:?}"))),
            });
        }
        Ok(())
    }
}

/// Ends a batch whose call over `failed` (indexes into `jobs`) failed with `e`: the outer error
/// when nothing was acknowledged yet, otherwise every job without a result (the failed call's
/// and the ones never sent) becomes [`Error::Unacknowledged`].
fn unacknowledged_from(
    e: Error,
    acknowledged: bool,
    failed: &[usize],
    jobs: &[Job],
    results: Vec<Option<JobResult>>,
) -> Result<Vec<JobResult>> {
    if !acknowledged {
        return Err(e);
    }
    debug_assert!(failed.iter().all(|&i| results[i].is_none()));
    let (reason, message) = (e.reason(), e.to_string());
    Ok(results
        .into_iter()
        .zip(jobs)
        .map(|(r, job)| {
            r.unwrap_or_else(|| {
                Err(Error::Unacknowledged {
                    uuid: job.uuid,
                    reason,
                    message: message.clone(),
                })
            })
        })
        .collect())
}

fn refused(job: &Job, message: String) -> Error {
    Error::Refused {
        uuid: job.uuid,
        message,
    }
}

/// Indexes of `jobs` in an order where every job comes before the job it names as its parent
/// or predecessor, when both are among `jobs` (otherwise in the order given): should the batch
/// be split over several script calls, a child never reaches Redis after its parent, which
/// could have finished meanwhile. Chains deeper than [`MAX_FLOW_DEPTH`], and cycles, keep the
/// order reached by then.
fn dependents_first(jobs: &[Job]) -> Vec<usize> {
    use std::collections::HashMap;
    if !jobs
        .iter()
        .any(|j| j.parent_uuid.is_some() || j.predecessor_uuid.is_some())
    {
        // Nothing names anything: the order given (the common batch pays no map).
        return (0..jobs.len()).collect();
    }
    let position: HashMap<uuid::Uuid, usize> =
        jobs.iter().enumerate().map(|(i, j)| (j.uuid, i)).collect();
    let anchors: Vec<(usize, usize)> = jobs
        .iter()
        .enumerate()
        .flat_map(|(i, j)| {
            [j.parent_uuid, j.predecessor_uuid]
                .into_iter()
                .flatten()
                .filter_map(|a| position.get(&a).copied())
                .filter(move |&a| a != i)
                .map(move |a| (i, a))
        })
        .collect();
    // level(anchor) > level(dependent); dependents first.
    let mut level = vec![0usize; jobs.len()];
    for _ in 0..MAX_FLOW_DEPTH {
        let mut changed = false;
        for &(dependent, anchor) in &anchors {
            if level[anchor] <= level[dependent] {
                level[anchor] = level[dependent] + 1;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by_key(|&i| level[i]);
    order
}

/// How deep a chain of parents and predecessors within one batch [`dependents_first`] orders.
const MAX_FLOW_DEPTH: usize = 64;

#[cfg(test)]
mod tests;
