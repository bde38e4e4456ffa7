//! [`RedisSink`]: the claim loop's jobs into Redis, through the layout's enqueue script, with
//! the push bounded in time and a request Redis rejects isolated job by job; never into a Redis
//! that evicts keys (unless allowed), and with `--redis-wait-replicas`, acknowledged only once
//! enough replicas have the writes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::broker::connection::RedisConnection;
use crate::broker::enqueue::{Enqueuer, JobResult};
use crate::broker::safety::{self, Eviction, RedisSafety};
use crate::error::{Error, Reason, Result};
use crate::job::Job;
use crate::sink::{ClaimNeeds, JobSink};

/// How long a sink trusts what it last learnt of the `maxmemory-policy` (the probe looks every
/// second): a policy changed at runtime stops the pushes within this.
pub const EVICTION_RECHECK: Duration = Duration::from_secs(5);

/// A sink's last look at the `maxmemory-policy`, shared by its clones.
#[derive(Debug, Default)]
struct EvictionWatch {
    last: Mutex<Option<(Instant, Eviction)>>,
}

/// A [`JobSink`] that runs the enqueue algorithm on a Redis connection, bounded by a timeout.
///
/// When Redis answers a call with an error about the request itself, or closes the connection
/// on it while it still answers a `PING`, the jobs concerned are pushed one by one, so that the
/// job at fault fails alone ([`Error::Refused`]: a per-job failure, not an outage) and the jobs
/// behind it go through.
///
/// It takes the jobs as valid, as [`JobSink::push`] hands them over: it does not run
/// [`Job::validate`] again (the enqueuer's own entry points, [`Enqueuer::enqueue_batch`], do).
#[derive(Clone)]
pub struct RedisSink {
    enqueuer: Enqueuer,
    con: RedisConnection,
    push_timeout: Duration,
    safety: Option<RedisSafety>,
    eviction: Arc<EvictionWatch>,
    wait_key: String,
    fed: Option<Arc<super::fed_queues::FedQueues>>,
}

impl RedisSink {
    /// A sink pushing through `con`; a push (isolation included) that takes longer than
    /// `push_timeout` fails as transient, so no row lock is held much longer than that. It
    /// checks nothing of Redis's configuration: see [`RedisSink::with_safety`].
    pub fn new(enqueuer: Enqueuer, con: RedisConnection, push_timeout: Duration) -> Self {
        let wait_key = format!("{}jobrelay:probe", enqueuer.namespace());
        RedisSink {
            enqueuer,
            con,
            push_timeout,
            safety: None,
            eviction: Arc::default(),
            wait_key,
            fed: None,
        }
    }

    /// The same sink, asking of Redis what `safety` says (the daemon's and the sweep's):
    /// unless `allow_eviction`, it refuses to push while the `maxmemory-policy` evicts
    /// ([`Error::EvictionPolicy`], looked up at most every [`EVICTION_RECHECK`]); with
    /// `wait_replicas`, a push is acknowledged only once that many replicas acknowledged its
    /// writes (`WAIT`, bounded by `wait_timeout`, on top of the push timeout), otherwise its
    /// jobs are kept ([`Reason::ReplicasBehind`]).
    pub fn with_safety(mut self, safety: RedisSafety) -> Self {
        self.safety = Some(safety);
        self
    }

    /// The same sink, noting in `fed` the queues of the jobs Redis acknowledged (the daemon's
    /// watch of the Redis side reads them: `super::redis_side`).
    pub fn noting_fed(mut self, fed: Arc<super::fed_queues::FedQueues>) -> Self {
        self.fed = Some(fed);
        self
    }

