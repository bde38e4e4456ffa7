//! The consumers of the jobrelay layout's queues (docs/redis-side.md#jobrelay): the consumers
//! are the application's own, and what docs/consumer.md asks of them (a `consumers` set, each
//! one's expiring heartbeat `consumers:<id>`, its `processing:<id>` list) says which consumers
//! are alive, not which queues each reads; nor is a consumer bound to follow it. How many read
//! a queue is therefore unknown ([`Seen::Unrecorded`]), and a starving queue is never reported
//! in this layout.
//!
//! A job's age: the job's `created_at`, the outbox row's creation time (the producer's
//! transaction), not the push: it counts the time the row waited in the outbox and, for a
//! scheduled job, its delay, so an old job at the head of a queue may be one that was relayed
//! late or was due late, not one that waited long in Redis.

use super::super::consumers::{field_seconds, Consumers, Reading, Seen};
use super::super::peek::Decoded;
use super::Jobrelay;
use crate::broker::connection::RedisConnection;

/// Why the jobrelay layout's consumers are not counted.
const UNRECORDED: &str = "the consumers' heartbeats (consumers, consumers:<id>) say which are \
     alive, not which queues each reads (counting them would need each consumer to record its \
     queues beside its heartbeat)";

impl Consumers for Jobrelay {
    fn seen<'a>(&'a self, _con: &'a mut RedisConnection, _namespace: &'a str) -> Reading<'a, Seen> {
        Box::pin(async { Ok(Seen::Unrecorded(UNRECORDED)) })
    }

    /// The job's `created_at`: the row's creation time.
    fn enqueued_at(&self, job: &Decoded) -> Option<f64> {
        field_seconds(job, "created_at", 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::layout::peek::{Peek as _, Stored};
    use crate::proto::v1;
    use prost::Message as _;

    #[test]
    fn a_job_is_as_old_as_its_row() {
        let job = v1::Job {
            uuid: "6f1c2a3b-4d5e-4f60-8a71-92b3c4d5e6f7".into(),
            queue: "default".into(),
            created_at: Some(prost_types::Timestamp {
                seconds: 1_700_000_000,
                nanos: 123_456_000,
            }),
            ..v1::Job::default()
        };
        let bytes = job.encode_to_vec();
        let decoded = Jobrelay.decode(Stored::Message(&bytes));
        let at = Jobrelay.enqueued_at(&decoded).unwrap();
        assert!((at - 1_700_000_000.123456).abs() < 1e-6, "{at}");
        assert_eq!(Jobrelay.enqueued_at(&Decoded::default()), None);
    }
}
