//! `jobrelay status`: the backlog at a glance.

use std::collections::BTreeMap;

use serde::Serialize;
use sqlx::PgPool;

use super::held_keys::{self, HeldKeys, HELD_KEYS_NAMED};
use crate::error::Result;
use crate::relay::queries::PLANNER_SET_LOCAL;
use crate::table::TableName;

/// Pending and dead rows of one queue.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct QueueStatus {
    /// Rows waiting in the outbox table.
    pub pending: i64,
    /// Rows in the dead-letter table.
    pub dead: i64,
}

/// The backlog (docs/cli.md, `status --json`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Status {
    /// Rows waiting in the outbox table.
    pub pending: i64,
    /// Age of the oldest of them (by `created_at`), in seconds; `null` when there are none.
    ///
    /// Rows whose `created_at` is `infinity` or `-infinity` are ignored (they are counted in
    /// `pending`): they have no age, Postgres cannot subtract them from `now()`, and the relay
    /// dead-letters them anyway. `null` when every pending row has such a `created_at`.
    pub oldest_pending_age_seconds: Option<f64>,
    /// Rows in the dead-letter table.
    pub dead: i64,
    /// The same, per queue.
    pub queues: BTreeMap<String, QueueStatus>,
    /// Ordering keys whose rows wait behind a dead-lettered row of theirs, the first
    /// [`HELD_KEYS_NAMED`] named.
    pub held_keys: HeldKeys,
}

/// The two statements of [`status`]: pending rows per queue (with the oldest's age), dead rows
/// per queue.
#[doc(hidden)]
pub fn statements(table: &TableName) -> [String; 2] {
    [
        format!(
            "SELECT queue, count(*),
                    EXTRACT(EPOCH FROM now()
                        - min(created_at) FILTER (WHERE isfinite(created_at)))::float8
             FROM {} GROUP BY queue",
            table.pending()
        ),
        format!(
            "SELECT queue, count(*) FROM {} GROUP BY queue",
            table.dead()
        ),
    ]
}

/// Reads the backlog of `table` in one snapshot. Never fails on a row's values: the oldest
/// age ignores a non-finite `created_at` (see [`Status::oldest_pending_age_seconds`]).
pub async fn status(pool: &PgPool, table: &TableName) -> Result<Status> {
    // Counting reads every row, by definition: the one statement here whose cost is the
    // table's. It runs once per call, never in the relay's loop, and without JIT compilation
    // (which a 10M-row count would switch on: tens of milliseconds of compiling to save less).
    let mut tx = pool
        .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET LOCAL jit = off")
        .await?;
    let [pending_sql, dead_sql] = statements(table);
    let pending: Vec<(String, i64, Option<f64>)> =
        sqlx::query_as(&pending_sql).fetch_all(&mut *tx).await?;
    let dead: Vec<(String, i64)> = sqlx::query_as(&dead_sql).fetch_all(&mut *tx).await?;
    // The held keys, in the same snapshot, through the keys' indexes alone: the relay's
    // planner settings from here on.
    sqlx::raw_sql(PLANNER_SET_LOCAL).execute(&mut *tx).await?;
    let held_keys = held_keys::read(&mut tx, table, HELD_KEYS_NAMED).await?;
    tx.commit().await?;

    let mut s = Status {
        pending: 0,
        oldest_pending_age_seconds: None,
        dead: 0,
        queues: BTreeMap::new(),
        held_keys,
    };
    for (queue, n, age) in pending {
        s.pending += n;
        s.oldest_pending_age_seconds = match (s.oldest_pending_age_seconds, age) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        s.queues.entry(queue).or_default().pending = n;
    }
    for (queue, n) in dead {
        s.dead += n;
        s.queues.entry(queue).or_default().dead = n;
    }
    Ok(s)
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let age = self
            .oldest_pending_age_seconds
            .map(|a| format!("{a:.1}s"))
            .unwrap_or_else(|| "-".into());
        writeln!(
            f,
            "pending {}  oldest {}  dead {}",
            self.pending, age, self.dead
        )?;
        if !self.queues.is_empty() {
            writeln!(f, "{:<40} {:>12} {:>12}", "QUEUE", "PENDING", "DEAD")?;
            for (q, s) in &self.queues {
                writeln!(f, "{q:<40} {:>12} {:>12}", s.pending, s.dead)?;
            }
        }
        write!(f, "{}", self.held_keys)
    }
}
