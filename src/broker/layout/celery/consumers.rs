//! The consumers of the celery layout's queues (docs/redis-side.md#celery). Kombu's Redis
//! transport records no worker and no worker's queues; what Redis shows is two things:
//!
//! - **Which workers are connected.** Every worker with remote control (the default) consumes
//!   its mailbox through the fanout exchange `celery.pidbox`, which kombu maps to a Pub/Sub
//!   pattern subscription on the channel `<ns>/<db>.celery.pidbox` (kombu/transport/redis.py:
//!   `keyprefix_fanout` `/{db}.`, `global_keyprefix` prefixed to channels as to keys,
//!   `PSUBSCRIBE`). A pattern subscriber is not counted by `PUBSUB NUMSUB`, and Redis has no
//!   per-pattern count: the layout publishes an **empty message** on that channel, and
//!   `PUBLISH` answers how many clients received it. Kombu drops a message without data unread
//!   (`Channel._receive_one`), so the workers see nothing; it is the one command of the Redis
//!   side that is not a read. The database is the connection's (the relay's URL, or what the
//!   Sentinels serve), which must be the workers' anyway.
//! - **Which queues were declared.** A worker declares the queues it consumes when it starts:
//!   kombu adds `routing_key\x06\x16pattern\x06\x16queue` to the set
//!   `<ns>_kombu.binding.<exchange>` (`_queue_bind`), and the worker's own mailbox queue
//!   `<name>.celery.pidbox` to `<ns>_kombu.binding.celery.pidbox`, which names the worker.
//!
//! The rule: a queue has as many consumers as there are connected workers (pidbox
//! subscribers) if some binding under the namespace names the queue, else none. Its limits:
//!
//! - A worker's queues are not recorded: every connected worker counts for every declared
//!   queue, the ones it does not read too.
//! - A binding outlives the worker that made it (a worker stopped cleanly removes its mailbox's
//!   binding, not its queues'), and celery's own client declares the queue it sends to
//!   (`apply_async`): a queue once declared counts as read while any worker is connected. The
//!   relay declares nothing. What the rule does tell apart: no worker connected under the
//!   namespace and database (none started, another `global_keyprefix`, another database), and
//!   jobs relayed to a queue no worker and no celery client ever declared.
//! - A worker killed (SIGKILL, a crash) stops counting at once: its connection closes. A
//!   worker stopped (SIGSTOP) keeps its connection and counts for as long as it is stopped.
//! - A worker without remote control (`worker_enable_remote_control = False`), with another
//!   `control_exchange` than `celery`, or with kombu's `fanout_prefix` changed, is not seen.
//!   A client subscribed to a pattern that matches the channel (`PSUBSCRIBE *`) counts as a
//!   worker.
//! - The bindings are found by `SCAN` (kombu keeps no index of them), only while a worker is
//!   connected, and at most [`BINDINGS_SCAN_BUDGET`] keys: in a larger database the
//!   consumers are unknown rather than guessed. A user whose ACL refuses `PUBLISH` on the
//!   channel gets them unknown too.
//! - The names: the workers the mailbox bindings name, when they name as many as are
//!   connected; otherwise the workers cannot be told apart. A killed worker's mailbox binding
//!   stays while another worker under the namespace refreshes the table (kombu deletes the
//!   table an hour after its last refresh).
//!
//! Celery's message says when it was sent only when it expires: `headers.expires` is the
//! instant, `properties.expiration` the milliseconds left when it was sent (celery's client
//! and the relay write both): the difference is the enqueue time. Other messages carry none
//! (task protocol 2 has no sent time; `eta` is when to run), and their age is unknown.

use std::collections::BTreeSet;

use redis::aio::ConnectionLike as _;
use serde_json::Value;

use super::super::consumers::{
    glob_escape, namespaces_of_keys, scan_keys, Consumer, Consumers, Reading, Seen,
};
use super::super::peek::Decoded;
use super::Celery;
use crate::broker::connection::RedisConnection;

/// Kombu's separator of a binding's fields (`Channel.sep`).
const SEP: &str = "\x06\x16";

/// The key of an exchange's bindings before the exchange (`Channel.keyprefix_queue`).
const BINDINGS_INFIX: &str = "_kombu.binding.";

/// Celery's remote control exchange (`control_exchange` `celery`, kombu's `Mailbox`).
const PIDBOX: &str = "celery.pidbox";

/// The most keys looked at to find the bindings (`SCAN` in steps of 1000, so at most 100
/// calls): more than [`super::super::consumers::SCAN_BUDGET`], as this scan is made at every
/// look while a worker is connected and a database that holds celery's results holds a key
/// per task for a day.
const BINDINGS_SCAN_BUDGET: usize = 100_000;

/// Why the consumers are unknown when the bindings are not all found.
const TOO_MANY_KEYS: &str = "kombu keeps no index of its queue bindings, and the database has \
                             more keys than a bounded scan looks at";

