//! The consumers of the conveyor layout's queues (docs/redis-side.md#conveyor): not counted.
//! Conveyor (jpoz/conveyor, `storage/keys.go`, `stats.go`, `pop.go`) records its workers and
//! the queues popped, apart: each worker's id in the sorted set `<ns>workers:active`, scored by
//! its last heartbeat (every 15 s, by the worker's clock, pruned after 30 s), and each queue in
//! `<ns>queues:active`, scored by the last time a worker began a pop on it. Neither says which
//! worker reads which queue, and a worker busy with as many jobs as its concurrency pops
//! nothing, so the queues' scores go stale while it serves them. The count per queue is
//! therefore unknown ([`Seen::Unrecorded`]), and a starving queue is never reported in this
//! layout. (Its workers' connections are unnamed; `<ns>job:<uuid>` and
//! `<ns>worker:active:<id>` name running jobs, not queues.)
//!
//! A job's age: conveyor's `wire.Job` has no time of its enqueueing, only `run_at`, which the
//! relay writes when the row had one (conveyor's client with its `Delay` or `RunAt` option). The
//! age of a job that has one is how long ago it became due (for a scheduled job promoted to its
//! queue, how long it has waited since); a job without one has no age (`-`).

use super::super::consumers::{field_seconds, Consumers, Reading, Seen};
use super::super::peek::Decoded;
use super::Conveyor;
use crate::broker::connection::RedisConnection;

/// Why conveyor's consumers are not counted.
const UNRECORDED: &str = "conveyor records its workers (<ns>workers:active) and the queues \
     popped lately (<ns>queues:active) apart, not which worker reads which queue (counting \
     them would need each worker's heartbeat to name its queues)";

impl Consumers for Conveyor {
    fn seen<'a>(&'a self, _con: &'a mut RedisConnection, _namespace: &'a str) -> Reading<'a, Seen> {
        Box::pin(async { Ok(Seen::Unrecorded(UNRECORDED)) })
    }

    /// The job's `run_at`, when it has one: when it became due.
    fn enqueued_at(&self, job: &Decoded) -> Option<f64> {
        field_seconds(job, "run_at", 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::layout::peek::{Peek as _, Stored};
    use crate::proto::wire;
    use prost::Message as _;

    #[test]
    fn a_job_is_as_old_as_its_run_at_and_one_without_has_no_age() {
        let mut job = wire::Job {
            uuid: "6f1c2a3b-4d5e-4f60-8a71-92b3c4d5e6f7".into(),
            queue: "shop.PackOrder".into(),
            ..wire::Job::default()
        };
        let bytes = job.encode_to_vec();
        assert_eq!(
            Conveyor.enqueued_at(&Conveyor.decode(Stored::Message(&bytes))),
            None
        );
        job.run_at = Some(prost_types::Timestamp {
            seconds: 1_700_000_000,
            nanos: 500_000_000,
        });
        let bytes = job.encode_to_vec();
        assert_eq!(
            Conveyor.enqueued_at(&Conveyor.decode(Stored::Message(&bytes))),
            Some(1_700_000_000.5)
        );
    }
}
