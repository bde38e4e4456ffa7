//! Waking the workers when rows are committed.
//!
//! - `listen`: LISTEN on the table's channel; every notification bumps a generation counter.
//! - [`lock`]: the advisory wake-up lock: while a relay is busy it holds the lock, producers
//!   skip NOTIFY, and the relay polls instead ([`lock::WakeupLock::step`]).

pub(crate) mod listen;
pub mod lock;
