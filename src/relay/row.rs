//! A claimed row, the conversion of a row into a job, and rows on their way back to a table.

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::{Postgres, Row as _};
use uuid::Uuid;

use crate::columns::{at, COLUMNS};
use crate::error::{Error, Result};
use crate::job::{no_options, Job, Options};
use crate::pg_timestamp::{PgTimestamp, RELAYABLE_RANGE};

/// A row as the claim query returns it (`headers` and `options` as JSON text; the timestamps as Postgres
/// stores them, so that any value decodes and a row handed back keeps it exactly).
#[derive(Debug)]
#[cfg_attr(test, derive(Clone, PartialEq))]
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
    pub options: String,
    pub ordering_key: Option<String>,
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
            options: row.try_get(at::OPTIONS)?,
            ordering_key: row.try_get(at::ORDERING_KEY)?,
            created_at: row.try_get(at::CREATED_AT)?,
            attempts: row.try_get(at::ATTEMPTS)?,
        })
    }
}

/// What the relay keeps of a row while its job is pushed: its id and attempts, and the values
/// the job holds in another form (`headers` and `options` as the JSON text they were, the
/// timestamps as Postgres stores them). With the job, it is the row again, unchanged ([`PendingRow::rejoin`]).
#[derive(Debug)]
pub(crate) struct RowMeta {
    pub id: i64,
    pub attempts: i32,
    run_at: Option<PgTimestamp>,
    created_at: PgTimestamp,
    headers: String,
    options: String,
}

/// What a job holds of a row in another form than the row's: parsed and converted, once.
struct Converted {
    run_at: Option<DateTime<Utc>>,
    created_at: DateTime<Utc>,
    headers: BTreeMap<String, String>,
    options: Arc<Options>,
}

/// The options of a batch's rows, parsed once per run of rows that hold the same text: the
/// rows of one job class come together with the same options, and their jobs share one parsed
/// object (parsing and dropping a small object per job cost more than the rest of its options'
/// way to Redis). Rows without options share [`no_options`].
#[derive(Default)]
pub(crate) struct SharedOptions {
    last: Option<(String, Arc<Options>)>,
}

impl SharedOptions {
    /// The parsed `text`, or why it is not a JSON object.
    fn parse(&mut self, text: &str) -> Result<Arc<Options>> {
        if text == "{}" {
            return Ok(no_options());
        }
        if let Some((last, options)) = &self.last {
            if last == text {
                return Ok(Arc::clone(options));
            }
        }
        let options = Arc::new(parse_options(text)?);
        self.last = Some((text.to_owned(), Arc::clone(&options)));
        Ok(options)
    }
}

impl PendingRow {
    /// The row's job, or why it can never be one (permanent). The row is validated before the
    /// job is made, once: the checks of [`Job::validate`] on its own values (the timestamps'
    /// range as they are converted), and its headers as they are parsed. On failure the row
    /// comes back untouched (a timestamp a job cannot carry, e.g. `infinity`, stays as it
    /// was). Nothing is copied: the job takes the row's values, [`RowMeta`] the rest.
    /// `options` parses the rows' options (a batch's rows share it).
    pub(super) fn into_job(
        self,
        options: &mut SharedOptions,
    ) -> std::result::Result<(RowMeta, Job), Box<(PendingRow, Error)>> {
        let converted = match self.validated(options) {
            Ok(c) => c,
            Err(e) => return Err(Box::new((self, e))),
        };
        let PendingRow {
            id,
            uuid,
            queue,
            job_type,
            payload,
            parent_uuid,
            predecessor_uuid,
            dead_parent,
            run_at,
            headers,
            options,
            ordering_key,
            created_at,
            attempts,
        } = self;
        let meta = RowMeta {
            id,
            attempts,
            run_at,
            created_at,
            headers,
            options,
        };
        let job = Job {
            uuid,
            queue,
            job_type,
            payload,
            parent_uuid,
            predecessor_uuid,
            dead_parent,
            run_at: converted.run_at,
            created_at: converted.created_at,
            headers: converted.headers,
            options: converted.options,
            ordering_key,
        };
        Ok((meta, job))
    }

