//! Operator commands: `status`, `dead-letter` and the held ordering keys (Postgres), `peek` and
//! the queues' Redis side (Redis).

pub mod dead_letter;
pub mod held_keys;
#[cfg(feature = "daemon")]
pub mod peek;
#[cfg(feature = "daemon")]
pub mod queues;
pub mod status;
