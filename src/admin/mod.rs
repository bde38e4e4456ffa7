//! Operator commands: `status` and `dead-letter` (Postgres), `peek` (Redis).

pub mod dead_letter;
#[cfg(feature = "daemon")]
pub mod peek;
pub mod status;
