//! Ordering keys held by a dead head (docs/guarantees.md#per-key-order): a row of the key lies
//! in the dead-letter table and rows of the same key wait in the outbox behind it. The claim
//! passes them over until the operator requeues the dead row (after mending it) or purges it;
//! other keys flow. Read by `status`, `check` and the daemon's probe (`jobrelay_held_keys`).

use serde::Serialize;
use sqlx::{Connection as _, PgConnection, PgPool};

use crate::error::Result;
use crate::relay::queries::PLANNER_SET_LOCAL;
use crate::table::TableName;

/// How many held keys `status` and `check` name (the oldest holds first).
pub const HELD_KEYS_NAMED: i64 = 10;

/// Characters of a dead head's `last_error` read (`dead-letter list` shows it whole).
pub const ERROR_CHARS: i32 = 300;

/// The held keys of an outbox (`status --json`'s `held_keys`).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct HeldKeys {
    /// Keys held.
    pub keys: i64,
    /// Rows waiting in the outbox behind them.
    pub rows: i64,
    /// How long the oldest hold has lasted (since its dead row's `dead_at`), in seconds;
    /// `null` when no key is held.
    pub oldest_age_seconds: Option<f64>,
    /// The first keys, the oldest hold first.
    pub first: Vec<HeldKey>,
}

/// One held key and its dead head.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HeldKey {
    /// The key.
    pub ordering_key: String,
    /// Its dead head: the key's lowest id in the dead-letter table (its id in the outbox).
    pub dead_id: i64,
    /// The dead head's uuid.
    pub dead_uuid: uuid::Uuid,
    /// Why it died (its first [`ERROR_CHARS`] characters).
    pub last_error: Option<String>,
    /// Rows of the key waiting in the outbox.
    pub waiting: i64,
    /// Seconds since the key's oldest row in the dead letters died.
    pub age_seconds: f64,
}

impl HeldKey {
    /// What releases the key: `jobrelay dead-letter requeue --id N` once the dead head is
    /// mended, or `purge` to give it up (its successors then go without it).
    pub fn fix(&self) -> String {
        format!(
            "mend dead row {id} and run `jobrelay dead-letter requeue --id {id}`, or drop it: \
             `jobrelay dead-letter purge --id {id}`",
            id = self.dead_id
        )
    }
}

/// The statement of [`read`]: `$1` keys named (at least 1: the totals ride on each row).
///
/// It walks the dead letters' partial index `(ordering_key, id) WHERE ordering_key IS NOT
/// NULL` and, for each key found there, counts that key's rows in the outbox's, one probe per
/// key (a subquery per row, never a join the planner could turn into a walk of the whole
/// index; materialised, so it runs once): its cost is the keyed dead rows plus the held rows,
/// never the rest of either table. With no keyed row in the dead letters it is one probe of an empty index and
/// reads nothing of the outbox. Run under the relay's planner settings
/// ([`crate::relay::queries::PLANNER_SETTINGS`]), which no statistics can talk out of the
/// indexes.
#[doc(hidden)]
pub fn statement(table: &TableName) -> String {
    format!(
        "WITH heads AS (
             SELECT DISTINCT ON (ordering_key) ordering_key, id, uuid, last_error,
                    min(dead_at) FILTER (WHERE isfinite(dead_at))
                        OVER (PARTITION BY ordering_key) AS since
             FROM {d} WHERE ordering_key IS NOT NULL
             ORDER BY ordering_key, id
         ), counted AS MATERIALIZED (
             SELECT h.ordering_key, h.id, h.uuid, h.last_error,
                    COALESCE(EXTRACT(EPOCH FROM now() - h.since)::float8, 0) AS age,
                    (SELECT count(*) FROM {t} p WHERE p.ordering_key = h.ordering_key) AS waiting
             FROM heads h
         )
         SELECT count(*) OVER (), sum(waiting) OVER ()::int8, max(age) OVER (),
                ordering_key, id, uuid, left(last_error, {ERROR_CHARS}), waiting, age
         FROM counted
         WHERE waiting > 0
         ORDER BY age DESC, ordering_key
         LIMIT $1",
        t = table.pending(),
        d = table.dead()
    )
}

