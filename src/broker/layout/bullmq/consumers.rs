//! The consumers of the bullmq layout's queues (docs/redis-side.md#bullmq): BullMQ keeps no
//! record of its workers in keys; it names their connections. Each `Worker` opens one
//! dedicated blocking connection (the one its `BZPOPMIN` waits on) and names it, with
//! `CLIENT SETNAME`, `<prefix>:<base64(queue name)>`, or `<prefix>:<base64(queue
//! name)>:w:<worker name>` when the worker was given a `name` (BullMQ 6.7,
//! `utils/create-backend.js` `createBlockingConnection`); its other connection has no name.
//! `Queue.getWorkers()` lists the clients of `CLIENT LIST` whose name is exactly the first or
//! starts with `<prefix>:<base64>:w:` (`queue-getters.js`), so one worker is one client there,
//! and one consumer here: the same rule, read with `CLIENT LIST TYPE normal`. A `QueueEvents`
//! names its connection `<prefix>:<base64>:qe` and is not a worker.
//!
//! The limits are those of `getWorkers`: a worker counts while its connection is open, so a
//! stopped (`SIGSTOP`) or wedged process is still counted, and one killed outright until the
//! server notices its connection closed (at once on a clean close or a reset; after
//! `tcp-keepalive` on a host that vanished). A server that refuses `CLIENT LIST` (an ACL, a
//! renamed command, some managed Redis) makes the count unknown ([`Seen::Unrecorded`]), and one
//! that refuses `CLIENT SETNAME` leaves the workers unnamed: none is seen. On a Redis Cluster
//! `CLIENT LIST` is per node, and the relay's connection asks one primary (redis-rs routes the
//! command like a key, to the owner of the slot of the word `LIST`): workers connected to other
//! nodes only are not counted there, where `getWorkers` asks every node and takes the one with
//! the most.
//!
//! BullMQ has no registry of its queues; a queue that was added to or read by a worker has its
//! `meta` hash `<ns><queue>:meta`, so [`Consumers::registered_queues`] lists those a bounded
//! `SCAN` ([`SCAN_BUDGET`] keys) finds: `status` and `check` then see a queue of the runner the
//! outbox no longer names, as in the Sidekiq layout, and may miss some in a large database. Not
//! on a Redis Cluster, where a `SCAN` is one node's and the relay's connection would send each
//! step to any node: none there.

use std::collections::BTreeSet;

use base64::Engine as _;
use redis::ErrorKind;

use super::super::consumers::{
    field_seconds, glob_escape, scan_keys, Consumer, Consumers, Reading, Seen, SCAN_BUDGET,
};
use super::super::peek::Decoded;
use super::Bullmq;
use crate::broker::connection::{RedisConnection, Topology};

/// What a worker's connection name adds after the queue's base64 name when the worker has a
/// name of its own (BullMQ's `:w:`).
const NAMED_WORKER: &str = ":w:";

/// The suffix of a queue's `meta` hash after the queue's name.
const META_SUFFIX: &str = ":meta";

/// The client names in a `CLIENT LIST` reply: each line's `name=` field, when not empty.
fn client_names(list: &str) -> impl Iterator<Item = &str> {
    list.lines().filter_map(|line| {
        line.split(' ')
            .find_map(|field| field.strip_prefix("name="))
            .filter(|name| !name.is_empty())
    })
}

/// The queue a worker's connection name after its prefix and `:` (`rest`) names, when it is a
/// worker's name by `getWorkers`' rule: `<base64>` or `<base64>:w:<worker name>`, the base64
/// decoding to UTF-8 (what `Buffer.from(name).toString('base64')` wrote).
fn worker_queue(rest: &str) -> Option<String> {
    let (encoded, after) = match rest.find(':') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if !(after.is_empty() || after.starts_with(NAMED_WORKER)) {
        return None;
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()?;
    String::from_utf8(bytes).ok().filter(|q| !q.is_empty())
}

/// The workers among `names` under `namespace` (BullMQ's prefix and `:`).
fn workers<'n>(names: impl Iterator<Item = &'n str>, namespace: &str) -> Vec<Consumer> {
    names
        .filter_map(|name| {
            let queue = worker_queue(name.strip_prefix(namespace)?)?;
            Some(Consumer {
                name: name.to_owned(),
                queues: vec![queue],
            })
        })
        .collect()
}