/// Why the consumers are unknown when the ACL refuses the count.
const NO_PUBLISH: &str = "counting celery's workers publishes an empty message on the \
                          pidbox channel, which this Redis user may not (ACL NOPERM)";

/// The Pub/Sub channel of the remote control exchange under `namespace` in database `db`.
fn pidbox_channel(namespace: &str, db: i64) -> String {
    format!("{namespace}/{db}.{PIDBOX}")
}

/// A binding set's member: its routing key, pattern and queue.
fn binding(member: &str) -> Option<(&str, &str, &str)> {
    let mut parts = member.splitn(3, SEP);
    Some((parts.next()?, parts.next()?, parts.next()?))
}

/// Whether an exchange carries celery's control or events rather than tasks: the mailboxes
/// (`celery.pidbox`, `reply.celery.pidbox`) and the events (`celeryev`).
fn is_control(exchange: &str) -> bool {
    exchange.ends_with(".pidbox") || exchange == "celeryev"
}

/// What the binding sets under a namespace say: the queues declared for tasks, and the workers
/// named by their mailboxes.
#[derive(Debug, Default, PartialEq)]
struct Bindings {
    queues: BTreeSet<String>,
    workers: BTreeSet<String>,
}

impl Bindings {
    /// Adds the members of the set of `exchange`.
    fn add(&mut self, exchange: &str, members: &[String]) {
        for (_, _, queue) in members.iter().filter_map(|m| binding(m)) {
            if exchange == PIDBOX {
                if let Some(worker) = queue.strip_suffix(".celery.pidbox") {
                    self.workers.insert(worker.to_owned());
                }
            } else if !is_control(exchange) && !queue.is_empty() {
                self.queues.insert(queue.to_owned());
            }
        }
    }

    /// `connected` consumers, each reading every declared queue; named by the mailboxes when
    /// they name as many workers.
    fn consumers(&self, connected: usize) -> Vec<Consumer> {
        let queues: Vec<String> = self.queues.iter().cloned().collect();
        let named: Vec<String> = if self.workers.len() == connected {
            self.workers.iter().cloned().collect()
        } else if self.workers.is_empty() {
            vec!["a celery worker".to_owned(); connected]
        } else {
            let all: Vec<&str> = self.workers.iter().map(String::as_str).collect();
            vec![format!("a celery worker (one of {})", all.join(", ")); connected]
        };
        named
            .into_iter()
            .map(|name| Consumer {
                name,
                queues: queues.clone(),
            })
            .collect()
    }
}

/// The binding sets under `namespace`, read whole; `None` if the scan found its budget before
/// the end of the keyspace.
async fn bindings(
    con: &mut RedisConnection,
    namespace: &str,
) -> redis::RedisResult<Option<Bindings>> {
    let prefix = format!("{namespace}{BINDINGS_INFIX}");
    let pattern = format!("{}*", glob_escape(&prefix));
    let (found, complete) = scan_keys(con, &pattern, "set", BINDINGS_SCAN_BUDGET).await?;
    if !complete {
        return Ok(None);
    }
    let keys: BTreeSet<String> = found.into_iter().collect();
    let mut seen = Bindings::default();
    if keys.is_empty() {
        return Ok(Some(seen));
    }
    let mut pipe = redis::pipe();
    for key in &keys {
        pipe.cmd("SMEMBERS").arg(key);
    }
    let members: Vec<Vec<String>> = pipe.query_async(con).await?;
    for (key, members) in keys.iter().zip(members) {
        seen.add(&key[prefix.len()..], &members);
    }
    Ok(Some(seen))
}

