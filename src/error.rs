//! The library's error type.

use std::time::Duration;

/// Everything the jobrelay library can fail with.
///
/// [`Error::class`] tells what a caller should do about it: retry the whole batch later
/// (transient), count an attempt against the one job (per-job), or give the job up (permanent).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The job cannot become a valid job: a field is empty, too long or malformed.
    /// Permanent: retrying the same input fails the same way.
    #[error("invalid job: {field}: {reason}")]
    InvalidJob {
        /// The offending field (`queue`, `job_type`, `headers`, ...).
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },

    /// The job could not be marshalled to protobuf. Permanent.
    #[error("cannot marshal job {uuid} to protobuf")]
    Marshal {
        /// The job's uuid.
        uuid: uuid::Uuid,
        /// The encoder's error.
        #[source]
        source: prost::EncodeError,
    },

    /// The enqueue script refused this one job (for example `WRONGTYPE`: a key it must write
    /// holds another type). Nothing of the job was written. Per-job: retrying may succeed once
    /// an operator fixes the key.
    #[error("redis refused job {uuid}: {message}")]
    Refused {
        /// The job's uuid.
        uuid: uuid::Uuid,
        /// Redis's or the script's message, e.g. `WRONGTYPE key app:queue:x holds string`.
        message: String,
    },

    /// Redis could not be reached or failed the whole call (connection refused or reset,
    /// READONLY, LOADING, MASTERDOWN, ...). Transient: nothing is known to have been written
    /// for sure, so the batch is retried and the dedup marker absorbs what did land.
    #[error("redis: {0}")]
    Redis(#[source] redis::RedisError),

    /// Postgres failed (connection lost, timeout, serialization failure, missing schema, ...).
    /// Transient for the relay: the transaction rolls back and nothing is lost.
    #[error("postgres: {0}")]
    Database(#[source] sqlx::Error),

    /// Applying the embedded migrations failed.
    #[error("migration failed: {0}")]
    Migrate(#[source] sqlx::migrate::MigrateError),

    /// An operation did not finish within its bound. Transient.
    #[error("{what} timed out after {}", humantime::format_duration(*after))]
    Timeout {
        /// What was being waited for (`redis push`, `postgres claim`, ...).
        what: &'static str,
        /// The bound that was exceeded.
        after: Duration,
    },
}

/// How a failure affects the rows it concerns (SPEC 5.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// A dependency is unavailable: roll back, keep `attempts`, back off, retry.
    Transient,
    /// This job was refused: `attempts + 1`, retry later, dead-letter at `--max-attempts`.
    PerJob,
    /// This row can never become a valid job: dead-letter at once.
    Permanent,
}

impl ErrorClass {
    /// The label used in `jobrelay_job_failures_total{kind}`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Transient => "transient",
            ErrorClass::PerJob => "per_job",
            ErrorClass::Permanent => "permanent",
        }
    }
}

impl Error {
    /// The class of this error; see [`ErrorClass`].
    pub fn class(&self) -> ErrorClass {
        match self {
            Error::InvalidJob { .. } | Error::Marshal { .. } => ErrorClass::Permanent,
            Error::Refused { .. } => ErrorClass::PerJob,
            Error::Redis(_) | Error::Database(_) | Error::Migrate(_) | Error::Timeout { .. } => {
                ErrorClass::Transient
            }
        }
    }

    pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidJob {
            field,
            reason: reason.into(),
        }
    }
}

impl From<sqlx::Error> for Error {
    fn from(e: sqlx::Error) -> Self {
        Error::Database(e)
    }
}

impl From<redis::RedisError> for Error {
    fn from(e: redis::RedisError) -> Self {
        Error::Redis(e)
    }
}

impl From<sqlx::migrate::MigrateError> for Error {
    fn from(e: sqlx::migrate::MigrateError) -> Self {
        Error::Migrate(e)
    }
}

/// `Result` with the library's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
