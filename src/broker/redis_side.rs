//! The daemon's watch of the Redis side (docs/redis-side.md): the queues its sinks fed
//! recently ([`FedQueues`], noted by [`super::redis_sink::RedisSink`] after each acknowledged
//! push), read every [`WATCH_EVERY`] with [`crate::admin::queues::look`]: their gauges, and a
//! warning once per episode for a queue whose jobs wait with no consumer recorded, naming the
//! namespace its consumers do use when one is found.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::connection::{self, RedisConnection, RedisEndpoint};
use super::fed_queues::FedQueues;
use crate::admin::queues::{self, QueueSide};
use crate::broker::layout::LayoutKind;
use crate::telemetry::events::{
    Event, FedQueuesUnrecorded, QueueConsumedAgain, QueueStarving, QueuesSampled,
    RedisSideReadable, RedisSideUnreadable,
};
use crate::telemetry::redact;

/// How often the daemon reads the Redis side of the queues it fed.
pub const WATCH_EVERY: Duration = Duration::from_secs(5);

/// What the watch reads and says.
#[derive(Debug, Clone)]
pub struct Watch {
    /// Where.
    pub redis: RedisEndpoint,
    /// Which runner's keys.
    pub layout: LayoutKind,
    /// Under which namespace.
    pub namespace: String,
    /// Queues fed this recently are watched.
    pub window: Duration,
    /// Bound on each read (the push timeout).
    pub timeout: Duration,
}

/// Watches the Redis side of the queues in `fed` until `shutdown` (see the module).
pub async fn watch(w: Watch, fed: std::sync::Arc<FedQueues>, shutdown: CancellationToken) {
    let mut con: Option<RedisConnection> = None;
    // The queues starving now, and whether reading failed in the current round of failures.
    let mut starving: BTreeMap<String, ()> = BTreeMap::new();
    let mut unreadable = false;
    let mut unrecorded = false;
    let mut tick = tokio::time::interval(WATCH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let names = fed.recent(w.window);
        if names.is_empty() {
            QueuesSampled { queues: &[] }.emit();
            end_episodes(&mut starving, &[]);
            continue;
        }
        let read = async {
            if con.is_none() {
                con = Some(connection::connect(&w.redis, w.timeout).await?);
            }
            let c = con.as_mut().expect("connected");
            let side = queues::look(c, w.layout, &w.namespace, &names).await?;
            // The record status and check read; a refusal (an ACL) is told once, the watch
            // goes on.
            match queues::record_fed(c, &w.namespace, &names, w.window, side.read_at).await {
                Ok(()) => unrecorded = false,
                Err(e) if !unrecorded => {
                    unrecorded = true;
                    FedQueuesUnrecorded {
                        key: &queues::fed_key(&w.namespace),
                        error: &redact::scrub(&e.to_string()),
                    }
                    .emit();
                }
                Err(_) => {}
            }
            Ok::<_, redis::RedisError>(side)
        };
        match tokio::time::timeout(w.timeout, read).await {
            Ok(Ok(side)) => {
                if unreadable {
                    unreadable = false;
                    RedisSideReadable.emit();
                }
                QueuesSampled {
                    queues: &side.queues,
                }
                .emit();
                let c = con.as_mut().expect("connected");
                for q in side.queues.iter().filter(|q| q.starving()) {
                    if starving.contains_key(&q.queue) {
                        continue;
                    }
                    starving.insert(q.queue.clone(), ());
                    let elsewhere = tokio::time::timeout(
                        w.timeout,
                        queues::elsewhere(c, w.layout, &w.namespace, &q.queue),
                    )
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .unwrap_or_default();
                    QueueStarving {
                        side: q,
                        layout: w.layout,
                        namespace: &w.namespace,
                        elsewhere: &elsewhere,
                    }
                    .emit();
                }
                end_episodes(&mut starving, &side.queues);
            }
            failed => {
                let error = match failed {
                    Ok(Err(e)) => redact::scrub(&e.to_string()).into_owned(),
                    _ => format!("no answer within {}", humantime::format_duration(w.timeout)),
                };
                // What the gauges said is no longer known.
                QueuesSampled { queues: &[] }.emit();
                if !unreadable {
                    unreadable = true;
                    RedisSideUnreadable { error: &error }.emit();
                }
            }
        }
    }
}

/// Ends the episode of each starving queue that no longer is (a consumer seen, no job
/// waiting, or no longer watched).
fn end_episodes(starving: &mut BTreeMap<String, ()>, sides: &[QueueSide]) {
    let ended: Vec<String> = starving
        .keys()
        .filter(|q| !sides.iter().any(|s| &&s.queue == q && s.starving()))
        .cloned()
        .collect();
    for q in ended {
        starving.remove(&q);
        let side = sides.iter().find(|s| s.queue == q);
        QueueConsumedAgain { queue: &q, side }.emit();
    }
}
