//! The Redis side of the queues the relay feeds (docs/redis-side.md): how many jobs wait in
//! each, how old the oldest is, and how many consumers the runner records for it, read without
//! moving anything (`TIME`, `LLEN`, `LINDEX`, `HGETALL`, and each layout's reads of its
//! consumers). The daemon samples it for its metrics and its log; `status` and `check` print
//! it. Which keys and which records is the layout's business
//! ([`crate::broker::layout::consumers::Consumers`]); this reader knows none of them.

use std::fmt;

use redis::RedisResult;
use serde::Serialize;

use crate::broker::connection::RedisConnection;
use crate::broker::layout::consumers::Seen;
use crate::broker::layout::peek::{End, Entries, Shelf, ShelfKind, Stored};
use crate::telemetry::redact;
use crate::LayoutKind;

pub use crate::broker::fed_queues::MAX_QUEUES;

/// A job hash's fields, as `HGETALL` answers.
type Fields = Vec<(Vec<u8>, Vec<u8>)>;

/// A queue list's length and the entry popped next.
type Head = (u64, Option<Vec<u8>>);

/// One queue, as Redis shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QueueSide {
    /// Its name (`pending_jobs.queue`).
    pub queue: String,
    /// Jobs waiting in its list.
    pub depth: u64,
    /// How long ago the next job to be popped was put there (by Redis's clock), in seconds;
    /// `null` when the queue is empty or its jobs do not say when.
    pub oldest_age_seconds: Option<f64>,
    /// How many consumers the runner records for it; `null` when the runner records none.
    pub consumers: Option<usize>,
    /// Why the queue's list could not be read (its key holds another type), if it could not;
    /// its depth is then 0.
    pub error: Option<String>,
}

impl QueueSide {
    /// Jobs wait and the runner records no consumer for the queue.
    pub fn starving(&self) -> bool {
        self.depth > 0 && self.consumers == Some(0)
    }
}

/// The queues of one layout and namespace, as Redis shows them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RedisSide {
    /// The layout whose keys were read.
    pub layout: LayoutKind,
    /// The namespace they were read under.
    pub namespace: String,
    /// Why consumers cannot be counted in this layout, when they cannot.
    pub consumers_unrecorded: Option<&'static str>,
    /// The queues, in the order asked.
    pub queues: Vec<QueueSide>,
    /// When they were read, by Redis's clock (epoch seconds).
    #[serde(skip)]
    pub read_at: f64,
}

