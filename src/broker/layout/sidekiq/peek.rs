//! `jobrelay peek` in the sidekiq layout: `<ns>queue:<queue>` (popped from the right) and
//! `<ns>schedule`, each holding Sidekiq's job hash as JSON
//! (docs/layouts/sidekiq.md#keys-of-the-sidekiq-layout).

use super::super::peek::{ordered_object, Decoded, NoShelf, Peek, Shelf, Stored};
use super::Sidekiq;

impl Peek for Sidekiq {
    fn scheduled_shelf(&self, namespace: &str, queue: Option<&str>) -> Result<Shelf, NoShelf> {
        Ok(Shelf::scheduled(format!("{namespace}schedule"), queue))
    }

    /// The job's members as written; the uuid is its `jid` (32 hex digits) hyphenated.
    fn decode(&self, stored: Stored<'_>) -> Decoded {
        let Stored::Message(bytes) = stored else {
            return Decoded::undecodable("a job hash, not a Sidekiq job", &[]);
        };
        let members = match ordered_object(bytes) {
            Ok(m) => m,
            Err(e) => return Decoded::undecodable(format!("not a Sidekiq job (JSON): {e}"), bytes),
        };
        let text = |name: &str| {
            members
                .iter()
                .find(|(n, _)| n == name)
                .and_then(|(_, v)| v.as_str())
                .map(str::to_owned)
        };
        Decoded {
            uuid: text("jid")
                .map(|jid| uuid::Uuid::parse_str(&jid).map_or(jid, |u| u.hyphenated().to_string())),
            queue: text("queue"),
            fields: members,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_job_keeps_its_members_order_and_its_jid_is_the_uuid() {
        let json = br#"{"retry":true,"queue":"q","class":"C","args":[1],"jid":"6f1c2a3b4d5e4f608a7192b3c4d5e6f7","created_at":1700000000.5}"#;
        let d = Sidekiq.decode(Stored::Message(json));
        assert_eq!(
            d.uuid.as_deref(),
            Some("6f1c2a3b-4d5e-4f60-8a71-92b3c4d5e6f7")
        );
        assert_eq!(d.queue.as_deref(), Some("q"));
        assert_eq!(serde_json::to_vec(&d).unwrap(), json.to_vec());
    }
}
