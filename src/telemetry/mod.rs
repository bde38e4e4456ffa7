//! Metrics, logs and the redaction of secrets from both.

#[cfg(feature = "daemon")]
pub mod logging;
pub mod metrics;
pub mod redact;
