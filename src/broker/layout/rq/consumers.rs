//! The consumers of the rq layout's queues (docs/redis-side.md#rq): each RQ worker adds its
//! key `rq:worker:<name>` to the set `<ns>rq:workers` and keeps the hash of that key (`queues`:
//! the names of the queues it reads, comma-separated; `last_heartbeat`), which RQ expires
//! `worker_ttl` + 60 s (480 s by default) after its last heartbeat; and it subscribes to its
//! command channel `rq:pubsub:<name>` (rq/worker/base.py `register_birth`, `heartbeat`,
//! `subscribe`; rq/worker_registration.py). A worker counts while its hash exists without
//! RQ's `death` mark (RQ's own rule, `Worker.find_by_key`) **and** its command channel has a
//! subscriber (`PUBSUB NUMSUB`): its connection to Redis is open.
//!
//! - A worker killed (SIGKILL, a crash, the OOM killer) stops counting at once: the kernel
//!   closes its connection and Redis drops the subscription, while RQ's hash stays up to
//!   `worker_ttl` + 60 s and `rq info` still lists it. Killed while a job runs, it counts
//!   until that job's work horse (a fork that holds the same connection) ends.
//! - A worker stopped (SIGSTOP) keeps its connection open: it counts until its hash expires,
//!   `worker_ttl` + 60 s after its last heartbeat.
//! - A worker stopped cleanly (SIGTERM) leaves the set and marks its hash `death` at once.
//! - RQ's keys have no prefix of its own: the namespace is a raw prefix before them, as the
//!   layout writes them (docs/layouts/rq.md). The set's members are the workers' hash keys, read
//!   as they are (RQ does the same). Channels are not keys: RQ names a worker's channel
//!   `rq:pubsub:<name>` whatever its keys are called, so under a namespace both that and the
//!   prefixed name are asked; and Redis's channels are shared by its databases, so a live worker
//!   of the same name on another database would count for a dead one (RQ names its workers by a
//!   random uuid unless told otherwise).

use std::collections::BTreeSet;

use super::super::consumers::{
    field_seconds, namespaces_of_keys, Consumer, Consumers, Reading, Seen,
};
use super::super::peek::Decoded;
use super::{Rq, QUEUE_INFIX};
use crate::broker::connection::RedisConnection;

/// RQ's worker key before the worker's name (`Worker.redis_worker_namespace_prefix`).
const WORKER_INFIX: &str = "rq:worker:";

/// RQ's command channel before the worker's name (rq/command.py `PUBSUB_CHANNEL_TEMPLATE`).
const CHANNEL_INFIX: &str = "rq:pubsub:";

/// The set of the workers' keys (rq/worker_registration.py `REDIS_WORKER_KEYS`).
const WORKERS: &str = "rq:workers";

/// A worker's name: its key without `<ns>rq:worker:` (or RQ's own `rq:worker:`).
fn worker_name<'a>(key: &'a str, namespace: &str) -> &'a str {
    key.strip_prefix(namespace)
        .and_then(|k| k.strip_prefix(WORKER_INFIX))
        .or_else(|| key.strip_prefix(WORKER_INFIX))
        .unwrap_or(key)
}

/// The channels a worker of that name may listen on: RQ's `rq:pubsub:<name>`, and under a
/// namespace the prefixed name too (see the module).
fn channels(name: &str, namespace: &str) -> Vec<String> {
    let own = format!("{CHANNEL_INFIX}{name}");
    if namespace.is_empty() {
        vec![own]
    } else {
        vec![format!("{namespace}{own}"), own]
    }
}

/// The queue names of a worker hash's `queues` field (`','.join(queue_names)`), each once.
fn queue_names(field: &str) -> Vec<String> {
    let set: BTreeSet<&str> = field.split(',').filter(|q| !q.is_empty()).collect();
    set.into_iter().map(str::to_owned).collect()
}

