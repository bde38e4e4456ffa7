//! A job: what a `pending_jobs` row holds and what the enqueue algorithm writes to Redis.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use chrono::{DateTime, Datelike, Utc};
use prost::Message;
use uuid::Uuid;

use crate::error::{Error, Result};
use crate::pg_timestamp::RELAYABLE_RANGE;
use crate::proto::v1;

mod outcome;

pub use self::outcome::Outcome;

/// What one job in a batch came to: an [`Outcome`], or a per-job or permanent
/// [`Error`].
pub type JobResult = std::result::Result<Outcome, crate::error::Error>;

/// Longest queue name accepted (docs/schema.md).
pub const MAX_QUEUE_LEN: usize = 128;
/// Longest job type accepted (docs/schema.md).
pub const MAX_JOB_TYPE_LEN: usize = 256;
/// Longest ordering key accepted, in characters (docs/schema.md).
pub const MAX_ORDERING_KEY_LEN: usize = 256;

/// One job, as validated data.
///
/// Build one with [`crate::producer::JobBuilder`] (which validates as it goes), or fill the
/// fields and call [`Job::validate`]. The enqueue functions validate again before writing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// The job's identity, and the key of its dedup marker `jobs:<uuid>`.
    pub uuid: Uuid,
    /// Target queue: 1..=128 characters of `[A-Za-z0-9_.:-]`.
    pub queue: String,
    /// Handler name the consumer dispatches on: 1..=256 characters.
    pub job_type: String,
    /// The job's arguments, opaque to jobrelay.
    pub payload: Vec<u8>,
    /// Parent job, if any.
    pub parent_uuid: Option<Uuid>,
    /// Job that must complete before this one, if any.
    pub predecessor_uuid: Option<Uuid>,
    /// The algorithm's `deadParent` input: the parent has already finished.
    pub dead_parent: bool,
    /// Run no earlier than this.
    pub run_at: Option<DateTime<Utc>>,
    /// When the job was created (the row's `created_at`).
    pub created_at: DateTime<Utc>,
    /// String-to-string metadata, e.g. `traceparent`.
    pub headers: BTreeMap<String, String>,
    /// The runner's own job options (the row's `options`, docs/schema.md), e.g. Sidekiq's
    /// `retry`: names and JSON values as the runner's client takes them. Each layout carries
    /// the ones it knows into the runner's own fields and refuses any other
    /// (docs/layouts/README.md#job-options). Empty for most jobs, and then free. Shared: the
    /// jobs of a batch whose rows hold the same options share one parsed object.
    pub options: Arc<Options>,
    /// The job's ordering key (the row's `ordering_key`, docs/guarantees.md#per-key-order):
    /// the jobs of one key enter the runner's storage in the order of their rows, and a job
    /// of a key waits while an earlier one of the key cannot go. 1..=256 characters; `None`
    /// for a job that needs no order.
    pub ordering_key: Option<String>,
}

/// A job's runner options: a JSON object ([`Job::options`]).
pub type Options = serde_json::Map<String, serde_json::Value>;

/// No options, shared: what nearly every job holds, at the cost of a reference count.
pub fn no_options() -> Arc<Options> {
    static NONE: LazyLock<Arc<Options>> = LazyLock::new(Arc::default);
    Arc::clone(&NONE)
}

/// Checks an ordering key against docs/schema.md: 1..=256 characters, as the outbox's CHECK
/// counts them.
pub fn validate_ordering_key(key: &str) -> Result<()> {
    let chars = key.chars().count();
    if chars == 0 {
        return Err(Error::invalid(
            "ordering_key",
            "must not be empty (NULL for no order)",
        ));
    }
    if chars > MAX_ORDERING_KEY_LEN {
        return Err(Error::invalid(
            "ordering_key",
            format!("{chars} characters, at most {MAX_ORDERING_KEY_LEN} allowed"),
        ));
    }
    Ok(())
}

