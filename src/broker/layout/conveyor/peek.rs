//! `jobrelay peek` in the conveyor layout: `<ns>queue:<queue>` (popped from the right),
//! `<ns>scheduled`, `<ns>job:<uuid>:children` and `<ns>job:<uuid>:onComplete`, each holding
//! conveyor's `wire.Job` messages (docs/layouts/conveyor.md#keys-of-the-conveyor-layout, docs/wire.md).

use prost::Message;
use serde_json::Value;

use super::super::peek::{timestamp_value, Decoded, NoShelf, Peek, Shelf, Stored};
use super::Conveyor;
use crate::proto::wire;

impl Peek for Conveyor {
    fn scheduled_shelf(&self, namespace: &str, queue: Option<&str>) -> Result<Shelf, NoShelf> {
        Ok(Shelf::scheduled(format!("{namespace}scheduled"), queue))
    }

    fn held_shelf(&self, namespace: &str, uuid: &str, on_complete: bool) -> Result<Shelf, NoShelf> {
        Ok(Shelf::held(namespace, "job:", uuid, on_complete))
    }

    fn decode(&self, stored: Stored<'_>) -> Decoded {
        let Stored::Message(bytes) = stored else {
            return Decoded::undecodable("a job hash, not a wire.Job", &[]);
        };
        let job = match wire::Job::decode(bytes) {
            Ok(job) => job,
            Err(e) => return Decoded::undecodable(format!("not a wire.Job: {e}"), bytes),
        };
        let mut d = Decoded {
            uuid: Some(job.uuid.clone()),
            queue: Some(job.queue.clone()),
            ..Decoded::default()
        };
        let text_or_null = |s: String| if s.is_empty() { Value::Null } else { s.into() };
        let status = wire::JobStatus::try_from(job.status)
            .map_or_else(|_| job.status.to_string(), |s| s.as_str_name().to_owned());
        d.field("uuid", job.uuid)
            .field("type", job.r#type)
            .field("queue", job.queue)
            .bytes("payload", &job.payload)
            .field("run_at", timestamp_value(job.run_at.as_ref()))
            .field("parent_uuid", text_or_null(job.parent_uuid))
            .field("predecessor_uuid", text_or_null(job.predecessor_uuid))
            .field("started_at", timestamp_value(job.started_at.as_ref()))
            .field("retry", job.retry)
            .field("max_retries", job.max_retries)
            .field("last_failure", text_or_null(job.last_failure))
            .field("status", status);
        d
    }
}