impl Serialize for LayoutKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// Reads `queues` of `layout` under `namespace` (at most [`MAX_QUEUES`]: the first), in two
/// round trips (three when the layout keeps its jobs in hashes) plus the layout's reads of its
/// consumers.
pub async fn look(
    con: &mut RedisConnection,
    layout: LayoutKind,
    namespace: &str,
    queues: &[String],
) -> RedisResult<RedisSide> {
    let queues = &queues[..queues.len().min(MAX_QUEUES)];
    let watch = layout.layout().consumers();
    let seen = watch.seen(con, namespace).await?;
    let shelves: Vec<_> = queues
        .iter()
        .map(|q| layout.layout().peek().queue_shelf(namespace, q))
        .collect();
    let (now, heads) = match heads(con, &shelves, true).await {
        Ok((now, all)) => (now, all.into_iter().map(Ok).collect()),
        // A key of another type (WRONGTYPE) fails the whole pipeline: queue by queue, so that
        // one bad key spoils only its own queue's line.
        Err(e) if !is_connection_error(&e) => {
            let (now, _) = heads(con, &[], true).await?;
            let mut each = Vec::with_capacity(shelves.len());
            for shelf in &shelves {
                each.push(match heads(con, std::slice::from_ref(shelf), false).await {
                    Ok((_, mut one)) => Ok(one.remove(0)),
                    Err(e) if !is_connection_error(&e) => {
                        Err(format!("cannot read {}: {e}", shelf.key))
                    }
                    Err(e) => return Err(e),
                });
            }
            (now, each)
        }
        Err(e) => return Err(e),
    };
    let mut depths = Vec::with_capacity(queues.len());
    let mut oldest: Vec<Option<Vec<u8>>> = Vec::with_capacity(queues.len());
    let mut errors: Vec<Option<String>> = Vec::with_capacity(queues.len());
    for head in heads {
        let (depth, first, error) = match head {
            Ok((depth, first)) => (depth, first, None),
            Err(why) => (0, None, Some(redact::scrub(&why).into_owned())),
        };
        depths.push(depth);
        oldest.push(first);
        errors.push(error);
    }
    // Layouts that keep a job in a hash: one more round trip for the oldest jobs' hashes.
    let mut hashes: Vec<Option<Fields>> = vec![None; queues.len()];
    let mut pipe = redis::pipe();
    let mut asked = Vec::new();
    for (i, (shelf, id)) in shelves.iter().zip(&oldest).enumerate() {
        if let (Entries::HashIds { prefix }, Some(id)) = (&shelf.entries, id) {
            pipe.cmd("HGETALL")
                .arg(format!("{prefix}{}", String::from_utf8_lossy(id)));
            asked.push(i);
        }
    }
    if !asked.is_empty() {
        let got: Vec<Fields> = pipe.query_async(con).await?;
        for (i, fields) in asked.into_iter().zip(got) {
            hashes[i] = Some(fields);
        }
    }
    let sides = queues
        .iter()
        .enumerate()
        .map(|(i, queue)| {
            let decoded = match (&oldest[i], &hashes[i]) {
                (None, _) => None,
                (Some(id), Some(fields)) => Some(watch.decode(Stored::Hash {
                    id: &String::from_utf8_lossy(id),
                    fields,
                })),
                (Some(message), None) => Some(watch.decode(Stored::Message(message))),
            };
            let enqueued = decoded.as_ref().and_then(|d| watch.enqueued_at(d));
            QueueSide {
                queue: queue.clone(),
                depth: depths[i],
                oldest_age_seconds: enqueued.map(|t| (now - t).max(0.0)),
                consumers: seen.count(queue),
                error: errors[i].take(),
            }
        })
        .collect();
    Ok(RedisSide {
        layout,
        namespace: namespace.to_owned(),
        consumers_unrecorded: match seen {
            Seen::Unrecorded(why) => Some(why),
            Seen::Consumers(_) => None,
        },
        queues: sides,
        read_at: now,
    })
}

/// Each shelf's length and the entry popped next, one pipeline; first, with `time`, Redis's
/// clock (`TIME`, in epoch seconds; 0 without).
async fn heads(
    con: &mut RedisConnection,
    shelves: &[Shelf],
    time: bool,
) -> RedisResult<(f64, Vec<Head>)> {
    let mut pipe = redis::pipe();
    if time {
        pipe.cmd("TIME");
    }
    for shelf in shelves {
        let ShelfKind::List(end) = shelf.kind else {
            unreachable!("a queue's shelf is a list")
        };
        pipe.cmd("LLEN").arg(&shelf.key);
        pipe.cmd("LINDEX")
            .arg(&shelf.key)
            .arg(if end == End::Left { 0 } else { -1 });
    }
    let mut replies: Vec<redis::Value> = pipe.query_async(con).await?;
    let now = if time {
        let (secs, micros): (u64, u64) = redis::from_redis_value(&replies.remove(0))?;
        secs as f64 + micros as f64 / 1e6
    } else {
        0.0
    };
    let heads = replies
        .chunks(2)
        .map(|pair| {
            Ok((
                redis::from_redis_value::<u64>(&pair[0])?,
                redis::from_redis_value(&pair[1])?,
            ))
        })
        .collect::<RedisResult<_>>()?;
    Ok((now, heads))
}

/// The connection, not the request, failed: nothing else can be read either.
fn is_connection_error(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal()
}

/// The other namespaces under which the runner records a consumer of `queue` (a bounded
/// search: [`crate::broker::layout::consumers::SCAN_BUDGET`]).
pub async fn elsewhere(
    con: &mut RedisConnection,
    layout: LayoutKind,
    namespace: &str,
    queue: &str,
) -> RedisResult<Vec<String>> {
    let watch = layout.layout().consumers();
    let mut found = Vec::new();
    for ns in watch.namespaces_in_use(con, namespace).await? {
        if watch.seen(con, &ns).await?.count(queue).unwrap_or(0) > 0 {
            found.push(ns);
        }
    }
    Ok(found)
}