/// Checks a queue name against docs/schema.md: 1..=128 characters of `[A-Za-z0-9_.:-]`.
pub fn validate_queue(queue: &str) -> Result<()> {
    if queue.is_empty() {
        return Err(Error::invalid("queue", "must not be empty"));
    }
    if queue.len() > MAX_QUEUE_LEN {
        return Err(Error::invalid(
            "queue",
            format!(
                "{} characters, at most {MAX_QUEUE_LEN} allowed",
                queue.len()
            ),
        ));
    }
    if let Some(c) = queue
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '-')))
    {
        return Err(Error::invalid(
            "queue",
            format!("{queue:?} contains {c:?}; allowed are A-Z a-z 0-9 _ . : -"),
        ));
    }
    Ok(())
}

/// Checks a job type against docs/schema.md: 1..=256 characters.
pub fn validate_job_type(job_type: &str) -> Result<()> {
    if job_type.is_empty() {
        return Err(Error::invalid("job_type", "must not be empty"));
    }
    let n = job_type.chars().count();
    if n > MAX_JOB_TYPE_LEN {
        return Err(Error::invalid(
            "job_type",
            format!("{n} characters, at most {MAX_JOB_TYPE_LEN} allowed"),
        ));
    }
    Ok(())
}

/// The checks of [`Job::validate`] besides the timestamps': the queue, the job type, a uuid
/// that is not nil. The relay runs them on a row's own values before it makes the job
/// (`relay::row`), and checks the timestamps as it converts them.
pub(crate) fn validate_identity(uuid: Uuid, queue: &str, job_type: &str) -> Result<()> {
    validate_queue(queue)?;
    validate_job_type(job_type)?;
    if uuid.is_nil() {
        return Err(Error::invalid("uuid", "must not be the nil uuid"));
    }
    Ok(())
}

/// Checks that a protobuf Timestamp can carry `t` (docs/wire.md): the years 0001..=9999 in UTC.
fn validate_timestamp(field: &'static str, t: DateTime<Utc>) -> Result<()> {
    if (1..=9999).contains(&t.year()) {
        Ok(())
    } else {
        Err(Error::invalid(
            field,
            format!("{t} cannot be relayed ({RELAYABLE_RANGE})"),
        ))
    }
}

impl Job {
    /// Validates the fields docs/layouts/algorithm.md#the-enqueue-algorithm step 1 names, and that `run_at` and `created_at` lie
    /// within what the wire format's `google.protobuf.Timestamp` carries (docs/wire.md:
    /// 0001-01-01T00:00:00Z ..= 9999-12-31T23:59:59.999999999Z), refusing them with
    /// [`Error::InvalidJob`] naming `run_at` or `created_at`. A failure is permanent.
    pub fn validate(&self) -> Result<()> {
        validate_identity(self.uuid, &self.queue, &self.job_type)?;
        if let Some(key) = &self.ordering_key {
            validate_ordering_key(key)?;
        }
        if let Some(t) = self.run_at {
            validate_timestamp("run_at", t)?;
        }
        validate_timestamp("created_at", self.created_at)
    }

    /// The headers as a JSON object (what the table's `headers` column holds).
    pub fn headers_json(&self) -> String {
        if self.headers.is_empty() {
            return "{}".to_owned();
        }
        serde_json::to_string(&self.headers).expect("a string-to-string map serialises")
    }

    /// The options as a JSON object (what the table's `options` column holds).
    pub fn options_json(&self) -> String {
        if self.options.is_empty() {
            return "{}".to_owned();
        }
        serde_json::to_string(&self.options).expect("a JSON map serialises")
    }

    /// The protobuf message of this job.
    pub fn to_proto(&self) -> v1::Job {
        v1::Job {
            uuid: self.uuid.hyphenated().to_string(),
            queue: self.queue.clone(),
            job_type: self.job_type.clone(),
            payload: self.payload.clone(),
            parent_uuid: self
                .parent_uuid
                .map(|u| u.hyphenated().to_string())
                .unwrap_or_default(),
            predecessor_uuid: self
                .predecessor_uuid
                .map(|u| u.hyphenated().to_string())
                .unwrap_or_default(),
            run_at: self.run_at.map(timestamp),
            created_at: Some(timestamp(self.created_at)),
            headers: self.headers.clone(),
        }
    }

    /// Marshals the job to protobuf wire format (docs/wire.md), appending to `buf`.
    pub fn marshal_into(&self, buf: &mut Vec<u8>) -> Result<()> {
        self.to_proto()
            .encode(buf)
            .map_err(|source| Error::Marshal {
                uuid: self.uuid,
                source,
            })
    }