/// The namespaces (prefix and `:`) of the workers among `names`, but `namespace`. A prefix may
/// hold `:` itself, so each `:` of a name is tried in turn and the first after which a
/// worker's name follows is taken (a worker's own name, after `:w:`, may hold anything).
fn worker_namespaces<'n>(names: impl Iterator<Item = &'n str>, namespace: &str) -> Vec<String> {
    let mut found = BTreeSet::new();
    for name in names {
        let ns = name
            .match_indices(':')
            .map(|(i, _)| i + 1)
            .find(|&end| worker_queue(&name[end..]).is_some())
            .map(|end| &name[..end]);
        if let Some(ns) = ns.filter(|ns| *ns != namespace) {
            found.insert(ns.to_owned());
        }
    }
    found.into_iter().collect()
}

/// Why BullMQ's consumers are not counted on a server that refuses `CLIENT LIST`.
const CLIENT_LIST_REFUSED: &str = "the server refuses CLIENT LIST (an ACL, a renamed command, \
     some managed Redis), where BullMQ's workers are found by their connections' names";

/// `CLIENT LIST` of the normal clients (not replicas or Pub/Sub), as one text; `None` when the
/// server refuses the command (an error reply: `NOPERM`, an unknown or renamed command), as
/// `getWorkers` gives up there too; an outage is still an error.
async fn client_list(con: &mut RedisConnection) -> redis::RedisResult<Option<String>> {
    let list = redis::cmd("CLIENT")
        .arg("LIST")
        .arg("TYPE")
        .arg("normal")
        .query_async(con)
        .await;
    match list {
        Ok(list) => Ok(Some(list)),
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::ResponseError | ErrorKind::ExtensionError
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

impl Consumers for Bullmq {
    fn seen<'a>(&'a self, con: &'a mut RedisConnection, namespace: &'a str) -> Reading<'a, Seen> {
        Box::pin(async move {
            Ok(match client_list(con).await? {
                Some(list) => Seen::Consumers(workers(client_names(&list), namespace)),
                None => Seen::Unrecorded(CLIENT_LIST_REFUSED),
            })
        })
    }

    /// The other prefixes (with their `:`) that workers' connection names carry: no `SCAN`.
    fn namespaces_in_use<'a>(
        &'a self,
        con: &'a mut RedisConnection,
        namespace: &'a str,
    ) -> Reading<'a, Vec<String>> {
        Box::pin(async move {
            Ok(match client_list(con).await? {
                Some(list) => worker_namespaces(client_names(&list), namespace),
                None => Vec::new(),
            })
        })
    }

    /// The queues whose `<ns><queue>:meta` hash a `SCAN` of at most [`SCAN_BUDGET`] keys
    /// finds (a BullMQ queue name holds no `:`); none on a Cluster (see the module).
    fn registered_queues<'a>(
        &'a self,
        con: &'a mut RedisConnection,
        namespace: &'a str,
    ) -> Reading<'a, Vec<String>> {
        Box::pin(async move {
            if con.topology() == Topology::Cluster {
                return Ok(Vec::new());
            }
            let pattern = format!("{}*{META_SUFFIX}", glob_escape(namespace));
            let (keys, _) = scan_keys(con, &pattern, "hash", SCAN_BUDGET).await?;
            let found: BTreeSet<String> = keys
                .iter()
                .filter_map(|key| {
                    let queue = key.strip_prefix(namespace)?.strip_suffix(META_SUFFIX)?;
                    (!queue.is_empty() && !queue.contains(':')).then(|| queue.to_owned())
                })
                .collect();
            Ok(found.into_iter().collect())
        })
    }

    /// The job hash's `timestamp`: when it was added, in milliseconds (by Redis's clock when
    /// the relay added it; by the adding process's clock when `Queue.add` did). A delayed job
    /// promoted to the wait list keeps it, so its age counts its delay too. A hash field is
    /// text, and peek keeps it so (`"1700000000250"`): read as the number it spells.
    fn enqueued_at(&self, job: &Decoded) -> Option<f64> {
        match job.get("timestamp")? {
            serde_json::Value::String(ms) => ms.trim().parse::<f64>().ok().map(|ms| ms * 1e-3),
            _ => field_seconds(job, "timestamp", 1e-3),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `CLIENT LIST` lines as redis-server 7.0 writes them (fields shortened).
    const LIST: &str = "\
id=3 addr=127.0.0.1:50000 laddr=127.0.0.1:6379 fd=8 name= age=9 db=0 cmd=client|list\n\
id=4 addr=127.0.0.1:50002 laddr=127.0.0.1:6379 fd=9 name=bull:YmlsbGluZw== age=9 db=0 cmd=bzpopmin\n\
id=5 addr=127.0.0.1:50004 laddr=127.0.0.1:6379 fd=10 name=bull:YmlsbGluZw==:qe age=9 db=0 cmd=xread\n\
id=6 addr=127.0.0.1:50006 laddr=127.0.0.1:6379 fd=11 name=bull:bWFpbA==:w:mailer:1 age=9 db=0 cmd=bzpopmin\n\
id=7 addr=127.0.0.1:50008 laddr=127.0.0.1:6379 fd=12 name=my:app:YmlsbGluZw== age=9 db=0 cmd=bzpopmin\n\
id=8 addr=127.0.0.1:50010 laddr=127.0.0.1:6379 fd=13 name=bull:not*base64 age=9 db=0 cmd=get\n\
id=9 addr=127.0.0.1:50012 laddr=127.0.0.1:6379 fd=14 name=sidekiq age=9 db=0 cmd=get\n";

    #[test]
    fn workers_are_the_clients_named_as_get_workers_matches_them() {
        let seen = workers(client_names(LIST), "bull:");
        let names: Vec<(&str, &str)> = seen
            .iter()
            .map(|c| (c.name.as_str(), c.queues[0].as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("bull:YmlsbGluZw==", "billing"),
                ("bull:bWFpbA==:w:mailer:1", "mail")
            ],
            "a QueueEvents (:qe), an unnamed client, another prefix and a name that is not \
             base64 are not workers"
        );
        let seen = Seen::Consumers(seen);
        assert_eq!(seen.count("billing"), Some(1));
        assert_eq!(seen.count("other"), Some(0));
    }

    #[test]
    fn a_prefix_may_hold_colons() {
        let seen = workers(client_names(LIST), "my:app:");
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].queues, ["billing"]);
        assert!(workers(client_names(LIST), "my:").is_empty());
    }

    #[test]
    fn other_namespaces_are_the_workers_prefixes() {
        assert_eq!(
            worker_namespaces(client_names(LIST), "myapp:"),
            ["bull:", "my:app:"]
        );
        assert_eq!(worker_namespaces(client_names(LIST), "bull:"), ["my:app:"]);
    }

    #[test]
    fn the_age_comes_from_the_job_timestamp_in_milliseconds() {
        let mut job = Decoded::default();
        job.field("timestamp", 1_700_000_000_250u64);
        assert_eq!(Bullmq.enqueued_at(&job), Some(1_700_000_000.25));
        let mut hash = Decoded::default();
        hash.bytes("timestamp", b"1700000000250");
        assert_eq!(
            Bullmq.enqueued_at(&hash),
            Some(1_700_000_000.25),
            "as HGETALL gives it"
        );
        assert_eq!(Bullmq.enqueued_at(&Decoded::default()), None);
    }
}
