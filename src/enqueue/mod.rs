//! The Redis enqueue algorithm (SPEC 5.1), as a library function.
//!
//! [`Enqueuer::enqueue_batch`] runs steps 3-8 for many jobs in one `EVALSHA` of
//! `enqueue.lua` (loaded again whenever Redis answers `NOSCRIPT`, e.g. after a restart). The
//! script is atomic: a crash never leaves half of a job's writes behind. Inside it, each job is
//! checked (dedup marker, key types) before anything is written, so a job the script refuses
//! leaves no trace and its retry is not mistaken for a duplicate.

mod outcome;

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::Value;

pub use self::outcome::Outcome;
use crate::error::{Error, Result};
use crate::job::{epoch_score, Job};

/// Jobs per script call. Bounds how long one call blocks Redis (a few milliseconds).
pub const MAX_JOBS_PER_CALL: usize = 1000;

/// Default `--max-job-size`: the largest marshalled job relayed (larger ones are dead-lettered
/// as permanent failures). See the README's measurements.
pub const DEFAULT_MAX_JOB_BYTES: usize = 8 * 1024 * 1024;

/// Default bytes per script call and per batch (`--batch-max-bytes`). See the README's
/// measurements.
pub const DEFAULT_MAX_CALL_BYTES: usize = 8 * 1024 * 1024;

/// What one job adds to a script call besides its marshalled bytes, the namespace (twice) and
/// its queue name, all counted separately: an upper bound, so that a call never carries more
/// than its byte limit. The marker key `jobs:<uuid>` (41 bytes), the queue key's `queue:` (6),
/// the longest route `1|<uuid>|<uuid>|<score>` (76 plus a score of at most 24 characters), and
/// the framing of the four bulk strings, `$<len>\r\n...\r\n` (5 each plus the digits of their
/// lengths: at most 3, 3, 3 and 10): 186.
const ARGS_OVERHEAD: usize = 192;

const SCRIPT: &str = include_str!("enqueue.lua");

/// Runs the enqueue algorithm against one Redis, under one key namespace.
///
/// Cheap to clone; holds no connection. Pass any redis-rs async connection
/// (`MultiplexedConnection`, `ConnectionManager`, ...) to its methods.
#[derive(Clone, Debug)]
pub struct Enqueuer {
    namespace: String,
    dedup_ttl_ms: u64,
    max_job_bytes: usize,
    max_call_bytes: usize,
    script: redis::Script,
}

/// What one job in a batch came to: an [`Outcome`], or a per-job or permanent [`Error`].
pub type JobResult = Result<Outcome>;

impl Enqueuer {
    /// An enqueuer writing keys under `namespace` (e.g. `"app1:"`, or `""` for none) whose
    /// dedup markers expire after `dedup_ttl` (`Duration::ZERO`: never), with the default
    /// size limits ([`DEFAULT_MAX_JOB_BYTES`], [`DEFAULT_MAX_CALL_BYTES`]).
    pub fn new(namespace: impl Into<String>, dedup_ttl: Duration) -> Self {
        Enqueuer {
            namespace: namespace.into(),
            dedup_ttl_ms: dedup_ttl.as_millis().try_into().unwrap_or(u64::MAX),
            max_job_bytes: DEFAULT_MAX_JOB_BYTES,
            max_call_bytes: DEFAULT_MAX_CALL_BYTES,
            script: redis::Script::new(SCRIPT),
        }
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
        let mut results: Vec<Option<JobResult>> = Vec::with_capacity(jobs.len());
        // Indexes (into `jobs`) of the jobs in the current call, and the call's size.
        let mut sent: Vec<usize> = Vec::with_capacity(jobs.len().min(MAX_JOBS_PER_CALL));
        let mut call_bytes = 0;
        let mut acknowledged = false;
        let mut invocation = self.new_invocation();
        let mut buf = Vec::new();
        // The key and route arguments are built in this one buffer, which the invocation
        // copies from: no `String` of its own for each key or route.
        let mut scratch = String::new();
        for (i, job) in jobs.iter().enumerate() {
            buf.clear();
            if let Err(e) = self.marshal_checked(job, &mut buf) {
                results.push(Some(Err(e)));
                continue;
            }
            let size = buf.len() + 2 * self.namespace.len() + job.queue.len() + ARGS_OVERHEAD;
            if !sent.is_empty()
                && (sent.len() == MAX_JOBS_PER_CALL || call_bytes + size > self.max_call_bytes)
            {
                let call = self.call(con, &invocation, &sent, jobs, &mut results).await;
                if let Err(e) = call {
                    return unacknowledged_from(e, acknowledged, &sent, jobs, results);
                }
                acknowledged = true;
                sent.clear();
                call_bytes = 0;
                invocation = self.new_invocation();
            }
            results.push(None);
            self.add_job(&mut invocation, job, &buf, &mut scratch);
            sent.push(i);
            call_bytes += size;
        }
        if !sent.is_empty() {
            let call = self.call(con, &invocation, &sent, jobs, &mut results).await;
            if let Err(e) = call {
                return unacknowledged_from(e, acknowledged, &sent, jobs, results);
            }
        }
        Ok(results
            .into_iter()
            .map(|r| r.expect("every job has a result"))
            .collect())
    }

