//! A connection URL that keeps its password out of logs.

use std::fmt;

use crate::telemetry::redact;

/// A connection URL whose password never shows in `Debug` or `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretUrl(pub(super) String);

impl SecretUrl {
    /// The URL itself, password included. Pass it to a client; never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", redact::redact_url(&self.0))
    }
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact::redact_url(&self.0))
    }
}
