//! `jobrelay dead-letter list|requeue|purge`.

use std::fmt;

use base64::Engine as _;
use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Serialize, Serializer};
use sqlx::postgres::{PgTypeInfo, PgValueRef, Postgres};
use sqlx::PgPool;

use crate::broker::layout::{LayoutKind, Payload};
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

/// At most this many characters of a payload (or of its base64) are shown by `list`.
pub const PAYLOAD_SHOWN: usize = 200;

/// A row's payload as `list` shows it: as the layout's runner reads it, cut to
/// [`PAYLOAD_SHOWN`] characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShownPayload {
    /// The start of the payload: for a layout that reads JSON arguments, the JSON in compact
    /// form when it is JSON; otherwise the text as stored, or its base64 when it is not UTF-8.
    pub text: String,
    /// `text` is base64 (an opaque payload that is not UTF-8).
    pub base64: bool,
    /// `text` is cut short.
    pub truncated: bool,
    /// The payload's size in bytes.
    pub bytes: usize,
}

/// Bytes of a payload [`ShownPayload::of`] encodes in base64 ([`PAYLOAD_SHOWN`] characters).
const BASE64_SHOWN: usize = PAYLOAD_SHOWN / 4 * 3;

impl ShownPayload {
    /// A payload of `bytes` bytes starting with `start`, as a runner reading `kind` payloads
    /// sees it, cut to [`PAYLOAD_SHOWN`] characters. JSON is compacted only when `start` is
    /// the whole payload; a character cut in two at the end of `start` is left out.
    pub fn of(start: &[u8], bytes: usize, kind: Payload) -> ShownPayload {
        let cut = start.len() < bytes;
        let text = match std::str::from_utf8(start) {
            Ok(text) => Some(text),
            Err(e) if cut && e.error_len().is_none() => {
                std::str::from_utf8(&start[..e.valid_up_to()]).ok()
            }
            Err(_) => None,
        };
        let Some(text) = text else {
            return ShownPayload {
                text: base64::engine::general_purpose::STANDARD
                    .encode(&start[..start.len().min(BASE64_SHOWN)]),
                base64: true,
                truncated: bytes > BASE64_SHOWN,
                bytes,
            };
        };
        let json = (kind == Payload::JsonArgs && !cut)
            .then(|| serde_json::from_str::<serde_json::Value>(text).ok())
            .flatten();
        let full = json.map_or_else(|| text.to_owned(), |v| v.to_string());
        ShownPayload {
            truncated: cut || full.chars().count() > PAYLOAD_SHOWN,
            text: full.chars().take(PAYLOAD_SHOWN).collect(),
            base64: false,
            bytes,
        }
    }
}

/// `payload=<text>` (`payload_base64=<base64>`), the text with control and invisible
/// characters and backslashes escaped as Rust does (`\t`, `\n`, `\u{202e}`), so that it
/// stays on its line and its field; cut short: `... (N bytes)`.
impl fmt::Display for ShownPayload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = if self.base64 {
            "payload_base64"
        } else {
            "payload"
        };
        write!(f, "{name}=")?;
        for c in self.text.chars() {
            match c {
                '"' | '\'' => write!(f, "{c}")?,
                c => write!(f, "{}", c.escape_debug())?,
            }
        }
        if self.truncated {
            write!(f, "... ({} bytes)", self.bytes)?;
        }
        Ok(())
    }
}

/// `"payload"` (or `"payload_base64"`), `"payload_truncated"`, `"payload_bytes"`.
fn serialize_payload<S: serde::ser::SerializeStruct>(
    p: &ShownPayload,
    s: &mut S,
) -> std::result::Result<(), S::Error> {
    if p.base64 {
        s.serialize_field("payload", &None::<String>)?;
        s.serialize_field("payload_base64", &p.text)?;
    } else {
        s.serialize_field("payload", &p.text)?;
        s.serialize_field("payload_base64", &None::<String>)?;
    }
    s.serialize_field("payload_truncated", &p.truncated)?;
    s.serialize_field("payload_bytes", &p.bytes)
}

/// One dead-lettered row, as `list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// Its payload, as the layout's runner reads it.
    pub payload: ShownPayload,
}

/// A row of the dead-letter table as read.
#[derive(sqlx::FromRow)]
struct DeadRow {
    id: i64,
    uuid: uuid::Uuid,
    queue: String,
    job_type: String,
    attempts: i32,
    last_error: Option<String>,
    created_at: RowTime,
    dead_at: RowTime,
    payload: Vec<u8>,
    payload_bytes: i32,
}

impl Serialize for DeadJob {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("DeadJob", 12)?;
        st.serialize_field("id", &self.id)?;
        st.serialize_field("uuid", &self.uuid)?;
        st.serialize_field("queue", &self.queue)?;
        st.serialize_field("job_type", &self.job_type)?;
        st.serialize_field("attempts", &self.attempts)?;
        st.serialize_field("last_error", &self.last_error)?;
        st.serialize_field("created_at", &self.created_at)?;
        st.serialize_field("dead_at", &self.dead_at)?;
        serialize_payload(&self.payload, &mut st)?;
        st.end()
    }
}