/// The relays' record of the queues they fed: `<namespace>jobrelay:queues`, a sorted set of
/// queue names scored by when a relay last fed them (epoch milliseconds), written by each
/// daemon's watch ([`record_fed`]) so that `status` and `check` see the queues a fleet feeds
/// whichever layout, even with the outbox drained.
pub fn fed_key(namespace: &str) -> String {
    format!("{namespace}jobrelay:queues")
}

/// Records that `queues` were fed within the last sample, read at `read_at` (Redis's clock,
/// [`RedisSide::read_at`]), and forgets those not fed within `window` (one `ZADD`,
/// `ZREMRANGEBYSCORE` and `PEXPIRE`, in one round trip).
pub async fn record_fed(
    con: &mut RedisConnection,
    namespace: &str,
    queues: &[String],
    window: std::time::Duration,
    read_at: f64,
) -> RedisResult<()> {
    if queues.is_empty() {
        return Ok(());
    }
    let now_ms = (read_at * 1000.0) as u64;
    let window_ms = window.as_millis() as u64;
    let key = fed_key(namespace);
    let mut pipe = redis::pipe();
    let zadd = pipe.cmd("ZADD").arg(&key);
    for q in queues {
        zadd.arg(now_ms).arg(q);
    }
    pipe.cmd("ZREMRANGEBYSCORE")
        .arg(&key)
        .arg("-inf")
        .arg(format!("({}", now_ms.saturating_sub(window_ms)));
    pipe.cmd("PEXPIRE").arg(&key).arg(window_ms.max(1));
    pipe.query_async(con).await
}

/// The queues `status` and `check` look at: `known` (the outbox's), those the relays recorded
/// as fed within `window` ([`fed_key`]) and those the runner registered under `namespace`,
/// each once, sorted.
pub async fn queues_to_look_at(
    con: &mut RedisConnection,
    layout: LayoutKind,
    namespace: &str,
    known: impl IntoIterator<Item = String>,
    window: std::time::Duration,
) -> RedisResult<Vec<String>> {
    let watch = layout.layout().consumers();
    let mut all: std::collections::BTreeSet<String> = known.into_iter().collect();
    let (secs, _): (u64, u64) = redis::cmd("TIME").query_async(con).await?;
    let since_ms = (secs * 1000).saturating_sub(window.as_millis() as u64);
    let fed: Vec<String> = redis::cmd("ZRANGEBYSCORE")
        .arg(fed_key(namespace))
        .arg(since_ms)
        .arg("+inf")
        .query_async(con)
        .await?;
    all.extend(fed);
    all.extend(watch.registered_queues(con, namespace).await?);
    Ok(all.into_iter().collect())
}

/// A starving queue, in one line (the daemon's log, `check`'s warning):
/// `queue billing: 3 jobs waiting, oldest 2m, no consumer of the sidekiq layout seen under
/// namespace "myapp:"; consumers of billing are seen under namespace "" (pass --namespace "")`.
pub struct Starving<'a> {
    /// The queue.
    pub side: &'a QueueSide,
    /// Its layout.
    pub layout: LayoutKind,
    /// The namespace the relay writes under.
    pub namespace: &'a str,
    /// The namespaces under which its consumers are seen ([`elsewhere`]).
    pub elsewhere: &'a [String],
}

impl fmt::Display for Starving<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.side;
        let jobs = if s.depth == 1 { "job" } else { "jobs" };
        write!(f, "queue {}: {} {jobs} waiting, oldest ", s.queue, s.depth)?;
        match s.oldest_age_seconds {
            Some(age) => write!(f, "{}", Age(age))?,
            None => f.write_str("age unknown")?,
        }
        write!(
            f,
            ", no consumer of the {} layout seen under namespace {:?}",
            self.layout, self.namespace
        )?;
        match self.elsewhere {
            [] => Ok(()),
            [ns] => write!(
                f,
                "; consumers of {} are seen under namespace {ns:?} (pass --namespace {ns:?})",
                s.queue
            ),
            more => {
                let list: Vec<String> = more.iter().map(|n| format!("{n:?}")).collect();
                write!(
                    f,
                    "; consumers of {} are seen under namespaces {}",
                    s.queue,
                    list.join(", ")
                )
            }
        }
    }
}