    /// The row's values converted for its job, or why it can never be one, in this order:
    /// `run_at`, `created_at`, `headers`, `options`, then `queue`, `job_type` and `uuid`.
    fn validated(&self, options: &mut SharedOptions) -> Result<Converted> {
        let run_at = self.run_at.map(|t| relayable("run_at", t)).transpose()?;
        let created_at = relayable("created_at", self.created_at)?;
        let headers = parse_headers(&self.headers)?;
        let options = options.parse(&self.options)?;
        crate::job::validate_identity(self.uuid, &self.queue, &self.job_type)?;
        if let Some(key) = &self.ordering_key {
            crate::job::validate_ordering_key(key)?;
        }
        Ok(Converted {
            run_at,
            created_at,
            headers,
            options,
        })
    }

    /// The row `meta` and `job` were made of ([`PendingRow::into_job`]), as it was claimed:
    /// the job's values moved back, the others from `meta` (for handing it back to a table).
    pub(super) fn rejoin(meta: RowMeta, job: Job) -> PendingRow {
        PendingRow {
            id: meta.id,
            uuid: job.uuid,
            queue: job.queue,
            job_type: job.job_type,
            payload: job.payload,
            parent_uuid: job.parent_uuid,
            predecessor_uuid: job.predecessor_uuid,
            dead_parent: job.dead_parent,
            run_at: meta.run_at,
            headers: meta.headers,
            options: meta.options,
            ordering_key: job.ordering_key,
            created_at: meta.created_at,
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

/// Parses `options`: a JSON object. The empty object, what nearly every row holds, is not
/// parsed at all.
pub(crate) fn parse_options(text: &str) -> Result<Options> {
    if text == "{}" {
        return Ok(Options::new());
    }
    serde_json::from_str(text)
        .map_err(|e| Error::invalid("options", format!("must be a JSON object ({e})")))
}

/// A claimed row, and whether the claim itself moved it to the dead letters (its payload is
/// over `--max-job-size` and was never fetched).
pub(crate) struct ClaimedRow {
    pub row: PendingRow,
    pub buried: bool,
    /// The byte cap left locked rows out of this batch (the same for every row).
    pub capped: bool,
    /// The claim locked rows it did not take: rows of a key whose earlier row is pending
    /// outside the claim or dead-lettered (docs/guarantees.md#per-key-order).
    pub held: bool,
    /// Rows with an ordering key wait at or above where the claim looked (the same for every
    /// row).
    pub keyed: bool,
    /// The highest id the claim looked at in `id` order: a row above it was taken following
    /// its key (the follow claim; the same for every row, `None` from the other claims).
    pub window_end: Option<i64>,
    /// The tag of the named statement that returned the row ([`super::Queries::claim_tag`]);
    /// `None` from an unnamed claim, which returns none.
    pub statement: Option<i64>,
}

/// The claim's columns: [`PendingRow`]'s, then the flags `buried`, `capped`, `held`, `keyed`
/// and `window_end`, and a named claim's tag `statement`, at the positions
/// `columns::at` names ([`super::Queries::claim`]).
impl<'r> sqlx::FromRow<'r, PgRow> for ClaimedRow {
    fn from_row(row: &'r PgRow) -> sqlx::Result<Self> {
        Ok(ClaimedRow {
            row: PendingRow::from_row(row)?,
            buried: row.try_get(at::BURIED)?,
            capped: row.try_get(at::CAPPED)?,
            held: row.try_get(at::HELD)?,
            keyed: row.try_get(at::KEYED)?,
            window_end: row.try_get(at::WINDOW_END)?,
            statement: if row.len() > at::STATEMENT {
                row.try_get(at::STATEMENT).ok()
            } else {
                None
            },
        })
    }
}

/// Rows on their way back to a table, as the hand-back statements take them
/// ([`super::Queries::retry`], [`super::Queries::dead_letter`], rendered with
/// `columns::unnest(ALL)`): one array per column, bound in the order of `columns::COLUMNS`
/// (`$1`, `$2`, ...), `available_at` as a delay in seconds.
#[derive(Debug)]
pub(crate) struct RowArrays {
    id: Vec<i64>,
    uuid: Vec<Uuid>,
    queue: Vec<String>,
    job_type: Vec<String>,
    payload: Vec<Vec<u8>>,
    parent_uuid: Vec<Option<Uuid>>,
    predecessor_uuid: Vec<Option<Uuid>>,
    dead_parent: Vec<bool>,
    run_at: Vec<Option<PgTimestamp>>,
    headers: Vec<String>,
    options: Vec<String>,
    ordering_key: Vec<Option<String>>,
    created_at: Vec<PgTimestamp>,
    attempts: Vec<i32>,
    delay: Vec<f64>,
    last_error: Vec<String>,
}

impl RowArrays {
    /// Room for `n` rows.
    pub(crate) fn with_capacity(n: usize) -> Self {
        RowArrays {
            id: Vec::with_capacity(n),
            uuid: Vec::with_capacity(n),
            queue: Vec::with_capacity(n),
            job_type: Vec::with_capacity(n),
            payload: Vec::with_capacity(n),
            parent_uuid: Vec::with_capacity(n),
            predecessor_uuid: Vec::with_capacity(n),
            dead_parent: Vec::with_capacity(n),
            run_at: Vec::with_capacity(n),
            headers: Vec::with_capacity(n),
            options: Vec::with_capacity(n),
            ordering_key: Vec::with_capacity(n),
            created_at: Vec::with_capacity(n),
            attempts: Vec::with_capacity(n),
            delay: Vec::with_capacity(n),
            last_error: Vec::with_capacity(n),
        }
    }

    /// Adds `row` (its values moved, not copied), claimable again `delay` seconds from now
    /// (ignored by the dead letters), with `last_error`.
    pub(crate) fn push(&mut self, row: PendingRow, delay: f64, last_error: String) {
        // Taken apart whole: a column added to `PendingRow` does not compile until it is here.
        let PendingRow {
            id,
            uuid,
            queue,
            job_type,
            payload,
            parent_uuid,
            predecessor_uuid,
            dead_parent,
            run_at,
            headers,
            options,
            ordering_key,
            created_at,
            attempts,
        } = row;
        self.id.push(id);
        self.uuid.push(uuid);
        self.queue.push(queue);
        self.job_type.push(job_type);
        self.payload.push(payload);
        self.parent_uuid.push(parent_uuid);
        self.predecessor_uuid.push(predecessor_uuid);
        self.dead_parent.push(dead_parent);
        self.run_at.push(run_at);
        self.headers.push(headers);
        self.options.push(options);
        self.ordering_key.push(ordering_key);
        self.created_at.push(created_at);
        self.attempts.push(attempts);
        self.delay.push(delay);
        self.last_error.push(last_error);
    }

    /// `query` with the arrays bound as its parameters, one per column in the order of
    /// `columns::COLUMNS`: the order comes from that list, not from the order of the calls here.
    pub(crate) fn bind(
        mut self,
        mut query: Query<'_, Postgres, PgArguments>,
    ) -> Query<'_, Postgres, PgArguments> {
        use std::mem::take;
        for column in COLUMNS {
            query = match column {
                "id" => query.bind(take(&mut self.id)),
                "uuid" => query.bind(take(&mut self.uuid)),
                "queue" => query.bind(take(&mut self.queue)),
                "job_type" => query.bind(take(&mut self.job_type)),
                "payload" => query.bind(take(&mut self.payload)),
                "parent_uuid" => query.bind(take(&mut self.parent_uuid)),
                "predecessor_uuid" => query.bind(take(&mut self.predecessor_uuid)),
                "dead_parent" => query.bind(take(&mut self.dead_parent)),
                "run_at" => query.bind(take(&mut self.run_at)),
                "headers" => query.bind(take(&mut self.headers)),
                "options" => query.bind(take(&mut self.options)),
                "ordering_key" => query.bind(take(&mut self.ordering_key)),
                "created_at" => query.bind(take(&mut self.created_at)),
                "attempts" => query.bind(take(&mut self.attempts)),
                "available_at" => query.bind(take(&mut self.delay)),
                "last_error" => query.bind(take(&mut self.last_error)),
                other => unreachable!("no array for the column {other}"),
            };
        }
        query
    }
}

#[cfg(test)]
mod tests;