impl Consumers for Celery {
    fn seen<'a>(&'a self, con: &'a mut RedisConnection, namespace: &'a str) -> Reading<'a, Seen> {
        Box::pin(async move {
            let channel = pidbox_channel(namespace, con.get_db());
            let connected: usize = match redis::cmd("PUBLISH")
                .arg(&channel)
                .arg("")
                .query_async(con)
                .await
            {
                Ok(n) => n,
                Err(e) if e.code() == Some("NOPERM") => return Ok(Seen::Unrecorded(NO_PUBLISH)),
                Err(e) => return Err(e),
            };
            if connected == 0 {
                return Ok(Seen::Consumers(Vec::new()));
            }
            Ok(match bindings(con, namespace).await? {
                Some(b) => Seen::Consumers(b.consumers(connected)),
                None => Seen::Unrecorded(TOO_MANY_KEYS),
            })
        })
    }

    /// The namespaces with a worker's mailbox binding (`<ns>_kombu.binding.celery.pidbox`).
    fn namespaces_in_use<'a>(
        &'a self,
        con: &'a mut RedisConnection,
        namespace: &'a str,
    ) -> Reading<'a, Vec<String>> {
        Box::pin(async move {
            let suffix = format!("{BINDINGS_INFIX}{PIDBOX}");
            namespaces_of_keys(con, &suffix, "set", namespace).await
        })
    }

    /// `headers.expires` less `properties.expiration` (see the module); `None` for a message
    /// that does not expire, or had expired when it was sent (`expiration` 0).
    fn enqueued_at(&self, job: &Decoded) -> Option<f64> {
        let expires = job.get("headers")?.get("expires")?.as_str()?;
        let left_ms = match job.get("properties")?.get("expiration")? {
            Value::String(s) => s.parse::<f64>().ok()?,
            Value::Number(n) => n.as_f64()?,
            _ => return None,
        };
        if left_ms <= 0.0 {
            return None;
        }
        let at = chrono::DateTime::parse_from_rfc3339(expires).ok()?;
        Some(at.timestamp_micros() as f64 / 1e6 - left_ms / 1e3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_pidbox_channel_is_prefixed_and_names_the_database() {
        assert_eq!(pidbox_channel("", 0), "/0.celery.pidbox");
        assert_eq!(pidbox_channel("myapp:", 3), "myapp:/3.celery.pidbox");
    }

    #[test]
    fn a_binding_is_three_fields() {
        assert_eq!(
            binding("billing\x06\x16\x06\x16billing"),
            Some(("billing", "", "billing"))
        );
        assert_eq!(
            binding("\x06\x16\x06\x16w1@host.celery.pidbox"),
            Some(("", "", "w1@host.celery.pidbox"))
        );
        assert_eq!(
            binding("worker.#\x06\x16worker\\..*\x06\x16celeryev.1f"),
            Some(("worker.#", "worker\\..*", "celeryev.1f"))
        );
        assert_eq!(binding("no separator"), None);
    }

    fn members(all: &[&str]) -> Vec<String> {
        all.iter().map(|m| m.to_string()).collect()
    }

    #[test]
    fn bindings_give_task_queues_and_worker_names() {
        let mut b = Bindings::default();
        b.add("billing", &members(&["billing\x06\x16\x06\x16billing"]));
        b.add(
            "tasks",
            &members(&["a\x06\x16\x06\x16mail", "b\x06\x16\x06\x16mail"]),
        );
        b.add(
            "celery.pidbox",
            &members(&[
                "\x06\x16\x06\x16w1@h.celery.pidbox",
                "\x06\x16\x06\x16w2@h.celery.pidbox",
            ]),
        );
        b.add(
            "reply.celery.pidbox",
            &members(&["x\x06\x16\x06\x161f.reply.celery.pidbox"]),
        );
        b.add(
            "celeryev",
            &members(&["worker.#\x06\x16\x06\x16celeryev.1f"]),
        );
        assert_eq!(
            b.queues.iter().collect::<Vec<_>>(),
            ["billing", "mail"],
            "{b:?}"
        );
        assert_eq!(b.workers.iter().collect::<Vec<_>>(), ["w1@h", "w2@h"]);

        let two = b.consumers(2);
        assert_eq!(two.len(), 2);
        assert_eq!(two[0].name, "w1@h");
        assert_eq!(two[1].queues, ["billing", "mail"]);
        let one = b.consumers(1);
        assert_eq!(one[0].name, "a celery worker (one of w1@h, w2@h)");
        assert!(b.consumers(0).is_empty());
        assert_eq!(Bindings::default().consumers(1)[0].name, "a celery worker");
        assert_eq!(Seen::Consumers(two).count("mail"), Some(2));
        assert_eq!(Seen::Consumers(one).count("other"), Some(0));
    }

    fn message(expires: Value, expiration: Value) -> Decoded {
        let mut d = Decoded::default();
        d.field("headers", json!({ "id": "x", "expires": expires }))
            .field("properties", json!({ "expiration": expiration }));
        d
    }

    #[test]
    fn the_enqueue_time_is_the_expiry_less_the_time_left() {
        let at = |e, x| Celery.enqueued_at(&message(e, x));
        assert_eq!(
            at(json!("2023-11-14T22:14:20.500000+00:00"), json!("60000")),
            Some(1_700_000_000.5)
        );
        assert_eq!(
            at(json!("2023-11-14T22:14:20.5Z"), json!(60000)),
            Some(1_700_000_000.5)
        );
        // Expired when sent: the time left says nothing.
        assert_eq!(at(json!("2023-11-14T22:14:20Z"), json!("0")), None);
        assert_eq!(at(Value::Null, Value::Null), None);
        assert_eq!(at(json!("2023-11-14T22:14:20Z"), Value::Null), None);
        // Celery's date without its offset is not an instant.
        assert_eq!(at(json!("2023-11-14T22:14:20"), json!("60000")), None);
        assert_eq!(Celery.enqueued_at(&Decoded::default()), None);
    }
}
