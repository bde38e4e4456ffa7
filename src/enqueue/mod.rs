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

const SCRIPT: &str = include_str!("enqueue.lua");

/// Runs the enqueue algorithm against one Redis, under one key namespace.
///
/// Cheap to clone; holds no connection. Pass any redis-rs async connection
/// (`MultiplexedConnection`, `ConnectionManager`, ...) to its methods.
#[derive(Clone, Debug)]
pub struct Enqueuer {
    namespace: String,
    dedup_ttl_ms: u64,
    script: redis::Script,
}

/// What one job in a batch came to: an [`Outcome`], or a per-job or permanent [`Error`].
pub type JobResult = Result<Outcome>;

impl Enqueuer {
    /// An enqueuer writing keys under `namespace` (e.g. `"app1:"`, or `""` for none) whose
    /// dedup markers expire after `dedup_ttl` (`Duration::ZERO`: never).
    pub fn new(namespace: impl Into<String>, dedup_ttl: Duration) -> Self {
        Enqueuer {
            namespace: namespace.into(),
            dedup_ttl_ms: dedup_ttl.as_millis().try_into().unwrap_or(u64::MAX),
            script: redis::Script::new(SCRIPT),
        }
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
    /// The outer `Err` means the call as a whole failed (Redis unreachable, timeout, READONLY,
    /// ...): some jobs may have been written, each completely, with its marker. Retrying the
    /// same jobs is safe; those turn into [`Outcome::Duplicate`]. An inner `Err` concerns one
    /// job: [`Error::InvalidJob`] (permanent, nothing sent) or [`Error::Refused`] (the script
    /// refused it, nothing written).
    pub async fn enqueue_batch<C: ConnectionLike + Send>(
        &self,
        con: &mut C,
        jobs: &[Job],
    ) -> Result<Vec<JobResult>> {
        let mut results: Vec<Option<JobResult>> = Vec::with_capacity(jobs.len());
        // Indexes (into `jobs`) of the jobs sent in the current call.
        let mut sent: Vec<usize> = Vec::with_capacity(jobs.len().min(MAX_JOBS_PER_CALL));
        let mut invocation = self.new_invocation();
        let mut buf = Vec::new();
        // The key and route arguments are built in this one buffer, which the invocation
        // copies from: no `String` of its own for each key or route.
        let mut scratch = String::new();
        for (i, job) in jobs.iter().enumerate() {
            match job.validate().and_then(|()| {
                buf.clear();
                job.marshal_into(&mut buf)
            }) {
                Err(e) => results.push(Some(Err(e))),
                Ok(()) => {
                    results.push(None);
                    self.add_job(&mut invocation, job, &buf, &mut scratch);
                    sent.push(i);
                    if sent.len() == MAX_JOBS_PER_CALL {
                        self.call(con, &invocation, &sent, jobs, &mut results)
                            .await?;
                        sent.clear();
                        invocation = self.new_invocation();
                    }
                }
            }
        }
        if !sent.is_empty() {
            self.call(con, &invocation, &sent, jobs, &mut results)
                .await?;
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

/// Whether a Redis error says "try again later" (the whole call failed for reasons outside the
/// jobs), as opposed to an error about what was sent.
///
/// Transient: the connection failed (refused, reset, timed out); the server cannot take writes
/// now (`READONLY` replica, `LOADING`, `MASTERDOWN`, `MISCONF` after a failed save, `OOM`,
/// `NOREPLICAS`, `BUSY` script, cluster `TRYAGAIN`/`CLUSTERDOWN`); or the connection is not
/// allowed to (`NOAUTH`, `WRONGPASS`, `NOPERM`): an operator fixes those, not the job, so they
/// must not count attempts against every row and dead-letter the backlog.
pub fn is_transient(e: &redis::RedisError) -> bool {
    use redis::ErrorKind as K;
    if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal() {
        return true;
    }
    match e.kind() {
        K::ReadOnly
        | K::BusyLoadingError
        | K::MasterDown
        | K::TryAgain
        | K::ClusterDown
        | K::AuthenticationFailed
        | K::NoScriptError
        | K::IoError => true,
        _ => matches!(
            e.code(),
            Some(
                "OOM"
                    | "BUSY"
                    | "LOADING"
                    | "READONLY"
                    | "MASTERDOWN"
                    | "MISCONF"
                    | "NOREPLICAS"
                    | "NOAUTH"
                    | "WRONGPASS"
                    | "NOPERM"
            )
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::is_transient;

    fn server_error(line: &str) -> redis::RedisError {
        let reply = format!("-{line}\r\n");
        match redis::parse_redis_value(reply.as_bytes()) {
            Ok(redis::Value::ServerError(e)) => e.into(),
            other => panic!("{line:?} parsed as {other:?}"),
        }
    }

    #[test]
    fn outages_are_transient_and_job_errors_are_not() {
        for line in [
            "READONLY You can't write against a read only replica.",
            "LOADING Redis is loading the dataset in memory",
            "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
            "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.",
            "OOM command not allowed when used memory > 'maxmemory'.",
            "NOREPLICAS Not enough good replicas to write.",
            "BUSY Redis is busy running a script.",
            "NOAUTH Authentication required.",
            "NOPERM this user has no permissions to run the 'evalsha' command",
            "TRYAGAIN Multiple keys request during rehashing of slot",
            "CLUSTERDOWN The cluster is down",
        ] {
            assert!(is_transient(&server_error(line)), "{line}");
        }
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(is_transient(&redis::RedisError::from(io)));
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(is_transient(&redis::RedisError::from(io)));
        for line in [
            "WRONGTYPE Operation against a key holding the wrong kind of value",
            "ERR Error running script (call to f_x): @user_script:1: user_script:1: bad argument",
        ] {
            assert!(!is_transient(&server_error(line)), "{line}");
        }
    }
}
