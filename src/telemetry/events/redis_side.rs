//! The watch of the Redis side (docs/redis-side.md): each sample's gauges, a queue whose jobs
//! wait with no consumer (once per episode), and the watch's own failures to read.

use super::Event;
use crate::admin::queues::{QueueSide, Starving};
use crate::broker::layout::LayoutKind;
use crate::telemetry::metrics;

/// One sample of the watched queues (`jobrelay_queue_depth`,
/// `jobrelay_queue_oldest_age_seconds`, `jobrelay_queue_consumers`, by queue): the series are
/// exactly these queues, the ones before are gone. No log line: one every 5 s.
#[derive(Debug)]
pub struct QueuesSampled<'a> {
    /// The queues, as Redis shows them (none: no series).
    pub queues: &'a [QueueSide],
}

impl Event for QueuesSampled<'_> {
    fn emit(self) {
        metrics::queue_sides(self.queues);
    }
}

/// A queue the relay fed has jobs waiting and its runner records no consumer of it under the
/// namespace the relay writes to (WARN, once per episode; docs/runbook.md#queue-without-consumer).
#[derive(Debug)]
pub struct QueueStarving<'a> {
    /// The queue.
    pub side: &'a QueueSide,
    /// The layout.
    pub layout: LayoutKind,
    /// The relay's namespace.
    pub namespace: &'a str,
    /// The namespaces where the runner records consumers of the queue.
    pub elsewhere: &'a [String],
}

impl Event for QueueStarving<'_> {
    fn emit(self) {
        let line = Starving {
            side: self.side,
            layout: self.layout,
            namespace: self.namespace,
            elsewhere: self.elsewhere,
        };
        tracing::warn!(
            failure = "queue_without_consumer",
            queue = %self.side.queue,
            layout = %self.layout,
            namespace = %self.namespace,
            waiting = self.side.depth,
            oldest_age_seconds = self.side.oldest_age_seconds.map(|a| (a * 10.0).round() / 10.0),
            consumers_namespaces = ?self.elsewhere,
            "{line}"
        );
    }
}

/// A queue [`QueueStarving`] named is no longer: a consumer is seen, no job waits, or the relay
/// no longer feeds it (INFO).
#[derive(Debug)]
pub struct QueueConsumedAgain<'a> {
    /// The queue.
    pub queue: &'a str,
    /// How it looks now, if it is still watched.
    pub side: Option<&'a QueueSide>,
}

impl Event for QueueConsumedAgain<'_> {
    fn emit(self) {
        let why = match self.side {
            Some(s) if s.consumers.unwrap_or(0) > 0 => "a consumer is seen",
            Some(_) => "no job waits",
            None => "the relay no longer feeds it",
        };
        tracing::info!(queue = %self.queue, "queue {}: no longer without a consumer ({why})", self.queue);
    }
}

/// The watch could not read the Redis side (WARN, once per episode; the queue gauges are
/// gone meanwhile). An outage of Redis itself is told by the probe.
#[derive(Debug)]
pub struct RedisSideUnreadable<'a> {
    /// Why, free of secrets.
    pub error: &'a str,
}

impl Event for RedisSideUnreadable<'_> {
    fn emit(self) {
        tracing::warn!(
            failure = "redis_side_unreadable",
            error = %self.error,
            "cannot read the queues' Redis side (waiting jobs, consumers): {}",
            self.error
        );
    }
}

/// The watch reads the Redis side again (INFO).
#[derive(Debug)]
pub struct RedisSideReadable;

impl Event for RedisSideReadable {
    fn emit(self) {
        tracing::info!("the queues' Redis side is readable again");
    }
}

/// The watch could not record the queues it fed in `<namespace>jobrelay:queues` (WARN, once
/// until it can): `status` and `check` do not list them; the watch goes on.
#[derive(Debug)]
pub struct FedQueuesUnrecorded<'a> {
    /// The key.
    pub key: &'a str,
    /// Why, free of secrets.
    pub error: &'a str,
}

impl Event for FedQueuesUnrecorded<'_> {
    fn emit(self) {
        tracing::warn!(
            failure = "fed_queues_unrecorded",
            key = %self.key,
            error = %self.error,
            "cannot record the queues fed in {} (status and check will not list them): {}",
            self.key,
            self.error
        );
    }
}
