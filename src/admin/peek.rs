//! `jobrelay peek`: the jobs of a queue, of the scheduled set or held for a job, read without
//! moving them (`LLEN`, `LRANGE`, `ZCARD`, `ZRANGE`, `HGETALL`) and decoded by the layout
//! (docs/cli.md#jobrelay-peek). Which keys and what they hold is the layout's business
//! ([`crate::broker::layout::peek::Peek`]); this reader knows none of them.

use std::fmt;

use redis::aio::ConnectionLike;
use serde::Serialize;
use serde_json::Value;

use crate::broker::layout::peek::{
    epoch_rfc3339, shelf_of, Decoded, End, Entries, NoShelf, Shelf, ShelfKind, Stored, Wanted,
};
use crate::LayoutKind;

/// Members of a shared scheduled set read per round trip while looking for one queue's jobs.
const PAGE: usize = 1000;

/// Why nothing could be shown.
#[derive(Debug, thiserror::Error)]
pub enum PeekError {
    /// The layout keeps no such jobs (a usage error: exit 2).
    #[error(transparent)]
    NoShelf(#[from] NoShelf),
    /// Every job read is undecodable in the layout asked for, and decodes in another layout
    /// that keeps these jobs under the same key (a usage error: exit 2).
    #[error(
        "the jobs in {key} are not the {layout} layout's ({why}); they decode as the {}: pass {}",
        layouts_phrase(others),
        others.iter().map(|l| format!("--layout {l}")).collect::<Vec<_>>().join(" or ")
    )]
    OtherLayout {
        /// The key read.
        key: String,
        /// The layout asked for.
        layout: LayoutKind,
        /// Why its decoder refused the first job.
        why: String,
        /// The layouts whose decoders take every job read (at least one).
        others: Vec<LayoutKind>,
    },
    /// Redis failed a read.
    #[error("reading {key}: {source}")]
    Redis {
        /// The key being read.
        key: String,
        /// Redis's error.
        source: redis::RedisError,
    },
}

/// One job as `peek` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct Peeked {
    /// Its place on the shelf, 1 for the next to be popped (or the earliest due).
    pub position: usize,
    /// The key it is stored under, namespace included.
    pub key: String,
    /// For a scheduled job: when it is due (RFC 3339, from its score).
    pub due: Option<String>,
    /// Its uuid, when it says.
    pub uuid: Option<String>,
    /// Its queue, when it says or the shelf is the queue's.
    pub queue: Option<String>,
    /// The job, field by field in the layout's names.
    pub job: Decoded,
}

/// What `peek` found.
#[derive(Debug, Clone)]
pub struct Page {
    /// Where it looked.
    pub shelf: Shelf,
    /// How many entries the shelf holds (every queue's, for a shared scheduled set).
    pub total: u64,
    /// The jobs shown, in shelf order.
    pub jobs: Vec<Peeked>,
}

/// `sidekiq layout's`, `sidekiq or celery layout's`.
fn layouts_phrase(layouts: &[LayoutKind]) -> String {
    let names: Vec<String> = layouts.iter().map(ToString::to_string).collect();
    format!("{} layout's", names.join(" or "))
}

/// When every entry read (at least one) is undecodable in `layout`: the other layouts that keep
/// `wanted` under the same key as encoded jobs and decode every entry with a uuid; empty when
/// none does (the entries are then shown as undecodable) or some entry is `layout`'s.
fn other_layouts(
    layout: LayoutKind,
    namespace: &str,
    wanted: &Wanted,
    shelf: &Shelf,
    read: &[Vec<u8>],
) -> Vec<LayoutKind> {
    let undecodable = |d: &Decoded| d.get("undecodable").is_some();
    let mine = layout.layout().peek();
    if read.is_empty()
        || shelf.entries != Entries::Messages
        || !read
            .iter()
            .all(|r| undecodable(&mine.decode(Stored::Message(r))))
    {
        return Vec::new();
    }
    LayoutKind::ALL
        .into_iter()
        .filter(|&other| other != layout)
        .filter(|other| {
            let peek = other.layout().peek();
            shelf_of(peek, namespace, wanted).is_ok_and(|s| {
                s.key == shelf.key && s.kind == shelf.kind && s.entries == Entries::Messages
            }) && read.iter().all(|r| {
                let d = peek.decode(Stored::Message(r));
                !undecodable(&d) && d.uuid.is_some()
            })
        })
        .collect()
}