/// One line of `dead-letter list`: id, uuid, queue, job type, `attempts=N`,
/// `created_at=<RowTime>`, the payload ([`ShownPayload`]), then the last error (free text,
/// last), separated by tabs.
impl fmt::Display for DeadJob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}\t{}\t{}\t{}\tattempts={}\tcreated_at={}\t{}\t{}",
            self.id,
            self.uuid,
            self.queue,
            self.job_type,
            self.attempts,
            self.created_at,
            self.payload,
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

/// Dead-lettered rows, oldest id first, their payloads shown as `layout`'s runner reads them.
/// Only the start of a payload leaves Postgres: what [`PAYLOAD_SHOWN`] characters take, or
/// 64 KiB of JSON (a longer JSON payload is shown as stored, not compacted).
pub async fn list(
    pool: &PgPool,
    table: &TableName,
    layout: LayoutKind,
    queue: Option<&str>,
    limit: i64,
) -> Result<Vec<DeadJob>> {
    // JSON is compacted from its start: whitespace may take more bytes than are shown.
    let read = match layout.layout().payload() {
        Payload::Opaque => PAYLOAD_SHOWN * 4,
        Payload::JsonArgs => 64 * 1024,
    };
    let rows: Vec<DeadRow> = sqlx::query_as(&format!(
        "SELECT id, uuid, queue, job_type, attempts, last_error, created_at, dead_at,
                substring(payload FROM 1 FOR $3) AS payload, length(payload) AS payload_bytes
         FROM {} WHERE ($1::text IS NULL OR queue = $1) ORDER BY id LIMIT $2",
        table.dead()
    ))
    .bind(queue)
    .bind(limit.max(0))
    .bind(read as i32)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| DeadJob {
            id: r.id,
            uuid: r.uuid,
            queue: r.queue,
            job_type: r.job_type,
            attempts: r.attempts,
            last_error: r.last_error,
            created_at: r.created_at,
            dead_at: r.dead_at,
            payload: ShownPayload::of(
                &r.payload,
                usize::try_from(r.payload_bytes).unwrap_or_default(),
                layout.layout().payload(),
            ),
        })
        .collect())
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
    // A row without an ordering key gets a new id: above every relay's claim cursor, it is
    // claimed at once. A keyed row keeps its id (`jobrelay.ordering_lock` off: the ordering trigger
    // draws none), so it goes first in its key again, before the rows it held
    // (docs/guarantees.md#per-key-order); a relay's next catch-up finds it.
    let sql = format!(
        "WITH moved AS (DELETE FROM {d} WHERE {cond} AND ({RELAYABLE}) IS TRUE
                        RETURNING id, {job}),
              plain AS (INSERT INTO {t} ({job})
                        SELECT {job} FROM moved WHERE ordering_key IS NULL ORDER BY id
                        RETURNING 1),
              keyed AS (INSERT INTO {t} (id, {job})
                        SELECT id, {job} FROM moved
                        WHERE ordering_key IS NOT NULL
                          AND (SELECT set_config('jobrelay.ordering_lock', 'off', true)) IS NOT NULL
                        ORDER BY id
                        RETURNING 1)
         SELECT (SELECT count(*) FROM plain) + (SELECT count(*) FROM keyed)",
        job = crate::columns::list(crate::columns::JOB_AND_CREATED),
        d = table.dead(),
        t = table.pending(),
        cond = sel.condition()
    );
    let moved: i64 =
        sqlx::Row::try_get(&sel.bind(sqlx::query(&sql)).fetch_one(&mut *tx).await?, 0)?;
    let moved = moved as u64;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(payload: &[u8], kind: Payload) -> String {
        ShownPayload::of(payload, payload.len(), kind).to_string()
    }

    #[test]
    fn a_payload_is_shown_as_the_runner_reads_it_on_one_line() {
        assert_eq!(
            shown(b"[1, \"a\"]\n", Payload::JsonArgs),
            r#"payload=[1,"a"]"#
        );
        assert_eq!(
            shown(b"[1, \"a\"]\n", Payload::Opaque),
            r#"payload=[1, "a"]\n"#
        );
        assert_eq!(
            shown(b"not\tjson\x1b[31m \\ \xe2\x80\xae", Payload::JsonArgs),
            r"payload=not\tjson\u{1b}[31m \\ \u{202e}"
        );
        assert_eq!(shown(&[0xff, 0], Payload::Opaque), "payload_base64=/wA=");
    }

    #[test]
    fn a_long_payload_is_cut_and_says_its_size() {
        let long = "é".repeat(300);
        let p = ShownPayload::of(long.as_bytes(), long.len(), Payload::Opaque);
        assert_eq!(
            (p.text.chars().count(), p.truncated, p.bytes),
            (200, true, 600)
        );
        assert!(p.to_string().ends_with("é... (600 bytes)"), "{p}");
        // Only a start read from Postgres, a character cut in two at its end.
        let p = ShownPayload::of(&long.as_bytes()[..11], 600, Payload::JsonArgs);
        assert_eq!((p.text.as_str(), p.truncated), ("ééééé", true));
        let p = ShownPayload::of(&[0xff; 400], 400, Payload::Opaque);
        assert_eq!((p.text.len(), p.truncated, p.base64), (200, true, true));
    }
}
