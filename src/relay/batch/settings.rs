//! How a batch is claimed and what happens to rows that fail.

use std::time::Duration;

use crate::relay::prepared::PreparedStatements;

/// How a batch is claimed and what happens to rows that fail.
#[derive(Debug, Clone)]
pub struct BatchSettings {
    /// Rows claimed per transaction.
    pub batch_size: usize,
    /// Bytes claimed per transaction (payloads, headers and options, plus an estimate per
    /// row), past the first row.
    pub max_batch_bytes: usize,
    /// Largest payload fetched: a row over it is dead-lettered by the claim itself.
    pub max_job_bytes: usize,
    /// Attempts after which a refused row moves to the dead-letter table.
    pub max_attempts: u32,
    /// Client-side bound on each statement (claim, hand-back, commit), on top of the server's
    /// `statement_timeout`: a Postgres that stops answering cannot hold a worker.
    pub statement_timeout: Duration,
    /// `idle_in_transaction_session_timeout` of each batch's transaction (`SET LOCAL`, see
    /// [`crate::db::begin_statement`]): a relay that stops while it holds rows loses them.
    pub idle_in_transaction_timeout: Duration,
    /// Fleet-wide claim slots (`--claim-slots`): a batch runs only while its transaction holds
    /// one of these many advisory locks, shared by every relay on the table, so that a fleet
    /// of sidecars has at most this many batches in flight. `None`: no slot needed (the sweep,
    /// library users).
    pub claim_slots: Option<u32>,
    /// When claims run as named statements, planned once per connection (`--prepared-statements`,
    /// [`crate::relay::prepared`]): by default once the relay's listener proved the pool's
    /// connections sessions of their own, so a [`super::Batcher`] alone claims unnamed (planned
    /// at every claim, which any pooler passes on) unless told [`PreparedStatements::Always`].
    pub prepared_statements: PreparedStatements,
}

impl Default for BatchSettings {
    /// The daemon's defaults: 1,000 rows, 8 MiB, jobs up to 8 MiB, 25 attempts, 15 s, 20 s.
    fn default() -> Self {
        BatchSettings {
            batch_size: crate::defaults::DEFAULT_BATCH_SIZE,
            max_batch_bytes: crate::defaults::DEFAULT_BATCH_MAX_BYTES,
            max_job_bytes: crate::defaults::DEFAULT_MAX_JOB_SIZE,
            max_attempts: crate::defaults::DEFAULT_MAX_ATTEMPTS,
            statement_timeout: crate::defaults::STATEMENT_TIMEOUT,
            // The daemon's: a push may take its whole timeout between two statements.
            idle_in_transaction_timeout: crate::defaults::DEFAULT_PUSH_TIMEOUT
                + crate::defaults::STATEMENT_TIMEOUT,
            claim_slots: None,
            prepared_statements: PreparedStatements::Auto,
        }
    }
}
