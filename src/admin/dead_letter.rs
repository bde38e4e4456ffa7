//! `jobrelay dead-letter list|requeue|purge`.

use std::fmt;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Serialize, Serializer};
use sqlx::postgres::{PgTypeInfo, PgValueRef, Postgres};
use sqlx::PgPool;

use crate::error::Result;
use crate::pg_timestamp::PgTimestamp;
use crate::table::TableName;

/// SQL: the row's `run_at` and `created_at` can travel in a job (docs/wire.md's protobuf Timestamp:
/// 0001-01-01T00:00:00Z ..= 9999-12-31T23:59:59.999999999Z). The test of migration 6's CHECK
/// constraints, written out so that it also works on a schema that has not got them.
const RELAYABLE: &str = "(run_at IS NULL
       OR run_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00')
   AND created_at BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00'";

/// At most this many ids are named in [`Requeued`]'s message.
const MAX_IDS_SHOWN: usize = 50;

/// Which dead-lettered rows to touch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// These ids.
    Ids(Vec<i64>),
    /// Every row of this queue.
    Queue(String),
    /// Every row.
    All,
}

impl Selection {
    fn condition(&self) -> &'static str {
        match self {
            Selection::Ids(_) => "id = ANY($1)",
            Selection::Queue(_) => "queue = $1",
            Selection::All => "$1::text IS NULL",
        }
    }

    fn bind<'q>(
        &'q self,
        q: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
        match self {
            Selection::Ids(ids) => q.bind(ids),
            Selection::Queue(queue) => q.bind(queue),
            Selection::All => q.bind(None::<String>),
        }
    }
}

/// One dead-lettered row, as `list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct DeadJob {
    /// The row's id (its id in the outbox table when it died).
    pub id: i64,
    /// The job's uuid.
    pub uuid: uuid::Uuid,
    /// Target queue.
    pub queue: String,
    /// Handler name.
    pub job_type: String,
    /// Failed attempts.
    pub attempts: i32,
    /// Why the last attempt failed.
    pub last_error: Option<String>,
    /// When the row was created.
    pub created_at: RowTime,
    /// When it was dead-lettered.
    pub dead_at: RowTime,
}

/// One line of `dead-letter list`: id, uuid, queue, job type, `attempts=N`,
/// `created_at=<RowTime>`, then the last error (free text, last), separated by tabs.
impl fmt::Display for DeadJob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}\t{}\t{}\t{}\tattempts={}\tcreated_at={}\t{}",
            self.id,
            self.uuid,
            self.queue,
            self.job_type,
            self.attempts,
            self.created_at,
            self.last_error.as_deref().unwrap_or("")
        )
    }
}

/// A `timestamptz` of a dead-lettered row: any value the column can hold, including those a
/// job cannot carry (which is why the row may be here).
///
/// Shown (and serialised) as RFC 3339 (`2024-05-06T07:08:09.123456Z`, as chrono serialises a
/// `DateTime<Utc>`), as `infinity` or `-infinity`, or, for a year chrono cannot hold, as
/// Postgres prints it in UTC (`294276-12-31 00:00:00+00`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowTime {
    /// An instant chrono can hold.
    At(DateTime<Utc>),
    /// Postgres's `infinity`.
    Infinity,
    /// Postgres's `-infinity`.
    NegInfinity,
    /// A finite instant beyond chrono's years, as Postgres stores it: microseconds since
    /// 2000-01-01 00:00:00 UTC.
    BeyondChrono(i64),
}

impl RowTime {
    /// The instant, when chrono can hold it.
    pub fn instant(&self) -> Option<DateTime<Utc>> {
        match self {
            RowTime::At(t) => Some(*t),
            _ => None,
        }
    }
}

impl From<PgTimestamp> for RowTime {
    fn from(t: PgTimestamp) -> Self {
        match t {
            PgTimestamp::INFINITY => RowTime::Infinity,
            PgTimestamp::NEG_INFINITY => RowTime::NegInfinity,
            t => t
                .to_datetime()
                .map_or(RowTime::BeyondChrono(t.raw()), RowTime::At),
        }
    }
}

impl fmt::Display for RowTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RowTime::At(t) => f.write_str(&t.to_rfc3339_opts(SecondsFormat::AutoSi, true)),
            RowTime::Infinity => f.write_str("infinity"),
            RowTime::NegInfinity => f.write_str("-infinity"),
            RowTime::BeyondChrono(raw) => PgTimestamp::from_raw(*raw).fmt(f),
        }
    }
}

impl Serialize for RowTime {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            RowTime::At(t) => t.serialize(s),
            other => s.collect_str(other),
        }
    }
}