    /// `Err` while Redis's policy evicts keys and that is not allowed.
    async fn check_eviction(&self, con: &mut RedisConnection, deadline: Instant) -> Result<()> {
        let Some(safety) = self.safety.filter(|s| !s.allow_eviction) else {
            return Ok(());
        };
        // A refusal is not remembered: the next push (after the worker's backoff) looks again.
        let cached = self
            .eviction
            .last
            .lock()
            .expect("not poisoned")
            .as_ref()
            .filter(|(at, e)| at.elapsed() < EVICTION_RECHECK && e.refused(false).is_ok())
            .map(|(_, e)| e.clone());
        let eviction = match cached {
            Some(e) => e,
            None => {
                let found = tokio::time::timeout_at(deadline, safety::eviction_policy(con))
                    .await
                    .unwrap_or(Err(Error::Timeout {
                        dependency: crate::error::Dependency::Redis,
                        what: "redis push",
                        after: self.push_timeout,
                    }))?;
                safety::note_once(&found, safety.allow_eviction);
                *self.eviction.last.lock().expect("not poisoned") =
                    Some((Instant::now(), found.clone()));
                found
            }
        };
        eviction.refused(safety.allow_eviction)
    }

    /// With `--redis-wait-replicas`: `WAIT` for the replicas after the push's calls; when they
    /// fall short (or `WAIT` fails), every acknowledged job is kept instead
    /// ([`Error::Unacknowledged`], transient; refusals stay as they are).
    async fn wait_replicas(
        &self,
        con: &mut RedisConnection,
        jobs: &[Job],
        results: &mut [JobResult],
    ) {
        let Some(safety) = self.safety.filter(|s| s.wait_replicas > 0) else {
            return;
        };
        if !results.iter().any(|r| r.is_ok()) {
            return;
        }
        // WAIT answers by its timeout; the connection's own bound is --push-timeout.
        let waited = safety::touch_and_wait(
            con,
            &self.wait_key,
            safety.wait_replicas,
            safety.wait_timeout,
        )
        .await;
        let Err(e) = waited else {
            return;
        };
        let (reason, message) = (e.reason(), e.to_string());
        for (r, job) in results.iter_mut().zip(jobs) {
            if r.is_ok() {
                *r = Err(Error::Unacknowledged {
                    uuid: job.uuid,
                    reason,
                    message: message.clone(),
                });
            }
        }
    }

    /// Whether Redis answers at all right after a request failed with `reason`: if it does,
    /// the request (not the server) is at fault.
    async fn request_at_fault(&self, con: &mut RedisConnection, reason: Reason) -> bool {
        match reason {
            Reason::Other => true,
            Reason::Unreachable => {
                let cmd = redis::cmd("PING");
                let ping = cmd.query_async::<String>(con);
                matches!(
                    tokio::time::timeout(self.push_timeout.min(Duration::from_secs(1)), ping).await,
                    Ok(Ok(_))
                )
            }
            _ => false,
        }
    }

    /// The enqueue step: one script call per chunk of `jobs`, each bounded by `deadline`. A
    /// first call that failed because of the request (Redis still answers) is no outage: its
    /// jobs come back unacknowledged, for the isolation step, instead of failing the push
    /// (the second value: the request is known to be at fault).
    async fn enqueue(
        &self,
        con: &mut RedisConnection,
        jobs: &[Job],
        deadline: Instant,
    ) -> Result<(Vec<JobResult>, bool)> {
        match self.enqueue_until(con, jobs, deadline).await {
            Ok(results) => Ok((results, false)),
            Err(e) if self.request_at_fault(con, e.reason()).await => {
                let (reason, message) = (e.reason(), e.to_string());
                let results = jobs
                    .iter()
                    .map(|job| {
                        Err(Error::Unacknowledged {
                            uuid: job.uuid,
                            reason,
                            message: message.clone(),
                        })
                    })
                    .collect();
                Ok((results, true))
            }
            Err(e) => Err(e),
        }
    }

    /// The enqueuer's calls for `jobs`, each answered by `deadline` or failed as a timeout.
    async fn enqueue_until(
        &self,
        con: &mut RedisConnection,
        jobs: &[Job],
        deadline: Instant,
    ) -> Result<Vec<JobResult>> {
        self.enqueuer
            .enqueue_validated_until(con, jobs, Some((deadline, self.push_timeout)))
            .await
    }

