//! `jobrelay peek` in the bullmq layout: a queue's wait list `<ns><queue>:wait` (BullMQ's
//! workers take from its right end) and delayed set `<ns><queue>:delayed` hold job ids; each
//! job is the hash `<ns><queue>:<id>` (docs/layouts/bullmq.md#keys-of-the-bullmq-layout).

use super::super::peek::{
    hash_fields, json_or_text, Decoded, End, NoShelf, Peek, Shelf, ShelfKind, Stored,
};
use super::{Bullmq, WAIT_SUFFIX};

/// A delayed job's score: its due millisecond times 0x1000, plus a sequence number
/// (`getDelayedScore`): seconds per point.
const DELAYED_UNIT: f64 = 1.0 / (4096.0 * 1000.0);

impl Peek for Bullmq {
    fn queue_shelf(&self, namespace: &str, queue: &str) -> Shelf {
        Shelf::list(format!("{namespace}{queue}{WAIT_SUFFIX}"), End::Right)
            .of_hashes(format!("{namespace}{queue}:"))
    }

    fn scheduled_shelf(&self, namespace: &str, queue: Option<&str>) -> Result<Shelf, NoShelf> {
        let queue = queue.ok_or_else(|| {
            NoShelf(
                "--scheduled needs --queue in the bullmq layout: each queue has its own delayed set"
                    .to_owned(),
            )
        })?;
        Ok(Shelf {
            key: format!("{namespace}{queue}:delayed"),
            kind: ShelfKind::Sorted { unit: DELAYED_UNIT },
            entries: super::super::peek::Entries::Messages,
            only_queue: None,
        }
        .of_hashes(format!("{namespace}{queue}:")))
    }

    /// The job hash's fields as `HGETALL` gives them, `data` and `opts` parsed as JSON.
    fn decode(&self, stored: Stored<'_>) -> Decoded {
        let (mut d, fields) = match Decoded::of_job_hash(stored, "a BullMQ") {
            Ok(found) => found,
            Err(undecodable) => return undecodable,
        };
        hash_fields(&mut d, fields, |d, name, value| {
            let json = matches!(name, "data" | "opts");
            match std::str::from_utf8(value) {
                Ok(text) if json => {
                    d.field(name, json_or_text(text));
                    true
                }
                _ => false,
            }
        });
        d
    }
}