/// An age, short: `12s`, `3m`, `2h`, `4d`.
pub struct Age(pub f64);

impl fmt::Display for Age {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0.max(0.0);
        match s {
            s if s < 60.0 => write!(f, "{}s", s.floor()),
            s if s < 3600.0 => write!(f, "{}m", (s / 60.0).floor()),
            s if s < 86_400.0 => write!(f, "{}h", (s / 3600.0).floor()),
            s => write!(f, "{}d", (s / 86_400.0).floor()),
        }
    }
}

impl fmt::Display for RedisSide {
    /// A table: QUEUE, WAITING, OLDEST, CONSUMERS (`?` where the runner records none).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "redis ({} layout, namespace {:?}):",
            self.layout, self.namespace
        )?;
        writeln!(
            f,
            "{:<40} {:>12} {:>8} {:>10}",
            "QUEUE", "WAITING", "OLDEST", "CONSUMERS"
        )?;
        for q in &self.queues {
            let age = q
                .oldest_age_seconds
                .map_or_else(|| "-".to_owned(), |a| Age(a).to_string());
            let consumers = q
                .consumers
                .map_or_else(|| "?".to_owned(), |n| n.to_string());
            writeln!(
                f,
                "{:<40} {:>12} {age:>8} {consumers:>10}",
                q.queue, q.depth
            )?;
        }
        for q in &self.queues {
            if let Some(e) = &q.error {
                writeln!(f, "queue {}: {e}", q.queue)?;
            }
        }
        if let Some(why) = self.consumers_unrecorded {
            writeln!(f, "consumers: unknown in the {} layout: {why}", self.layout)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(depth: u64, age: Option<f64>, consumers: Option<usize>) -> QueueSide {
        QueueSide {
            queue: "billing".into(),
            depth,
            oldest_age_seconds: age,
            consumers,
            error: None,
        }
    }

    #[test]
    fn a_queue_starves_with_jobs_and_no_consumer_recorded() {
        assert!(side(1, None, Some(0)).starving());
        assert!(!side(0, None, Some(0)).starving());
        assert!(!side(3, None, Some(1)).starving());
        assert!(!side(3, None, None).starving(), "unknown is not none");
    }

    #[test]
    fn the_line_names_the_queue_the_layout_the_namespace_and_the_fix() {
        let s = side(3, Some(150.0), Some(0));
        let line = |elsewhere: &[String]| {
            Starving {
                side: &s,
                layout: LayoutKind::Sidekiq,
                namespace: "myapp:",
                elsewhere,
            }
            .to_string()
        };
        assert_eq!(
            line(&[]),
            "queue billing: 3 jobs waiting, oldest 2m, no consumer of the sidekiq layout seen under namespace \"myapp:\""
        );
        assert_eq!(
            line(&["".into()]),
            "queue billing: 3 jobs waiting, oldest 2m, no consumer of the sidekiq layout seen under namespace \"myapp:\"; consumers of billing are seen under namespace \"\" (pass --namespace \"\")"
        );
        assert!(line(&["a:".into(), "b:".into()])
            .ends_with("; consumers of billing are seen under namespaces \"a:\", \"b:\""));
        let one = side(1, None, Some(0));
        let text = Starving {
            side: &one,
            layout: LayoutKind::Rq,
            namespace: "",
            elsewhere: &[],
        }
        .to_string();
        assert!(text.starts_with("queue billing: 1 job waiting, oldest age unknown,"));
    }

    #[test]
    fn ages_are_short() {
        let all: Vec<String> = [0.4, 59.9, 60.0, 3599.0, 7200.0, 200_000.0]
            .iter()
            .map(|s| Age(*s).to_string())
            .collect();
        assert_eq!(all, ["0s", "59s", "1m", "59m", "2h", "2d"]);
    }
}
