//! `jobrelay peek` in the celery layout: the queue's list `<ns><queue>` (popped from the right)
//! of kombu message envelopes; no scheduled set, rows wait in the outbox until their `run_at`
//! (docs/layouts/celery.md#keys-of-the-celery-layout, docs/layouts/celery.md#the-message).

use base64::Engine as _;
use serde_json::Value;

use super::super::peek::{json_or_text, Decoded, NoShelf, Peek, Shelf, Stored};
use super::Celery;

impl Peek for Celery {
    fn scheduled_shelf(&self, _namespace: &str, _queue: Option<&str>) -> Result<Shelf, NoShelf> {
        Err(NoShelf(
            "the celery layout has no scheduled set: a row waits in the outbox until its run_at \
             (jobrelay status counts it as pending)"
                .to_owned(),
        ))
    }

    /// The task's `id`, `task` and `eta` (from the headers), its `args`, `kwargs` and `embed`
    /// (the body, base64-decoded), then the rest of the envelope as written.
    fn decode(&self, stored: Stored<'_>) -> Decoded {
        let Stored::Message(bytes) = stored else {
            return Decoded::undecodable("a job hash, not a kombu message", &[]);
        };
        let msg: serde_json::Map<String, Value> = match serde_json::from_slice(bytes) {
            Ok(Value::Object(m)) => m,
            Ok(_) => return Decoded::undecodable("not a kombu message (a JSON object)", bytes),
            Err(e) => return Decoded::undecodable(format!("not a kombu message: {e}"), bytes),
        };
        let headers = msg.get("headers").cloned().unwrap_or(Value::Null);
        let properties = msg.get("properties").cloned().unwrap_or(Value::Null);
        let mut d = Decoded {
            uuid: headers["id"].as_str().map(str::to_owned),
            queue: properties["delivery_info"]["routing_key"]
                .as_str()
                .map(str::to_owned),
            ..Decoded::default()
        };
        d.field("id", headers["id"].clone())
            .field("task", headers["task"].clone())
            .field("eta", headers["eta"].clone());
        let body = msg.get("body").and_then(Value::as_str).unwrap_or_default();
        let body = if properties["body_encoding"] == "base64" {
            match base64::engine::general_purpose::STANDARD.decode(body) {
                Ok(b) => String::from_utf8_lossy(&b).into_owned(),
                Err(e) => format!("(body not base64: {e})"),
            }
        } else {
            body.to_owned()
        };
        match json_or_text(&body) {
            Value::Array(parts) if parts.len() == 3 => {
                let mut parts = parts.into_iter();
                for name in ["args", "kwargs", "embed"] {
                    d.field(name, parts.next().unwrap_or(Value::Null));
                }
            }
            other => {
                d.field("body", other);
            }
        }
        for name in ["content-type", "content-encoding"] {
            d.field(name, msg.get(name).cloned().unwrap_or(Value::Null));
        }
        d.field("headers", headers).field("properties", properties);
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::layout::Layout as _;
    use crate::job::Job;

    #[test]
    fn a_relayed_message_shows_its_task_and_decoded_body() {
        let job = Job {
            uuid: uuid::Uuid::new_v4(),
            queue: "emails".into(),
            job_type: "app.tasks.send".into(),
            payload: br#"{"args":[42],"kwargs":{"a":1}}"#.to_vec(),
            parent_uuid: None,
            predecessor_uuid: None,
            dead_parent: false,
            run_at: None,
            created_at: chrono::Utc::now(),
            headers: [("traceparent".to_owned(), "00-x".to_owned())].into(),
            options: Default::default(),
            ordering_key: None,
        };
        let mut buf = Vec::new();
        Celery.encode(&job, &mut buf).unwrap();
        let d = Celery.decode(Stored::Message(&buf));
        assert_eq!(d.uuid, Some(job.uuid.to_string()));
        assert_eq!(d.queue.as_deref(), Some("emails"));
        assert_eq!(d.get("task"), Some(&Value::from("app.tasks.send")));
        assert_eq!(d.get("eta"), Some(&Value::Null));
        assert_eq!(d.get("args"), Some(&serde_json::json!([42])));
        assert_eq!(d.get("kwargs"), Some(&serde_json::json!({"a": 1})));
        assert_eq!(d.get("headers").unwrap()["traceparent"], "00-x");
    }
}
