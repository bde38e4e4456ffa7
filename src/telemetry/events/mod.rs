//! What the relay tells its operator, one type per thing that happened.
//!
//! Each event's [`Event::emit`] writes its log line and updates its metrics, in one place, so
//! that no call site pairs a `tracing::warn!` with a counter by hand and none can forget one of
//! the two (the pattern of vector's `internal_events`). Call sites build the event and emit it;
//! the metric names and the recording functions live in [`super::metrics`], which only the
//! events here may call. The log messages and fields are part of the contract
//! (docs/metrics.md#logs): operators and tests search for them.
//!
//! Some events have no log line (a job's lag, a backlog sample: one per job or per sample
//! would flood the log) and some no metric (an episode of the outbox table); each says why.
//! Whether an event is logged once per episode is decided by its caller ([`crate::relay::health`]
//! logs a dependency's outage when it begins and when it ends, not at every failure).
//!
//! - [`batch`]: what a batch did (outcomes, failures, dead letters, its duration).
//! - [`dependency`]: the episodes of Postgres, Redis and the outbox table; task panics.
//! - [`backlog`]: the probe's samples of the backlog and the xmin horizon.
//! - [`claims`]: whether claims run as named statements.
//! - [`held_keys`]: ordering keys held by a dead-lettered row (the probe's samples, episodes).
//! - [`redis_side`]: the watch of the queues' Redis side (waiting jobs, consumers).

pub mod backlog;
pub mod batch;
pub mod claims;
pub mod dependency;
pub mod held_keys;
#[cfg(feature = "daemon")]
pub mod redis_side;
#[cfg(all(test, feature = "daemon"))]
mod tests;

pub use self::backlog::{
    BacklogSampled, Horizon, XminHorizonHeld, XminHorizonMovedOn, XminHorizonSampled,
    HORIZON_WARN_AFTER,
};
pub use self::batch::{
    BatchAnswered, BatchCommitted, BatchSettledApart, DeadRow, Failures, JobAnswered, LateJob,
    LateJobsRepaired, OversizeRowsDeadLettered, PushFailed, RowsDeadLettered, DEAD_REASON_CHARS,
    DEAD_ROWS_NAMED,
};
pub use self::claims::{ClaimsNamed, ClaimsUnnamed};
pub use self::dependency::{
    BatchesFailing, BatchesSucceedAgain, DependencyConnected, DependencyDown, DependencyRecovered,
    OutboxTableMissing, OutboxTablePresent, TaskPanicked,
};
pub use self::held_keys::{HeldKeysSampled, OrderingKeyHeld, OrderingKeysReleased};

#[cfg(feature = "daemon")]
pub use self::redis_side::{
    FedQueuesUnrecorded, QueueConsumedAgain, QueueStarving, QueuesSampled, RedisSideReadable,
    RedisSideUnreadable,
};

/// Something that happened, for the operator: a log line, metrics, or both.
pub trait Event {
    /// Writes the event's log line and updates its metrics.
    fn emit(self);
}