/// One row of [`statement`]: the totals, then one held key.
type Row = (
    i64,
    i64,
    f64,
    String,
    i64,
    uuid::Uuid,
    Option<String>,
    i64,
    f64,
);

/// The held keys of `table`, naming the first `first` (at least 1), on `conn` in a transaction
/// opened with the relay's planner settings (as [`held_keys`] opens one).
pub async fn read(conn: &mut PgConnection, table: &TableName, first: i64) -> Result<HeldKeys> {
    // Unnamed: no plan cached, whatever the pool does with statements.
    let rows: Vec<Row> = sqlx::query_as(&statement(table))
        .persistent(false)
        .bind(first.max(1))
        .fetch_all(conn)
        .await?;
    let mut held = HeldKeys::default();
    for (keys, rows, oldest, ordering_key, dead_id, dead_uuid, last_error, waiting, age) in rows {
        held.keys = keys;
        held.rows = rows;
        held.oldest_age_seconds = Some(oldest);
        held.first.push(HeldKey {
            ordering_key,
            dead_id,
            dead_uuid,
            last_error,
            waiting,
            age_seconds: age,
        });
    }
    Ok(held)
}

/// [`read`] in a read-only transaction of its own, with the relay's planner settings.
pub async fn held_keys(pool: &PgPool, table: &TableName, first: i64) -> Result<HeldKeys> {
    let mut conn = pool.acquire().await?;
    let mut tx = conn
        .begin_with(format!(
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; {PLANNER_SET_LOCAL}"
        ))
        .await?;
    let held = read(&mut tx, table, first).await?;
    tx.rollback().await?;
    Ok(held)
}

impl HeldKeys {
    /// `check`'s warning (and the daemon's log line): how many keys, rows and how long, the
    /// first key with its dead head and error, and the fix. `None` when no key is held.
    pub fn warning(&self) -> Option<String> {
        let k = self.first.first()?;
        let more = match self.keys - 1 {
            0 => String::new(),
            n => format!(" (and {n} more, listed by jobrelay status)"),
        };
        Some(format!(
            "{} ordering key{} held by a dead-lettered row ({} row{} waiting, oldest for {:.0}s): \
             key {:?}, {} row{} behind dead row {} ({}): {}; {}{more}",
            self.keys,
            plural(self.keys),
            self.rows,
            plural(self.rows),
            self.oldest_age_seconds.unwrap_or(0.0),
            k.ordering_key,
            k.waiting,
            plural(k.waiting),
            k.dead_id,
            k.dead_uuid,
            k.last_error.as_deref().unwrap_or("no error recorded"),
            k.fix()
        ))
    }
}

fn plural(n: i64) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// `status`'s section: nothing when no key is held; else a summary line, a table of the first
/// keys (their dead heads and errors), how to release them, and how many are not shown.
impl std::fmt::Display for HeldKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.keys == 0 {
            return Ok(());
        }
        writeln!(
            f,
            "held keys {}  rows held {}  oldest {:.1}s (each waits behind a dead-lettered row)",
            self.keys,
            self.rows,
            self.oldest_age_seconds.unwrap_or(0.0)
        )?;
        writeln!(
            f,
            "{:<32} {:>12} {:>8} {:>10}  {:<36}  LAST ERROR",
            "HELD KEY", "DEAD ID", "WAITING", "HELD FOR", "DEAD UUID"
        )?;
        for k in &self.first {
            writeln!(
                f,
                "{:<32} {:>12} {:>8} {:>10}  {:<36}  {}",
                k.ordering_key,
                k.dead_id,
                k.waiting,
                format!("{:.1}s", k.age_seconds),
                k.dead_uuid,
                k.last_error.as_deref().unwrap_or("")
            )?;
        }
        let shown = self.first.len() as i64;
        if self.keys > shown {
            writeln!(f, "({} more held keys not shown)", self.keys - shown)?;
        }
        writeln!(
            f,
            "to release a key: mend its dead row, then `jobrelay dead-letter requeue --id N`; \
             or drop it: `jobrelay dead-letter purge --id N` (`jobrelay dead-letter list` shows it)"
        )
    }
}
