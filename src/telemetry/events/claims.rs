//! Whether the relay's claims run as named statements (`jobrelay_named_claims`,
//! docs/cli.md#postgres-connections): INFO when they become named, WARN when named claims end.

use super::Event;
use crate::telemetry::metrics;

/// Claims run as named statements from now on, planned once per connection: the relay proved
/// its connections sessions of their own (`--prepared-statements=auto`). INFO, once.
#[derive(Debug, Clone, Copy)]
pub struct ClaimsNamed;

impl ClaimsNamed {
    /// Sets `jobrelay_named_claims` without a log line: the relay's start.
    pub fn gauge(named: bool) {
        metrics::named_claims(named);
    }
}

impl Event for ClaimsNamed {
    fn emit(self) {
        metrics::named_claims(true);
        tracing::info!(
            "claims named: the relay's connections are sessions of their own, and each claim \
             is planned once per connection (--prepared-statements=auto)"
        );
    }
}

/// Named claims ended: a claim found that its connection does not keep them (or the listener
/// found the connections no longer sessions); every claim from now on is unnamed. WARN, once.
#[derive(Debug, Clone, Copy)]
pub struct ClaimsUnnamed<'a> {
    /// What showed it.
    pub error: &'a str,
}

impl Event for ClaimsUnnamed<'_> {
    fn emit(self) {
        metrics::named_claims(false);
        tracing::warn!(
            failure = "claims_unnamed",
            error = self.error,
            "claims unnamed: --prepared-statements, but a named claim failed (PgBouncer in \
             transaction mode before 1.21 or without max_prepared_statements?); the batch is \
             rolled back and every claim from now on is unnamed \
             (docs/cli.md#postgres-connections)"
        );
    }
}
