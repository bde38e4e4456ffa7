//! The seam between the claim loop and Redis.

use std::future::Future;
use std::time::Duration;

use crate::enqueue::{is_transient, Enqueuer, JobResult};
use crate::error::{Error, Result};
use crate::job::Job;
use crate::redis_conn::RedisConnection;

/// Where claimed jobs go. The relay deletes a row only after its job's result is `Ok`.
///
/// The Redis implementation is [`RedisSink`]; tests plug in sinks that fail on purpose.
pub trait JobSink: Send + Sync {
    /// Pushes `jobs`, returning one result per job, in order.
    ///
    /// `Err` means the push as a whole failed (transient): the relay rolls the batch back and
    /// keeps every row, whatever part of the push may have landed.
    fn push(&self, jobs: &[Job]) -> impl Future<Output = Result<Vec<JobResult>>> + Send;
}

/// A [`JobSink`] that runs the enqueue algorithm on a Redis connection, bounded by a timeout.
#[derive(Clone)]
pub struct RedisSink {
    enqueuer: Enqueuer,
    con: RedisConnection,
    push_timeout: Duration,
}

impl RedisSink {
    /// A sink pushing through `con`; a push that takes longer than `push_timeout` fails as
    /// transient (the relay then rolls back and no row lock is held longer than that).
    pub fn new(enqueuer: Enqueuer, con: RedisConnection, push_timeout: Duration) -> Self {
        RedisSink {
            enqueuer,
            con,
            push_timeout,
        }
    }
}

impl JobSink for RedisSink {
    async fn push(&self, jobs: &[Job]) -> Result<Vec<JobResult>> {
        let mut con = self.con.clone();
        let batch = self
            .enqueuer
            .enqueue_batch_within(&mut con, jobs, self.push_timeout)
            .await;
        match batch {
            Err(Error::Redis(e)) if !is_transient(&e) => {
                // Redis rejected the call itself for a reason that is not an outage: something
                // in the batch provokes it. Push the jobs one by one so that the culprit fails
                // alone and the rows behind it go through.
                tracing::warn!(error = %e, jobs = jobs.len(), "batch push refused; isolating the job at fault");
                let mut results = Vec::with_capacity(jobs.len());
                for job in jobs {
                    let one = self
                        .enqueuer
                        .enqueue_batch_within(
                            &mut con,
                            std::slice::from_ref(job),
                            self.push_timeout,
                        )
                        .await
                        .and_then(|mut r| r.pop().expect("one result per job"));
                    results.push(match one {
                        Err(Error::Redis(e)) if !is_transient(&e) => Err(Error::Refused {
                            uuid: job.uuid,
                            message: e.to_string(),
                        }),
                        Err(e) if e.class() == crate::ErrorClass::Transient => return Err(e),
                        other => other,
                    });
                }
                Ok(results)
            }
            other => other,
        }
    }
}
