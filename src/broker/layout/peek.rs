//! Looking at stored jobs without moving them (`jobrelay peek`, docs/cli.md#jobrelay-peek): the
//! seam every layout implements. A layout says where a queue's jobs, its scheduled jobs and
//! (with flows) a job's held children and heirs are ([`Shelf`]), and what one stored job says,
//! field by field in the layout's own names ([`Decoded`]). The reader
//! (`crate::admin::peek`) knows no layout: it reads shelves and asks the layout to decode.

use base64::Engine as _;
use chrono::{DateTime, SecondsFormat, Utc};
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::Value;

use super::Layout;

/// Which jobs to look at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wanted {
    /// A queue's jobs, the next to be popped first.
    Queue(String),
    /// The jobs waiting for their `run_at`, the earliest first; with a queue, only its own.
    Scheduled(Option<String>),
    /// The jobs held until this job's handler returned (`children` outcome).
    Children(String),
    /// The jobs held until this job completed (`on_complete` outcome).
    OnComplete(String),
}

/// Which end of a list the runner pops next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// `LPOP`, `BLMOVE ... LEFT`: the first element.
    Left,
    /// `BRPOP`, `BLMOVE ... RIGHT`: the last element.
    Right,
}

/// How a shelf keeps its jobs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ShelfKind {
    /// A list, popped from this end.
    List(End),
    /// A sorted set whose score says when a job is due, earliest first: `unit` seconds per
    /// point of score (`1.0` for epoch seconds).
    Sorted {
        /// Seconds per point of score.
        unit: f64,
    },
}

/// What a shelf's entries are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entries {
    /// The jobs themselves, as the layout encodes them.
    Messages,
    /// Job ids; each job is the hash at `<prefix><id>`.
    HashIds {
        /// What comes before the id in the hash's key.
        prefix: String,
    },
}

/// Where some jobs are stored.
#[derive(Debug, Clone, PartialEq)]
pub struct Shelf {
    /// The key, namespace included.
    pub key: String,
    /// A list or a sorted set.
    pub kind: ShelfKind,
    /// The jobs or their ids.
    pub entries: Entries,
    /// Only the jobs of this queue (a scheduled set every queue shares).
    pub only_queue: Option<String>,
}

impl Shelf {
    /// The list of the jobs held for `uuid` in a layout with flows,
    /// `<namespace><job_infix><uuid>:children` (or `:onComplete`), popped from the right.
    pub fn held(namespace: &str, job_infix: &str, uuid: &str, on_complete: bool) -> Shelf {
        let list = if on_complete {
            "onComplete"
        } else {
            "children"
        };
        Shelf::list(format!("{namespace}{job_infix}{uuid}:{list}"), End::Right)
    }

    /// A list of encoded jobs popped from `end`.
    pub fn list(key: String, end: End) -> Shelf {
        Shelf {
            key,
            kind: ShelfKind::List(end),
            entries: Entries::Messages,
            only_queue: None,
        }
    }

    /// A sorted set of encoded jobs scored in epoch seconds; with `queue`, only that queue's
    /// jobs are wanted from it (a set every queue shares).
    pub fn scheduled(key: String, queue: Option<&str>) -> Shelf {
        Shelf {
            key,
            kind: ShelfKind::Sorted { unit: 1.0 },
            entries: Entries::Messages,
            only_queue: queue.map(str::to_owned),
        }
    }

    /// The same shelf holding ids of the hashes at `<prefix><id>`.
    pub fn of_hashes(mut self, prefix: String) -> Shelf {
        self.entries = Entries::HashIds { prefix };
        self
    }
}

/// Why a layout has no such shelf: a usage error, said in one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NoShelf(pub String);

/// A job hash's field and value pairs, as `HGETALL` gives them.
pub type HashFields<'a> = &'a [(Vec<u8>, Vec<u8>)];