/// Reads at most `limit` jobs of `wanted` in `layout` under `namespace`, writing nothing.
/// [`PeekError::OtherLayout`] when what it read is another layout's jobs.
pub async fn peek<C: ConnectionLike + Send>(
    con: &mut C,
    layout: LayoutKind,
    namespace: &str,
    wanted: &Wanted,
    limit: usize,
) -> Result<Page, PeekError> {
    let peek = layout.layout().peek();
    let shelf = shelf_of(peek, namespace, wanted)?;
    let fail = |source| PeekError::Redis {
        key: shelf.key.clone(),
        source,
    };
    let mut jobs = Vec::new();
    // The first entries read, to tell another layout's jobs.
    let mut read: Vec<Vec<u8>> = Vec::new();
    let total: u64;
    match shelf.kind {
        ShelfKind::List(end) => {
            total = redis::cmd("LLEN")
                .arg(&shelf.key)
                .query_async(con)
                .await
                .map_err(fail)?;
            let n = limit as i64;
            let (from, to) = match end {
                End::Left => (0, n - 1),
                End::Right => (-n, -1),
            };
            let mut raw: Vec<Vec<u8>> = redis::cmd("LRANGE")
                .arg(&shelf.key)
                .arg(from)
                .arg(to)
                .query_async(con)
                .await
                .map_err(fail)?;
            if end == End::Right {
                raw.reverse();
            }
            read.clone_from(&raw);
            let entries: Vec<(Vec<u8>, Option<f64>)> = raw.into_iter().map(|r| (r, None)).collect();
            jobs = decode_all(con, peek, &shelf, entries, 0).await?;
        }
        ShelfKind::Sorted { .. } => {
            total = redis::cmd("ZCARD")
                .arg(&shelf.key)
                .query_async(con)
                .await
                .map_err(fail)?;
            let step = if shelf.only_queue.is_some() {
                PAGE
            } else {
                limit
            };
            let mut start = 0usize;
            while jobs.len() < limit && (start as u64) < total {
                let raw: Vec<(Vec<u8>, f64)> = redis::cmd("ZRANGE")
                    .arg(&shelf.key)
                    .arg(start)
                    .arg(start + step - 1)
                    .arg("WITHSCORES")
                    .query_async(con)
                    .await
                    .map_err(fail)?;
                if raw.is_empty() {
                    break;
                }
                let n = raw.len();
                if start == 0 {
                    read = raw.iter().take(limit).map(|(m, _)| m.clone()).collect();
                }
                let entries = raw.into_iter().map(|(m, s)| (m, Some(s))).collect();
                for p in decode_all(con, peek, &shelf, entries, start).await? {
                    let wanted = shelf.only_queue.as_deref();
                    if jobs.len() < limit && (wanted.is_none() || p.queue.as_deref() == wanted) {
                        jobs.push(p);
                    }
                }
                start += n;
            }
        }
    }
    let others = other_layouts(layout, namespace, wanted, &shelf, &read);
    if !others.is_empty() {
        let why = layout
            .layout()
            .peek()
            .decode(Stored::Message(&read[0]))
            .get("undecodable")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        return Err(PeekError::OtherLayout {
            key: shelf.key,
            layout,
            why,
            others,
        });
    }
    // A job hash need not name its queue: the shelf's is.
    if let Wanted::Queue(q) | Wanted::Scheduled(Some(q)) = wanted {
        for p in &mut jobs {
            p.queue.get_or_insert_with(|| q.clone());
        }
    }
    Ok(Page { shelf, total, jobs })
}

/// Decodes entries (with their scores) found at `offset` on the shelf, fetching the job hashes
/// they name in one round trip.
async fn decode_all<C: ConnectionLike + Send>(
    con: &mut C,
    peek: &dyn crate::broker::layout::peek::Peek,
    shelf: &Shelf,
    entries: Vec<(Vec<u8>, Option<f64>)>,
    offset: usize,
) -> Result<Vec<Peeked>, PeekError> {
    let hashes: Vec<Vec<(Vec<u8>, Vec<u8>)>> = match &shelf.entries {
        Entries::Messages => Vec::new(),
        Entries::HashIds { prefix } => {
            let mut pipe = redis::pipe();
            for (id, _) in &entries {
                pipe.cmd("HGETALL")
                    .arg(format!("{prefix}{}", String::from_utf8_lossy(id)));
            }
            pipe.query_async(con)
                .await
                .map_err(|source| PeekError::Redis {
                    key: format!("{prefix}<id>"),
                    source,
                })?
        }
    };
    let unit = match shelf.kind {
        ShelfKind::Sorted { unit } => unit,
        ShelfKind::List(_) => 1.0,
    };
    Ok(entries
        .iter()
        .enumerate()
        .map(|(i, (entry, score))| {
            let job = match &shelf.entries {
                Entries::Messages => peek.decode(Stored::Message(entry)),
                Entries::HashIds { .. } => peek.decode(Stored::Hash {
                    id: &String::from_utf8_lossy(entry),
                    fields: &hashes[i],
                }),
            };
            Peeked {
                position: offset + i + 1,
                key: shelf.key.clone(),
                due: score.and_then(|s| epoch_rfc3339(s * unit)),
                uuid: job.uuid.clone(),
                queue: job.queue.clone(),
                job,
            }
        })
        .collect())
}

/// A field's value on one line: text as it is (JSON-quoted if it holds control characters),
/// `-` for null, anything else as compact JSON.
fn one_line(v: &Value) -> String {
    match v {
        Value::Null => "-".to_owned(),
        Value::String(s) if !s.chars().any(char::is_control) => s.clone(),
        other => other.to_string(),
    }
}

/// A block of lines: `#<position> <key>` (then ` job <uuid>`, ` due <time>` when known), then
/// one `  <field>  <value>` line per field.
impl fmt::Display for Peeked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{} {}", self.position, self.key)?;
        if let Some(uuid) = &self.uuid {
            write!(f, " job {uuid}")?;
        }
        if let Some(due) = &self.due {
            write!(f, " due {due}")?;
        }
        writeln!(f)?;
        let width = self
            .job
            .fields
            .iter()
            .map(|(n, _)| n.len())
            .max()
            .unwrap_or(0);
        for (name, value) in &self.job.fields {
            writeln!(f, "  {name:<width$}  {}", one_line(value))?;
        }
        Ok(())
    }
}

impl Page {
    /// One line for stderr: how many jobs were shown of how many.
    pub fn summary(&self) -> String {
        match &self.shelf.only_queue {
            None => format!(
                "{} of {} jobs in {} shown",
                self.jobs.len(),
                self.total,
                self.shelf.key
            ),
            Some(q) => format!(
                "{} jobs of queue {q} shown ({} in {}, every queue's)",
                self.jobs.len(),
                self.total,
                self.shelf.key
            ),
        }
    }
}