    /// Marshals the job to protobuf wire format (docs/wire.md).
    pub fn marshal(&self) -> Result<Vec<u8>> {
        let mut buf = Vec::with_capacity(96 + self.payload.len());
        self.marshal_into(&mut buf)?;
        Ok(buf)
    }
}

/// A `google.protobuf.Timestamp` for a UTC instant.
pub fn timestamp(t: DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: t.timestamp(),
        nanos: t.timestamp_subsec_nanos() as i32,
    }
}

/// The `scheduled` score of an instant: epoch seconds with the fraction kept, written as a
/// decimal string so that no precision is lost on the way to Redis.
pub fn epoch_score(t: DateTime<Utc>) -> String {
    let secs = t.timestamp();
    let micros = t.timestamp_subsec_micros();
    if secs >= 0 {
        format!("{secs}.{micros:06}")
    } else {
        // Before 1970: the fraction counts towards zero; let floating point say it plainly.
        format!("{}", secs as f64 + f64::from(micros) / 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_names() {
        assert!(validate_queue("default").is_ok());
        assert!(validate_queue("a.b:c-d_e9").is_ok());
        assert!(validate_queue(&"q".repeat(128)).is_ok());
        assert!(validate_queue(&"q".repeat(129)).is_err());
        assert!(validate_queue("").is_err());
        let e = validate_queue("has space").unwrap_err().to_string();
        assert!(e.contains("queue") && e.contains("' '"), "{e}");
    }

    #[test]
    fn job_types() {
        assert!(validate_job_type("ProcessThing").is_ok());
        assert!(validate_job_type(&"é".repeat(256)).is_ok());
        assert!(validate_job_type(&"é".repeat(257)).is_err());
        assert!(validate_job_type("").is_err());
    }

    fn job_at(run_at: Option<&str>, created_at: &str) -> Job {
        let t = |s: &str| s.parse::<DateTime<Utc>>().unwrap();
        Job {
            uuid: Uuid::new_v4(),
            queue: "q".into(),
            job_type: "T".into(),
            payload: Vec::new(),
            parent_uuid: None,
            predecessor_uuid: None,
            dead_parent: false,
            run_at: run_at.map(t),
            created_at: t(created_at),
            headers: BTreeMap::new(),
            options: no_options(),
            ordering_key: None,
        }
    }

    fn refused_field(job: &Job) -> Option<&'static str> {
        match job.validate() {
            Ok(()) => None,
            Err(Error::InvalidJob { field, .. }) => Some(field),
            Err(e) => panic!("expected InvalidJob, got {e:?}"),
        }
    }

    #[test]
    fn timestamps_must_fit_a_protobuf_timestamp() {
        const FIRST: &str = "0001-01-01T00:00:00Z";
        const LAST: &str = "9999-12-31T23:59:59.999999999Z";
        const NOW: &str = "2024-05-06T07:08:09Z";
        for ok in [FIRST, LAST, NOW] {
            assert_eq!(refused_field(&job_at(Some(ok), NOW)), None, "run_at {ok}");
            assert_eq!(refused_field(&job_at(None, ok)), None, "created_at {ok}");
        }
        for bad in ["+10000-01-01T00:00:00Z", "0000-12-31T23:59:59.999999999Z"] {
            assert_eq!(refused_field(&job_at(Some(bad), NOW)), Some("run_at"));
            assert_eq!(refused_field(&job_at(None, bad)), Some("created_at"));
        }
        let e = job_at(Some("+10000-01-01T00:00:00Z"), NOW)
            .validate()
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "invalid job: run_at: +10000-01-01 00:00:00 UTC cannot be relayed \
             (protobuf Timestamp carries 0001-01-01..9999-12-31)"
        );
    }

    #[test]
    fn scores_keep_the_fraction() {
        let t = DateTime::from_timestamp(1_700_000_000, 123_456_000).unwrap();
        assert_eq!(epoch_score(t), "1700000000.123456");
        let t = DateTime::from_timestamp(5, 0).unwrap();
        assert_eq!(epoch_score(t), "5.000000");
    }
}