impl sqlx::Type<Postgres> for RowTime {
    fn type_info() -> PgTypeInfo {
        <PgTimestamp as sqlx::Type<Postgres>>::type_info()
    }
}

impl<'r> sqlx::Decode<'r, Postgres> for RowTime {
    fn decode(value: PgValueRef<'r>) -> std::result::Result<Self, sqlx::error::BoxDynError> {
        <PgTimestamp as sqlx::Decode<Postgres>>::decode(value).map(RowTime::from)
    }
}

/// What [`requeue`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Requeued {
    /// Rows moved back into the outbox table.
    pub moved: u64,
    /// Ids of selected rows left in the dead-letter table because their `run_at` or
    /// `created_at` cannot travel in a job (infinite, or outside 0001-01-01..9999-12-31): the
    /// outbox's CHECK constraints would refuse them, or the relay would dead-letter them again.
    pub kept: Vec<i64>,
}

/// `requeued N rows`, and when rows were kept, a second line saying how many, which and why.
impl fmt::Display for Requeued {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "requeued {} rows", self.moved)?;
        if self.kept.is_empty() {
            return Ok(());
        }
        let mut ids: Vec<String> = self
            .kept
            .iter()
            .take(MAX_IDS_SHOWN)
            .map(i64::to_string)
            .collect();
        if self.kept.len() > MAX_IDS_SHOWN {
            ids.push(format!("and {} more", self.kept.len() - MAX_IDS_SHOWN));
        }
        write!(
            f,
            "\nkept {} rows in the dead-letter table (ids {}): their run_at or created_at \
             cannot be relayed (infinite, or outside the 0001-01-01..9999-12-31 \
             a protobuf Timestamp carries); fix them with UPDATE first",
            self.kept.len(),
            ids.join(", ")
        )
    }
}

/// Dead-lettered rows, oldest id first.
pub async fn list(
    pool: &PgPool,
    table: &TableName,
    queue: Option<&str>,
    limit: i64,
) -> Result<Vec<DeadJob>> {
    Ok(sqlx::query_as(&format!(
        "SELECT id, uuid, queue, job_type, attempts, last_error, created_at, dead_at
         FROM {} WHERE ($1::text IS NULL OR queue = $1) ORDER BY id LIMIT $2",
        table.dead()
    ))
    .bind(queue)
    .bind(limit.max(0))
    .fetch_all(pool)
    .await?)
}

/// Moves the selected rows back into the outbox table, keeping the job (uuid, queue, job type,
/// payload, parent, predecessor, dead_parent, run_at, headers, options, created_at) with attempts reset
/// and available now. All or nothing: one transaction.
///
/// Selected rows whose `run_at` or `created_at` cannot travel in a job (`infinity`,
/// `-infinity`, or outside 0001-01-01..9999-12-31) stay in the dead-letter table, listed in
/// [`Requeued::kept`]: the outbox's CHECK constraints would refuse them (failing the whole
/// requeue), or the relay would dead-letter them again. Fix them with UPDATE, then requeue.
pub async fn requeue(pool: &PgPool, table: &TableName, sel: &Selection) -> Result<Requeued> {
    let mut tx = pool.begin().await?;
    let kept_sql = format!(
        "SELECT id FROM {d} WHERE {cond} AND ({RELAYABLE}) IS NOT TRUE ORDER BY id",
        d = table.dead(),
        cond = sel.condition()
    );
    let kept = sel
        .bind(sqlx::query(&kept_sql))
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(|row| sqlx::Row::try_get::<i64, _>(row, 0))
        .collect::<std::result::Result<Vec<i64>, _>>()?;
    let sql = format!(
        "WITH moved AS (DELETE FROM {d} WHERE {cond} AND ({RELAYABLE}) IS TRUE
                        RETURNING id, {job})
         INSERT INTO {t} ({job})
         SELECT {job} FROM moved ORDER BY id",
        job = crate::columns::list(crate::columns::JOB_AND_CREATED),
        d = table.dead(),
        t = table.pending(),
        cond = sel.condition()
    );
    let moved = sel
        .bind(sqlx::query(&sql))
        .execute(&mut *tx)
        .await?
        .rows_affected();
    tx.commit().await?;
    Ok(Requeued { moved, kept })
}

/// Deletes the selected rows for good. Returns how many.
pub async fn purge(pool: &PgPool, table: &TableName, sel: &Selection) -> Result<u64> {
    let sql = format!("DELETE FROM {} WHERE {}", table.dead(), sel.condition());
    Ok(sel
        .bind(sqlx::query(&sql))
        .execute(pool)
        .await?
        .rows_affected())
}