impl Consumers for Rq {
    fn seen<'a>(&'a self, con: &'a mut RedisConnection, namespace: &'a str) -> Reading<'a, Seen> {
        Box::pin(async move {
            let keys: Vec<String> = redis::cmd("SMEMBERS")
                .arg(format!("{namespace}{WORKERS}"))
                .query_async(con)
                .await?;
            if keys.is_empty() {
                return Ok(Seen::Consumers(Vec::new()));
            }
            let names: Vec<&str> = keys.iter().map(|k| worker_name(k, namespace)).collect();
            let mut pipe = redis::pipe();
            for key in &keys {
                pipe.cmd("HMGET").arg(key).arg("queues").arg("death");
            }
            let mut numsub = redis::cmd("PUBSUB");
            numsub.arg("NUMSUB");
            for name in &names {
                numsub.arg(channels(name, namespace));
            }
            pipe.add_command(numsub);
            let mut replies: Vec<redis::Value> = pipe.query_async(con).await?;
            // NUMSUB answers channel, count, channel, count, ... in the order asked.
            let subscribed: Vec<(String, u64)> =
                redis::from_redis_value(&replies.pop().expect("NUMSUB's answer"))?;
            let per_worker = channels("", namespace).len();
            let alive = keys
                .iter()
                .zip(&names)
                .zip(replies.iter().zip(subscribed.chunks(per_worker)))
                .filter_map(|((_, name), (hash, subs))| {
                    let (queues, death): (Option<String>, Option<String>) =
                        redis::from_redis_value(hash).ok()?;
                    let listening = subs.iter().any(|(_, n)| *n > 0);
                    let queues = queue_names(&queues?);
                    (listening && death.is_none()).then(|| Consumer {
                        name: (*name).to_owned(),
                        queues,
                    })
                })
                .collect();
            Ok(Seen::Consumers(alive))
        })
    }

    fn namespaces_in_use<'a>(
        &'a self,
        con: &'a mut RedisConnection,
        namespace: &'a str,
    ) -> Reading<'a, Vec<String>> {
        Box::pin(namespaces_of_keys(con, WORKERS, "set", namespace))
    }

    /// The set `<ns>rq:queues` (`Queue.all`): its members are queue keys, `rq:queue:<name>`
    /// as RQ's client adds them, `<ns>rq:queue:<name>` as the relay does.
    fn registered_queues<'a>(
        &'a self,
        con: &'a mut RedisConnection,
        namespace: &'a str,
    ) -> Reading<'a, Vec<String>> {
        Box::pin(async move {
            let keys: Vec<String> = redis::cmd("SMEMBERS")
                .arg(format!("{namespace}rq:queues"))
                .query_async(con)
                .await?;
            let names: BTreeSet<String> = keys
                .iter()
                .filter_map(|k| {
                    k.strip_prefix(namespace)
                        .and_then(|k| k.strip_prefix(QUEUE_INFIX))
                        .or_else(|| k.strip_prefix(QUEUE_INFIX))
                })
                .map(str::to_owned)
                .collect();
            Ok(names.into_iter().collect())
        })
    }

    /// The job hash's `enqueued_at` (RQ's `utcformat`, UTC; empty for a scheduled job).
    fn enqueued_at(&self, job: &Decoded) -> Option<f64> {
        field_seconds(job, "enqueued_at", 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_is_named_by_its_key() {
        assert_eq!(worker_name("rq:worker:3f2a", ""), "3f2a");
        assert_eq!(worker_name("myapp:rq:worker:3f2a", "myapp:"), "3f2a");
        // A namespaced set may hold RQ's own keys.
        assert_eq!(worker_name("rq:worker:3f2a", "myapp:"), "3f2a");
        assert_eq!(worker_name("other", "myapp:"), "other");
    }

    #[test]
    fn a_workers_channels_are_rqs_and_the_namespaced() {
        assert_eq!(channels("w1", ""), ["rq:pubsub:w1"]);
        assert_eq!(
            channels("w1", "myapp:"),
            ["myapp:rq:pubsub:w1", "rq:pubsub:w1"]
        );
        assert_eq!(channels("", "").len(), 1);
        assert_eq!(channels("", "x:").len(), 2);
    }

    #[test]
    fn the_queues_field_is_comma_separated() {
        assert_eq!(queue_names("billing,mail"), ["billing", "mail"]);
        assert_eq!(queue_names("mail,billing,mail"), ["billing", "mail"]);
        assert_eq!(queue_names("default"), ["default"]);
        assert!(queue_names("").is_empty());
    }

    #[test]
    fn the_enqueue_time_is_rqs_utcformat() {
        let mut job = Decoded::default();
        job.field("enqueued_at", "2023-11-14T22:13:20.500000Z");
        assert_eq!(Rq.enqueued_at(&job), Some(1_700_000_000.5));
        let mut scheduled = Decoded::default();
        scheduled.field("enqueued_at", "");
        assert_eq!(Rq.enqueued_at(&scheduled), None);
    }
}
