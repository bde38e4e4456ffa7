//! The error of a bad option, naming its culprit.

/// A bad option: `{culprit}: {reason}`, e.g. `--batch-size: "ten" is not a whole number`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{culprit}: {reason}")]
pub struct ConfigError {
    /// The flag, variable or file key at fault.
    pub culprit: String,
    /// What is wrong with it, free of secrets.
    pub reason: String,
}
