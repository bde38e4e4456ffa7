//! The Redis enqueue algorithm (docs/layouts/algorithm.md#the-enqueue-algorithm), as a library function.
//!
//! [`Enqueuer::enqueue_batch`] runs the algorithm for many jobs in one `EVALSHA` of the
//! layout's script ([`crate::broker::layout`]; loaded again whenever Redis answers `NOSCRIPT`, e.g.
//! after a restart). The script is atomic: a crash never leaves half of a job's writes behind. Inside it, each job is
//! checked (dedup marker, key types) before anything is written, so a job the script refuses
//! leaves no trace and its retry is not mistaken for a duplicate.

mod call;
mod chunks;

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::Value;

use self::call::Call;
use self::chunks::Chunks;
use crate::broker::layout::{Layout, LayoutKind};
use crate::defaults::{DEFAULT_BATCH_MAX_BYTES, DEFAULT_MAX_JOB_SIZE};
use crate::error::{Error, Result};
use crate::job::Job;
pub use crate::job::{JobResult, Outcome};

/// Jobs per script call. Bounds how long one call blocks Redis (a few milliseconds).
pub const MAX_JOBS_PER_CALL: usize = 1000;

/// Whether the enqueuer validates each job ([`Job::validate`]) before it marshals it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Checks {
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
    /// with the default size limits ([`DEFAULT_MAX_JOB_SIZE`], [`DEFAULT_BATCH_MAX_BYTES`]).
    pub fn new(namespace: impl Into<String>, dedup_ttl: Duration) -> Self {
        let layout = LayoutKind::Jobrelay.layout();
        Enqueuer {
            layout,
            namespace: namespace.into(),
            dedup_ttl_ms: dedup_ttl.as_millis().try_into().unwrap_or(u64::MAX),
            max_job_bytes: DEFAULT_MAX_JOB_SIZE,
            max_call_bytes: DEFAULT_BATCH_MAX_BYTES,
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

    /// What the layout's runner needs of the relay's claim.
    pub fn claim_needs(&self) -> crate::sink::ClaimNeeds {
        self.layout.claim_needs()
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

    /// The enqueue path: the jobs go out in chunks ([`Chunks`]: marshalled, checked, at most
    /// [`MAX_JOBS_PER_CALL`] jobs and the byte limit each), one atomic call per chunk, each
    /// bounded by `deadline`; each answer gives its jobs their results.
    async fn enqueue_checked<C: ConnectionLike + Send>(
        &self,
        con: &mut C,
        jobs: &[Job],
        deadline: Option<(tokio::time::Instant, Duration)>,
        checks: Checks,
    ) -> Result<Vec<JobResult>> {
        let mut results: Vec<Option<JobResult>> = Vec::with_capacity(jobs.len());
        results.resize_with(jobs.len(), || None);
        let mut chunks = Chunks::new(self, jobs, checks);
        let mut acknowledged = false;
        while let Some(chunk) = chunks.next(&mut results) {
            let answer = self
                .call_until(con, &chunk.call, &chunk.sent, jobs, &mut results, deadline)
                .await;
            if let Err(e) = answer {
                return unacknowledged_from(e, acknowledged, &chunk.sent, jobs, results);
            }
            chunks.answered(&chunk.sent, &results);
            acknowledged = true;
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
            if let Some(behind) = held_behind(&value) {
                // Held by the script behind a refused job of its key (prelude.lua).
                let behind = sent
                    .get(behind)
                    .map_or(uuid::Uuid::nil(), |&b| jobs[b].uuid);
                results[i] = Some(Err(Error::Held {
                    uuid: jobs[i].uuid,
                    key: jobs[i].ordering_key.clone().unwrap_or_default(),
                    behind,
                }));
                continue;
            }
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

/// The place in the call of the refused job a script's `HELD <i>` answer names.
fn held_behind(value: &Value) -> Option<usize> {
    let text = match value {
        Value::BulkString(b) => std::str::from_utf8(b).ok()?,
        Value::SimpleString(s) => s.as_str(),
        _ => return None,
    };
    text.strip_prefix("HELD ")?.parse().ok()
}

fn refused(job: &Job, message: String) -> Error {
    Error::Refused {
        uuid: job.uuid,
        message,
    }
}

#[cfg(test)]
mod tests;
