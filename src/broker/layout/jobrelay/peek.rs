//! `jobrelay peek` in the jobrelay layout: `queue:<queue>` (popped from the right),
//! `scheduled`, `jobs:<uuid>:children` and `jobs:<uuid>:onComplete`, each holding
//! `jobrelay.v1.Job` messages (docs/layouts/jobrelay.md#keys-of-the-jobrelay-layout, docs/wire.md).

use prost::Message;
use serde_json::Value;

use super::super::peek::{timestamp_value, Decoded, NoShelf, Peek, Shelf, Stored};
use super::Jobrelay;
use crate::proto::v1;

impl Peek for Jobrelay {
    fn scheduled_shelf(&self, namespace: &str, queue: Option<&str>) -> Result<Shelf, NoShelf> {
        Ok(Shelf::scheduled(format!("{namespace}scheduled"), queue))
    }

    fn held_shelf(&self, namespace: &str, uuid: &str, on_complete: bool) -> Result<Shelf, NoShelf> {
        Ok(Shelf::held(namespace, "jobs:", uuid, on_complete))
    }

    fn decode(&self, stored: Stored<'_>) -> Decoded {
        let Stored::Message(bytes) = stored else {
            return Decoded::undecodable("a job hash, not a jobrelay.v1.Job", &[]);
        };
        let job = match v1::Job::decode(bytes) {
            Ok(job) => job,
            Err(e) => return Decoded::undecodable(format!("not a jobrelay.v1.Job: {e}"), bytes),
        };
        let mut d = Decoded {
            uuid: Some(job.uuid.clone()),
            queue: Some(job.queue.clone()),
            ..Decoded::default()
        };
        let text_or_null = |s: String| if s.is_empty() { Value::Null } else { s.into() };
        d.field("uuid", job.uuid)
            .field("queue", job.queue)
            .field("job_type", job.job_type)
            .bytes("payload", &job.payload)
            .field("parent_uuid", text_or_null(job.parent_uuid))
            .field("predecessor_uuid", text_or_null(job.predecessor_uuid))
            .field("run_at", timestamp_value(job.run_at.as_ref()))
            .field("created_at", timestamp_value(job.created_at.as_ref()))
            .field(
                "headers",
                job.headers
                    .into_iter()
                    .map(|(k, v)| (k, Value::String(v)))
                    .collect::<serde_json::Map<_, _>>(),
            );
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::layout::Layout as _;

    #[test]
    fn a_job_decodes_field_by_field_and_binary_payloads_as_base64() {
        let job = v1::Job {
            uuid: "6f1c2a3b-4d5e-4f60-8a71-92b3c4d5e6f7".into(),
            queue: "default".into(),
            job_type: "Send".into(),
            payload: vec![0xff, 1],
            created_at: Some(prost_types::Timestamp {
                seconds: 1_700_000_000,
                nanos: 123_456_000,
            }),
            headers: [("traceparent".to_owned(), "00-x".to_owned())].into(),
            ..v1::Job::default()
        };
        let d = Jobrelay.decode(Stored::Message(&job.encode_to_vec()));
        assert_eq!(d.queue.as_deref(), Some("default"));
        assert_eq!(
            serde_json::to_string(&d).unwrap(),
            r#"{"uuid":"6f1c2a3b-4d5e-4f60-8a71-92b3c4d5e6f7","queue":"default","job_type":"Send","payload_base64":"/wE=","parent_uuid":null,"predecessor_uuid":null,"run_at":null,"created_at":"2023-11-14T22:13:20.123456Z","headers":{"traceparent":"00-x"}}"#
        );
        let bad = Jobrelay.decode(Stored::Message(b"\xff\xff"));
        assert!(bad.get("undecodable").is_some(), "{bad:?}");
        assert_eq!(Jobrelay.kind().as_str(), "jobrelay");
    }
}