    /// [`Enqueuer::enqueue_batch`] bounded by `timeout`: past it, the call fails as
    /// [`Error::Timeout`] (transient; the jobs may or may not have landed, each whole).
    pub async fn enqueue_batch_within<C: ConnectionLike + Send>(
        &self,
        con: &mut C,
        jobs: &[Job],
        timeout: Duration,
    ) -> Result<Vec<JobResult>> {
        tokio::time::timeout(timeout, self.enqueue_batch(con, jobs))
            .await
            .map_err(|_| Error::Timeout {
                what: "redis push",
                after: timeout,
            })?
    }

    /// Validates and marshals `job` into `buf`, refusing one over the size limit.
    fn marshal_checked(&self, job: &Job, buf: &mut Vec<u8>) -> Result<()> {
        job.validate()?;
        job.marshal_into(buf)?;
        if buf.len() > self.max_job_bytes {
            return Err(Error::TooLarge {
                uuid: job.uuid,
                size: buf.len(),
                max: self.max_job_bytes,
            });
        }
        Ok(())
    }

    fn new_invocation(&self) -> redis::ScriptInvocation<'_> {
        let mut inv = self.script.prepare_invoke();
        inv.arg(&self.namespace).arg(self.dedup_ttl_ms);
        inv
    }

    fn add_job(
        &self,
        inv: &mut redis::ScriptInvocation<'_>,
        job: &Job,
        marshalled: &[u8],
        key: &mut String,
    ) {
        use std::fmt::Write as _;
        let mut uuid = uuid::Uuid::encode_buffer();
        key.clear();
        key.push_str(&self.namespace);
        key.push_str("jobs:");
        key.push_str(job.uuid.hyphenated().encode_lower(&mut uuid));
        inv.arg(&*key);
        key.truncate(self.namespace.len());
        key.push_str("queue:");
        key.push_str(&job.queue);
        inv.arg(&*key);
        // The route: empty for the common case (nothing but the queue), which the script
        // takes without parsing; see enqueue.lua.
        key.clear();
        if job.parent_uuid.is_some()
            || job.predecessor_uuid.is_some()
            || job.run_at.is_some()
            || job.dead_parent
        {
            let mut parent = uuid::Uuid::encode_buffer();
            let mut pred = uuid::Uuid::encode_buffer();
            let _ = write!(
                key,
                "{}|{}|{}|{}",
                if job.dead_parent { "1" } else { "0" },
                uuid_arg(job.parent_uuid, &mut parent),
                uuid_arg(job.predecessor_uuid, &mut pred),
                job.run_at.map(epoch_score).unwrap_or_default()
            );
        }
        inv.arg(&*key).arg(marshalled);
    }

    async fn call<C: ConnectionLike + Send>(
        &self,
        con: &mut C,
        inv: &redis::ScriptInvocation<'_>,
        sent: &[usize],
        jobs: &[Job],
        results: &mut [Option<JobResult>],
    ) -> Result<()> {
        let reply: Vec<Value> = inv.invoke_async(con).await?;
        if reply.len() != sent.len() {
            return Err(Error::Redis(redis::RedisError::from((
                redis::ErrorKind::TypeError,
                "enqueue script answered the wrong number of results",
                format!("{} results for {} jobs", reply.len(), sent.len()),
            ))));
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
    mut results: Vec<Option<JobResult>>,
) -> Result<Vec<JobResult>> {
    if !acknowledged {
        return Err(e);
    }
    debug_assert!(failed.iter().all(|&i| results[i].is_none()));
    let (reason, message) = (e.reason(), e.to_string());
    results.resize_with(jobs.len(), || None);
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

fn uuid_arg(u: Option<uuid::Uuid>, buf: &mut [u8; 45]) -> &str {
    match u {
        Some(u) => u.hyphenated().encode_lower(buf),
        None => "",
    }
}

fn refused(job: &Job, message: String) -> Error {
    Error::Refused {
        uuid: job.uuid,
        message,
    }
}