/// One stored job as read from Redis.
#[derive(Debug, Clone, Copy)]
pub enum Stored<'a> {
    /// An encoded job (a list's element, a sorted set's member).
    Message(&'a [u8]),
    /// A job hash's fields (`HGETALL`), with the id that named it.
    Hash {
        /// The id, as the shelf holds it.
        id: &'a str,
        /// Field and value pairs; empty when no such hash exists.
        fields: HashFields<'a>,
    },
}

/// One job, decoded: its uuid and queue when it has them, and its fields in the layout's own
/// names and order. Serialised as one JSON object of the fields.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Decoded {
    /// The job's uuid (hyphenated), when it says.
    pub uuid: Option<String>,
    /// The job's queue, when it says.
    pub queue: Option<String>,
    /// Name and value of each field.
    pub fields: Vec<(String, Value)>,
}

impl Decoded {
    /// Adds a field.
    pub fn field(&mut self, name: &str, value: impl Into<Value>) -> &mut Self {
        self.fields.push((name.to_owned(), value.into()));
        self
    }

    /// Adds `bytes` as `name` when they are UTF-8 text, else as `<name>_base64`.
    pub fn bytes(&mut self, name: &str, bytes: &[u8]) -> &mut Self {
        match std::str::from_utf8(bytes) {
            Ok(text) => self.field(name, text),
            Err(_) => self.field(&format!("{name}_base64"), base64_of(bytes)),
        }
    }

    /// The value of a field.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.fields.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    /// The start of a job hash's decoding (its id as uuid and first field), with its fields; or
    /// why `stored` is none: a list element (`runner` names whose job id it is not) or an id
    /// without a hash.
    pub fn of_job_hash<'a>(
        stored: Stored<'a>,
        runner: &str,
    ) -> Result<(Decoded, HashFields<'a>), Decoded> {
        let Stored::Hash { id, fields } = stored else {
            return Err(Decoded::undecodable(
                format!("a list element, not {runner} job id"),
                &[],
            ));
        };
        if fields.is_empty() {
            return Err(Decoded::undecodable(
                format!("no job hash for the id {id:?}"),
                id.as_bytes(),
            ));
        }
        let mut d = Decoded {
            uuid: Some(id.to_owned()),
            ..Decoded::default()
        };
        d.field("id", id);
        Ok((d, fields))
    }

    /// A stored value that is not a job of the layout: why, and its bytes.
    pub fn undecodable(why: impl std::fmt::Display, bytes: &[u8]) -> Decoded {
        let mut d = Decoded::default();
        d.field("undecodable", why.to_string());
        d.bytes("raw", bytes);
        d
    }
}

impl Serialize for Decoded {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.fields.len()))?;
        for (name, value) in &self.fields {
            map.serialize_entry(name, value)?;
        }
        map.end()
    }
}

