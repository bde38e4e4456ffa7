//! A claimed row, and the conversion of a row into a job.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::Row as _;
use uuid::Uuid;

use crate::columns::at;
use crate::error::{Error, Result};
use crate::job::Job;
use crate::pg_timestamp::{PgTimestamp, RELAYABLE_RANGE};

/// A row as the claim query returns it (`headers` as JSON text; the timestamps as Postgres
/// stores them, so that any value decodes and a row handed back keeps it exactly).
#[derive(Debug)]
pub(crate) struct PendingRow {
    pub id: i64,
    pub uuid: Uuid,
    pub queue: String,
    pub job_type: String,
    pub payload: Vec<u8>,
    pub parent_uuid: Option<Uuid>,
    pub predecessor_uuid: Option<Uuid>,
    pub dead_parent: bool,
    pub run_at: Option<PgTimestamp>,
    pub headers: String,
    pub created_at: PgTimestamp,
    pub attempts: i32,
}

/// Decoded by position (`columns::at`), in the order of the claim's `RETURNING` list, which
/// is rendered from the same `columns::COLUMNS` ([`super::queries`]):
/// the derived decoder looks every column up by name, which was the relay's largest cost per
/// row after the socket.
impl<'r> sqlx::FromRow<'r, PgRow> for PendingRow {
    fn from_row(row: &'r PgRow) -> sqlx::Result<Self> {
        Ok(PendingRow {
            id: row.try_get(at::ID)?,
            uuid: row.try_get(at::UUID)?,
            queue: row.try_get(at::QUEUE)?,
            job_type: row.try_get(at::JOB_TYPE)?,
            payload: row.try_get(at::PAYLOAD)?,
            parent_uuid: row.try_get(at::PARENT_UUID)?,
            predecessor_uuid: row.try_get(at::PREDECESSOR_UUID)?,
            dead_parent: row.try_get(at::DEAD_PARENT)?,
            run_at: row.try_get(at::RUN_AT)?,
            headers: row.try_get(at::HEADERS)?,
            created_at: row.try_get(at::CREATED_AT)?,
            attempts: row.try_get(at::ATTEMPTS)?,
        })
    }
}

/// What the relay needs of a row besides its job.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RowMeta {
    pub id: i64,
    pub attempts: i32,
}

impl PendingRow {
    /// The row's job, or why it can never be one (permanent). On failure the row comes back
    /// unchanged (a timestamp a job cannot carry, e.g. `infinity`, stays as it was).
    pub(super) fn into_job(self) -> std::result::Result<(RowMeta, Job), Box<(PendingRow, Error)>> {
        let times = self
            .run_at
            .map(|t| relayable("run_at", t))
            .transpose()
            .and_then(|run_at| Ok((run_at, relayable("created_at", self.created_at)?)));
        let (run_at, created_at) = match times {
            Ok(t) => t,
            Err(e) => return Err(Box::new((self, e))),
        };
        let headers = match parse_headers(&self.headers) {
            Ok(h) => h,
            Err(e) => return Err(Box::new((self, e))),
        };
        let meta = RowMeta {
            id: self.id,
            attempts: self.attempts,
        };
        let job = Job {
            uuid: self.uuid,
            queue: self.queue,
            job_type: self.job_type,
            payload: self.payload,
            parent_uuid: self.parent_uuid,
            predecessor_uuid: self.predecessor_uuid,
            dead_parent: self.dead_parent,
            run_at,
            created_at,
            headers,
        };
        match job.validate() {
            Ok(()) => Ok((meta, job)),
            Err(e) => Err(Box::new((PendingRow::from_job(meta, &job), e))),
        }
    }

    /// The row of a job (for handing it back to the table).
    pub(super) fn from_job(meta: RowMeta, job: &Job) -> PendingRow {
        PendingRow {
            id: meta.id,
            uuid: job.uuid,
            queue: job.queue.clone(),
            job_type: job.job_type.clone(),
            payload: job.payload.clone(),
            parent_uuid: job.parent_uuid,
            predecessor_uuid: job.predecessor_uuid,
            dead_parent: job.dead_parent,
            run_at: job.run_at.map(PgTimestamp::from_datetime),
            headers: job.headers_json(),
            created_at: PgTimestamp::from_datetime(job.created_at),
            attempts: meta.attempts,
        }
    }
}

/// The instant of a row's timestamp `field`, or a permanent failure naming the column and the
/// value as Postgres prints it when a protobuf Timestamp cannot carry it (docs/wire.md), e.g.
/// `run_at: infinity cannot be relayed (protobuf Timestamp carries 0001-01-01..9999-12-31)`.
fn relayable(field: &'static str, t: PgTimestamp) -> Result<DateTime<Utc>> {
    t.to_relayable()
        .ok_or_else(|| Error::invalid(field, format!("{t} cannot be relayed ({RELAYABLE_RANGE})")))
}

/// Parses `headers`: a JSON object whose values are all strings.
pub(crate) fn parse_headers(text: &str) -> Result<BTreeMap<String, String>> {
    if text == "{}" {
        return Ok(BTreeMap::new());
    }
    serde_json::from_str(text)
        .map_err(|e| Error::invalid("headers", format!("must be a JSON object of strings ({e})")))
}

/// A claimed row, and whether the claim itself moved it to the dead letters (its payload is
/// over `--max-job-size` and was never fetched).
pub(crate) struct ClaimedRow {
    pub row: PendingRow,
    pub buried: bool,
    /// The byte cap left locked rows out of this batch (the same for every row).
    pub capped: bool,
}

/// The claim's columns: [`PendingRow`]'s, then the flags `buried` and `capped`, at the positions
/// `columns::at` names ([`super::Queries::claim`]).
impl<'r> sqlx::FromRow<'r, PgRow> for ClaimedRow {
    fn from_row(row: &'r PgRow) -> sqlx::Result<Self> {
        Ok(ClaimedRow {
            row: PendingRow::from_row(row)?,
            buried: row.try_get(at::BURIED)?,
            capped: row.try_get(at::CAPPED)?,
        })
    }
}
