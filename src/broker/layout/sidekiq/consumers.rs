//! The consumers of the sidekiq layout's queues (docs/redis-side.md#sidekiq): each Sidekiq
//! process adds its identity to `<ns>processes` and writes, every few seconds, its hash
//! `<ns><identity>` (`info`: JSON naming its `queues`; `beat`: epoch seconds of its last
//! heartbeat), which expires after 60 s. A process counts while its last beat is less than
//! [`BEAT_STALE_AFTER`] old by Redis's clock: Sidekiq's own rule, the hash's lifetime.

use std::collections::BTreeSet;

use super::super::consumers::{
    field_seconds, namespaces_of_keys, Consumer, Consumers, Reading, Seen,
};
use super::super::peek::Decoded;
use super::Sidekiq;
use crate::broker::connection::RedisConnection;

/// A process's `info` and `beat`, if its hash has them.
type Beat = (Option<String>, Option<f64>);

/// A process whose last heartbeat is older is gone (Sidekiq expires its hash after 60 s).
const BEAT_STALE_AFTER: f64 = 60.0;

impl Consumers for Sidekiq {
    fn seen<'a>(&'a self, con: &'a mut RedisConnection, namespace: &'a str) -> Reading<'a, Seen> {
        Box::pin(async move {
            let identities: Vec<String> = redis::cmd("SMEMBERS")
                .arg(format!("{namespace}processes"))
                .query_async(con)
                .await?;
            if identities.is_empty() {
                return Ok(Seen::Consumers(Vec::new()));
            }
            let mut pipe = redis::pipe();
            pipe.cmd("TIME");
            for id in &identities {
                pipe.cmd("HMGET")
                    .arg(format!("{namespace}{id}"))
                    .arg("info")
                    .arg("beat");
            }
            let mut replies: Vec<redis::Value> = pipe.query_async(con).await?;
            let (secs, micros): (u64, u64) = redis::from_redis_value(&replies.remove(0))?;
            let now = secs as f64 + micros as f64 / 1e6;
            let beats: Vec<Beat> = replies
                .iter()
                .map(redis::from_redis_value)
                .collect::<redis::RedisResult<_>>()?;
            let alive = identities
                .into_iter()
                .zip(beats)
                .filter_map(|(name, (info, beat))| {
                    let fresh = beat.is_some_and(|b| now - b < BEAT_STALE_AFTER);
                    let info: serde_json::Value = serde_json::from_str(&info?).ok()?;
                    let queues: BTreeSet<String> = info["queues"]
                        .as_array()?
                        .iter()
                        .filter_map(|q| q.as_str().map(str::to_owned))
                        .collect();
                    fresh.then(|| Consumer {
                        name,
                        queues: queues.into_iter().collect(),
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
        Box::pin(namespaces_of_keys(con, "processes", "set", namespace))
    }

    fn registered_queues<'a>(
        &'a self,
        con: &'a mut RedisConnection,
        namespace: &'a str,
    ) -> Reading<'a, Vec<String>> {
        Box::pin(async move {
            let mut queues: Vec<String> = redis::cmd("SMEMBERS")
                .arg(format!("{namespace}queues"))
                .query_async(con)
                .await?;
            queues.sort();
            Ok(queues)
        })
    }

    /// Sidekiq's `enqueued_at` (epoch seconds).
    fn enqueued_at(&self, job: &Decoded) -> Option<f64> {
        field_seconds(job, "enqueued_at", 1.0)
    }
}