/// Base64 (standard alphabet, padded).
pub fn base64_of(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A protobuf Timestamp as RFC 3339 (`null` when unset or out of range).
pub fn timestamp_value(t: Option<&prost_types::Timestamp>) -> Value {
    t.and_then(|t| DateTime::<Utc>::from_timestamp(t.seconds, u32::try_from(t.nanos).ok()?))
        .map_or(Value::Null, |t| {
            Value::String(t.to_rfc3339_opts(SecondsFormat::AutoSi, true))
        })
}

/// `text` parsed as JSON, or the text itself when it is not JSON.
pub fn json_or_text(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

/// Epoch seconds as RFC 3339 (`None` when out of range).
pub fn epoch_rfc3339(seconds: f64) -> Option<String> {
    let whole = seconds.floor();
    let micros = ((seconds - whole) * 1e6).round() as u32;
    DateTime::<Utc>::from_timestamp(whole as i64, micros.min(999_999) * 1000)
        .map(|t| t.to_rfc3339_opts(SecondsFormat::AutoSi, true))
}

/// The members of a JSON object in their written order (nested objects are sorted by key).
pub fn ordered_object(bytes: &[u8]) -> Result<Vec<(String, Value)>, serde_json::Error> {
    struct Ordered(Vec<(String, Value)>);
    impl<'de> serde::Deserialize<'de> for Ordered {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct Members;
            impl<'de> serde::de::Visitor<'de> for Members {
                type Value = Ordered;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("a JSON object")
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(
                    self,
                    mut map: A,
                ) -> Result<Ordered, A::Error> {
                    let mut out = Vec::new();
                    while let Some(member) = map.next_entry()? {
                        out.push(member);
                    }
                    Ok(Ordered(out))
                }
            }
            d.deserialize_map(Members)
        }
    }
    serde_json::from_slice::<Ordered>(bytes).map(|o| o.0)
}

/// The fields of a job hash in the order `HGETALL` gave them: each as text (as
/// `<name>_base64` when not UTF-8), unless `special` added it in a form of its own (and said
/// so).
pub fn hash_fields(
    d: &mut Decoded,
    fields: &[(Vec<u8>, Vec<u8>)],
    mut special: impl FnMut(&mut Decoded, &str, &[u8]) -> bool,
) {
    for (name, value) in fields {
        let name = String::from_utf8_lossy(name);
        if !special(d, &name, value) {
            d.bytes(&name, value);
        }
    }
}

/// What a layout says about its stored jobs: where they are and what they say. Each layout
/// implements it next to its encoder (`<layout>/peek.rs`).
pub trait Peek: Layout {
    /// Where `queue`'s jobs wait to be popped. Default: the layout's queue list
    /// ([`Layout::queue_key`]) of encoded jobs, popped from the right (`BRPOP`).
    fn queue_shelf(&self, namespace: &str, queue: &str) -> Shelf {
        Shelf::list(self.queue_key(namespace, queue), End::Right)
    }

    /// Where jobs wait for their `run_at` (of `queue`, if given).
    fn scheduled_shelf(&self, namespace: &str, queue: Option<&str>) -> Result<Shelf, NoShelf>;

    /// Where the jobs held for `uuid` wait: its children (`on_complete` false) or its heirs.
    /// Default: nowhere, the layout has no flows.
    fn held_shelf(&self, namespace: &str, uuid: &str, on_complete: bool) -> Result<Shelf, NoShelf> {
        let _ = (namespace, uuid, on_complete);
        Err(NoShelf(format!(
            "the {} layout has no flows: no job holds children or heirs",
            self.kind()
        )))
    }

    /// One stored job, decoded. Never fails: what is not a job of this layout is
    /// [`Decoded::undecodable`].
    fn decode(&self, stored: Stored<'_>) -> Decoded;
}

/// The shelf of `wanted` in `layout`.
pub fn shelf_of(layout: &dyn Peek, namespace: &str, wanted: &Wanted) -> Result<Shelf, NoShelf> {
    match wanted {
        Wanted::Queue(q) => Ok(layout.queue_shelf(namespace, q)),
        Wanted::Scheduled(q) => layout.scheduled_shelf(namespace, q.as_deref()),
        Wanted::Children(u) => layout.held_shelf(namespace, u, false),
        Wanted::OnComplete(u) => layout.held_shelf(namespace, u, true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_text_when_utf8_else_base64() {
        let mut d = Decoded::default();
        d.bytes("payload", b"{\"a\":1}")
            .bytes("payload", &[0xff, 0x00]);
        assert_eq!(
            serde_json::to_string(&d).unwrap(),
            r#"{"payload":"{\"a\":1}","payload_base64":"/wA="}"#
        );
    }

    #[test]
    fn epoch_seconds_keep_their_microseconds() {
        assert_eq!(
            epoch_rfc3339(1_700_000_000.123456).as_deref(),
            Some("2023-11-14T22:13:20.123456Z")
        );
        assert_eq!(
            epoch_rfc3339(1_700_000_000.0).as_deref(),
            Some("2023-11-14T22:13:20Z")
        );
    }
}
