//! Who reads a layout's queues: each runner's own record, in Redis, of the workers that consume
//! its queues (docs/redis-side.md). The seam every layout implements beside [`super::peek::Peek`]:
//! a layout reads its runner's records ([`Consumers::seen`]), says where else its
//! runner's workers are recorded ([`Consumers::namespaces_in_use`], for the wrong-namespace
//! hint), which queues the runner itself registered ([`Consumers::registered_queues`]) and
//! when a job it decoded was enqueued ([`Consumers::enqueued_at`]). The reader
//! (`crate::admin::queues`) knows no layout.

use std::future::Future;
use std::pin::Pin;

use redis::RedisResult;
use serde::Serialize;

use super::peek::{Decoded, Peek};
use crate::broker::connection::RedisConnection;

/// A read of Redis a layout makes for the reader.
pub type Reading<'a, T> = Pin<Box<dyn Future<Output = RedisResult<T>> + Send + 'a>>;

/// Keys a search for other namespaces looks at, at most, per call (`SCAN` in steps of 1000):
/// bounded, and only made while a queue has jobs waiting and no consumer.
pub const SCAN_BUDGET: usize = 20_000;

/// One consumer a runner recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Consumer {
    /// The runner's name for it (Sidekiq's process identity, RQ's worker name, a client's
    /// name).
    pub name: String,
    /// The queues it reads, by their names in `pending_jobs.queue`.
    pub queues: Vec<String>,
}

/// What a runner's records say about its consumers under one namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// The runner records nothing that names its consumers: how many read a queue is unknown,
    /// for the reason given (docs/redis-side.md says it per runner).
    Unrecorded(&'static str),
    /// The consumers alive now (a fresh heartbeat, an open connection: each runner's rule).
    Consumers(Vec<Consumer>),
}

impl Seen {
    /// How many consumers read `queue`; `None` when the runner records none.
    pub fn count(&self, queue: &str) -> Option<usize> {
        match self {
            Seen::Unrecorded(_) => None,
            Seen::Consumers(all) => Some(
                all.iter()
                    .filter(|c| c.queues.iter().any(|q| q == queue))
                    .count(),
            ),
        }
    }
}

/// A runner's consumers, as its own records in Redis show them.
pub trait Consumers: Peek {
    /// The consumers recorded under `namespace`, alive by the runner's own rule.
    fn seen<'a>(&'a self, con: &'a mut RedisConnection, namespace: &'a str) -> Reading<'a, Seen>;

    /// The other namespaces (not `namespace`) under which this runner's consumers are
    /// recorded, found by a bounded search ([`SCAN_BUDGET`]); none by default.
    fn namespaces_in_use<'a>(
        &'a self,
        con: &'a mut RedisConnection,
        namespace: &'a str,
    ) -> Reading<'a, Vec<String>> {
        let _ = (con, namespace);
        Box::pin(async { Ok(Vec::new()) })
    }

    /// The queues the runner's own registry lists under `namespace` (Sidekiq's `queues` set),
    /// so that `status` and `check` see a queue the outbox no longer names; none by default.
    fn registered_queues<'a>(
        &'a self,
        con: &'a mut RedisConnection,
        namespace: &'a str,
    ) -> Reading<'a, Vec<String>> {
        let _ = (con, namespace);
        Box::pin(async { Ok(Vec::new()) })
    }

    /// When the job was put on its queue, in epoch seconds, as the job itself says; `None`
    /// when it does not.
    fn enqueued_at(&self, job: &Decoded) -> Option<f64>;
}

/// The keys matching `pattern` (a `MATCH` glob) of the given `TYPE`, looking at no more than
/// `budget` keys (`SCAN` in steps of 1000), and whether the scan got to its end within it.
pub async fn scan_keys(
    con: &mut RedisConnection,
    pattern: &str,
    kind: &str,
    budget: usize,
) -> RedisResult<(Vec<String>, bool)> {
    let mut found = Vec::new();
    let mut cursor: u64 = 0;
    let mut looked = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .arg("TYPE")
            .arg(kind)
            .query_async(con)
            .await?;
        found.extend(keys);
        looked += 1000;
        cursor = next;
        if cursor == 0 || looked >= budget {
            return Ok((found, cursor == 0));
        }
    }
}

/// The namespaces of the keys ending in `suffix` of the given `TYPE` (the part before the
/// suffix), but `namespace`, looking at no more than [`SCAN_BUDGET`] keys.
pub async fn namespaces_of_keys(
    con: &mut RedisConnection,
    suffix: &str,
    kind: &str,
    namespace: &str,
) -> RedisResult<Vec<String>> {
    let pattern = format!("*{}", glob_escape(suffix));
    let (keys, _) = scan_keys(con, &pattern, kind, SCAN_BUDGET).await?;
    let found: std::collections::BTreeSet<&str> = keys
        .iter()
        .filter_map(|key| key.strip_suffix(suffix))
        .filter(|ns| *ns != namespace)
        .collect();
    Ok(found.into_iter().map(str::to_owned).collect())
}

/// `text` with the characters special in a `MATCH` pattern escaped.
pub fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A decoded job's field `name` as epoch seconds: a number of seconds (times `unit`), or an
/// RFC 3339 / RQ-style (`2024-01-02T03:04:05.123456Z`) date.
pub fn field_seconds(job: &Decoded, name: &str, unit: f64) -> Option<f64> {
    match job.get(name)? {
        serde_json::Value::Number(n) => n.as_f64().map(|v| v * unit),
        serde_json::Value::String(s) => chrono::DateTime::parse_from_rfc3339(s)
            .ok()
            .map(|t| t.timestamp_micros() as f64 / 1e6),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn consumer(name: &str, queues: &[&str]) -> Consumer {
        Consumer {
            name: name.into(),
            queues: queues.iter().map(|q| q.to_string()).collect(),
        }
    }

    #[test]
    fn a_queue_counts_the_consumers_that_name_it() {
        let seen = Seen::Consumers(vec![
            consumer("a", &["billing", "mail"]),
            consumer("b", &["mail"]),
        ]);
        assert_eq!(seen.count("mail"), Some(2));
        assert_eq!(seen.count("billing"), Some(1));
        assert_eq!(seen.count("other"), Some(0));
        assert_eq!(Seen::Unrecorded("why").count("mail"), None);
    }

    #[test]
    fn match_patterns_escape_their_special_characters() {
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }

    #[test]
    fn seconds_come_from_numbers_or_dates() {
        let mut job = Decoded::default();
        job.field("at", 1_700_000_000.5)
            .field("ms", 1_700_000_000_500u64)
            .field("date", "2023-11-14T22:13:20.5Z")
            .field("rq", "2023-11-14T22:13:20.500000Z");
        assert_eq!(field_seconds(&job, "at", 1.0), Some(1_700_000_000.5));
        assert_eq!(field_seconds(&job, "ms", 1e-3), Some(1_700_000_000.5));
        assert_eq!(field_seconds(&job, "date", 1.0), Some(1_700_000_000.5));
        assert_eq!(field_seconds(&job, "rq", 1.0), Some(1_700_000_000.5));
        assert_eq!(field_seconds(&job, "absent", 1.0), None);
    }
}
