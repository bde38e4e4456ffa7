//! Metrics, logs, the events that write both, and the redaction of secrets from them.

pub mod events;
#[cfg(feature = "daemon")]
pub mod logging;
pub mod metrics;
pub(crate) mod panic;
pub mod redact;
