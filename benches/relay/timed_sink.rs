//! A [`JobSink`] wrapper that notes, per job, when its push to Redis started and ended: the
//! latency stage splits each job's time into waiting to be claimed, the push, and the pop.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use jobrelay::broker::enqueue::JobResult;
use jobrelay::relay::JobSink;
use jobrelay::Job;

/// Push start and end of each job, by uuid.
pub type PushTimes = Arc<Mutex<HashMap<uuid::Uuid, (Instant, Instant)>>>;

/// Pushes through `inner`; records into `times` when set.
pub struct TimedSink<S> {
    pub inner: S,
    pub times: Option<PushTimes>,
}

impl<S: JobSink> JobSink for TimedSink<S> {
    async fn push(&self, jobs: &[Job]) -> jobrelay::Result<Vec<JobResult>> {
        let start = Instant::now();
        let results = self.inner.push(jobs).await;
        if let Some(times) = &self.times {
            let end = Instant::now();
            let mut times = times.lock().unwrap();
            for job in jobs {
                times.entry(job.uuid).or_insert((start, end));
            }
        }
        results
    }

    fn claim_needs(&self) -> jobrelay::sink::ClaimNeeds {
        self.inner.claim_needs()
    }
}