    /// The isolation step: when jobs came back unacknowledged for a reason that points at the
    /// request rather than Redis (an error about the request, a connection closed on it while
    /// Redis still answers a `PING`; `at_fault`: already known), each is pushed alone, before
    /// `deadline`, so that the job at fault fails alone ([`Error::Refused`]) and the others go
    /// through. Stops at an outage: the jobs not pushed by then stay unacknowledged.
    async fn isolate(
        &self,
        con: &mut RedisConnection,
        jobs: &[Job],
        results: &mut [JobResult],
        at_fault: bool,
        deadline: Instant,
    ) {
        let suspects: Vec<usize> = (0..jobs.len())
            .filter(|&i| {
                matches!(&results[i], Err(Error::Unacknowledged { reason, .. })
                    if matches!(reason, Reason::Other | Reason::Unreachable))
            })
            .collect();
        let Some(&first) = suspects.first() else {
            return;
        };
        let reason = match &results[first] {
            Err(e) => e.reason(),
            Ok(_) => Reason::Other,
        };
        if !at_fault && !self.request_at_fault(con, reason).await {
            return;
        }
        tracing::warn!(
            jobs = suspects.len(),
            "redis refused a push or closed the connection on it; pushing its jobs one by one"
        );
        for i in suspects {
            let job = std::slice::from_ref(&jobs[i]);
            results[i] = match self.enqueue_until(con, job, deadline).await {
                Ok(mut r) => r.pop().expect("one result per job"),
                Err(e) if self.request_at_fault(con, e.reason()).await => {
                    let size = jobs[i].payload.len();
                    Err(Error::Refused {
                        uuid: jobs[i].uuid,
                        message: if e.reason() == Reason::Unreachable {
                            format!(
                                "redis closed the connection on this job alone ({size} bytes of \
                                 payload; is it over proto-max-bulk-len?): {e}"
                            )
                        } else {
                            e.to_string()
                        },
                    })
                }
                Err(_) => return,
            };
        }
    }
}

/// The last step: a push of which Redis acknowledged nothing (every result a failure that keeps
/// its row) fails as a whole, with the first job's error.
fn acknowledged_or_failed(results: Vec<JobResult>) -> Result<Vec<JobResult>> {
    if results
        .iter()
        .all(|r| matches!(r, Err(e) if e.class().keeps_rows()))
    {
        if let Some(Err(e)) = results.into_iter().next() {
            return Err(e);
        }
        return Ok(Vec::new());
    }
    Ok(results)
}

impl JobSink for RedisSink {
    fn claim_needs(&self) -> ClaimNeeds {
        self.enqueuer.claim_needs()
    }

    /// Claim to Redis in five steps: the eviction check, one enqueue call per chunk, the
    /// isolation of the jobs Redis refused as a request, the replicas' acknowledgement, and
    /// the verdict. Each script call is bounded, not the push as a whole: calls Redis answered
    /// before the deadline keep their outcomes and are committed (an acknowledged push is never
    /// rolled back), and only the rest are kept for the next batch.
    async fn push(&self, jobs: &[Job]) -> Result<Vec<JobResult>> {
        let deadline = Instant::now() + self.push_timeout;
        let mut con = self.con.clone();
        self.check_eviction(&mut con, deadline).await?;
        let (mut results, at_fault) = self.enqueue(&mut con, jobs, deadline).await?;
        self.isolate(&mut con, jobs, &mut results, at_fault, deadline)
            .await;
        self.wait_replicas(&mut con, jobs, &mut results).await;
        let verdict = acknowledged_or_failed(results);
        if let (Some(fed), Ok(results)) = (&self.fed, &verdict) {
            fed.note(
                jobs.iter()
                    .zip(results)
                    .filter(|(_, r)| r.is_ok())
                    .map(|(j, _)| j.queue.as_str()),
            );
        }
        verdict
    }
}
