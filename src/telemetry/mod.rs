//! Metrics, logs and the redaction of secrets from both.

pub mod logging;
pub mod metrics;
pub mod redact;
