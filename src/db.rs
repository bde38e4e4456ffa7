//! Postgres: the embedded migrations, pools, and the schema version.

use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};

use crate::error::{Error, Result};
use crate::table::TableName;

/// The migrations in `migrations/`, embedded in the binary.
pub static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// A pool of at most `max` connections that connects on first use, so a relay starts (and
/// serves its probes) while Postgres is still down.
pub fn lazy_pool(opts: PgConnectOptions, max: u32) -> PgPool {
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(10))
        .connect_lazy_with(opts)
}

/// Opens one connection first, so that a wrong password or an unreachable server fails at once
/// with Postgres's own error (a pool would only say it timed out), then returns a lazy pool.
pub async fn checked_pool(opts: PgConnectOptions, max: u32, timeout: Duration) -> Result<PgPool> {
    let conn = tokio::time::timeout(timeout, PgConnection::connect_with(&opts))
        .await
        .map_err(|_| Error::Timeout {
            what: "postgres connect",
            after: timeout,
        })??;
    let _ = conn.close().await;
    Ok(lazy_pool(opts, max))
}

/// The columns of an outbox table and their types (docs/schema.md). Other columns may follow.
pub const OUTBOX_COLUMNS: [(&str, &str); 14] = [
    ("id", "bigint"),
    ("uuid", "uuid"),
    ("queue", "text"),
    ("job_type", "text"),
    ("payload", "bytea"),
    ("parent_uuid", "uuid"),
    ("predecessor_uuid", "uuid"),
    ("dead_parent", "boolean"),
    ("run_at", "timestamptz"),
    ("headers", "jsonb"),
    ("created_at", "timestamptz"),
    ("attempts", "integer"),
    ("available_at", "timestamptz"),
    ("last_error", "text"),
];

/// The dead-letter table's column besides [`OUTBOX_COLUMNS`] (docs/schema.md).
pub const DEAD_LETTER_COLUMN: (&str, &str) = ("dead_at", "timestamptz");

/// An existing table that cannot serve as the outbox (or its dead-letter table) it is named
/// for: [`unfit_outbox`]'s finding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnfitOutbox {
    /// The outbox as named by `--table` (`orders`, `billing.jobs`).
    pub outbox: String,
    /// The table that does not fit: the outbox itself or its `_dead` table.
    pub table: String,
    /// What is wrong with it, e.g. `missing columns uuid uuid, queue text`,
    /// `payload is text, not bytea`, `it is a view, not a table`.
    pub problems: Vec<String>,
}

/// One line: `--table orders: orders exists and is not a jobrelay outbox (docs/schema.md): missing
/// columns uuid uuid, ...`.
impl std::fmt::Display for UnfitOutbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let role = if self.table == self.outbox {
            "a jobrelay outbox"
        } else {
            "a jobrelay dead-letter table"
        };
        write!(
            f,
            "--table {}: {} exists and is not {role} (docs/schema.md): {}",
            self.outbox,
            self.table,
            self.problems.join("; ")
        )
    }
}

/// Whether `table` or its dead-letter table already exists with a shape the relay cannot use:
/// not a plain table, or without one of the columns of docs/schema.md (with its type). Tables that do
/// not exist yet are fine (`migrate` creates them), and so are additional columns. Reads the
/// catalog only.
pub async fn unfit_outbox(pool: &PgPool, table: &TableName) -> Result<Option<UnfitOutbox>> {
    let outbox = table.to_string();
    let dead = format!("{outbox}_dead");
    let dead_columns: Vec<(&str, &str)> = OUTBOX_COLUMNS
        .iter()
        .copied()
        .chain([DEAD_LETTER_COLUMN])
        .collect();
    for (name, quoted, columns) in [
        (&outbox, table.pending(), &OUTBOX_COLUMNS[..]),
        (&dead, table.dead(), &dead_columns[..]),
    ] {
        let problems = table_problems(pool, &quoted, columns).await?;
        if !problems.is_empty() {
            return Ok(Some(UnfitOutbox {
                outbox: outbox.clone(),
                table: name.clone(),
                problems,
            }));
        }
    }
    Ok(None)
}

/// What keeps the table `quoted` (an SQL name) from having `columns`; empty when it does or
/// does not exist.
async fn table_problems(
    pool: &PgPool,
    quoted: &str,
    columns: &[(&str, &str)],
) -> Result<Vec<String>> {
    let kind: Option<String> =
        sqlx::query_scalar("SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)")
            .bind(quoted)
            .fetch_optional(pool)
            .await?;
    match kind.as_deref() {
        None => return Ok(Vec::new()),
        Some("r") => {}
        Some(other) => {
            let what = match other {
                "v" => "a view",
                "m" => "a materialized view",
                "p" => "a partitioned table",
                "f" => "a foreign table",
                "S" => "a sequence",
                "i" | "I" => "an index",
                _ => "not a plain table",
            };
            return Ok(vec![format!("it is {what}, not a plain table")]);
        }
    }
    let have: Vec<(String, String)> = sqlx::query_as(
        "SELECT attname::text, format_type(atttypid, NULL) FROM pg_attribute
         WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped",
    )
    .bind(quoted)
    .fetch_all(pool)
    .await?;
    let short = |t: &str| match t {
        "timestamp with time zone" => "timestamptz".to_owned(),
        other => other.to_owned(),
    };
    let mut missing = Vec::new();
    let mut wrong = Vec::new();
    for &(name, ty) in columns {
        match have.iter().find(|(n, _)| n == name) {
            None => missing.push(format!("{name} {ty}")),
            Some((_, actual)) if short(actual) != ty => {
                wrong.push(format!("{name} is {}, not {ty}", short(actual)));
            }
            Some(_) => {}
        }
    }
    let mut problems = Vec::new();
    if !missing.is_empty() {
        problems.push(format!("missing columns {}", missing.join(", ")));
    }
    problems.extend(wrong);
    Ok(problems)
}

/// Applies the embedded migrations; when `table` is not `pending_jobs`, also creates it, its
/// dead-letter table and its trigger (`jobrelay_create_outbox`).
///
/// First checks [`unfit_outbox`]: an existing table of another shape (an application's own
/// `orders`, say) is refused before anything is changed, with [`Error::NotAnOutbox`].
pub async fn migrate(pool: &PgPool, table: &TableName) -> Result<()> {
    if let Some(unfit) = unfit_outbox(pool, table).await? {
        return Err(Error::NotAnOutbox(unfit));
    }
    MIGRATOR.run(pool).await?;
    if *table != TableName::default() {
        sqlx::query("SELECT jobrelay_create_outbox($1)")
            .bind(table.to_string())
            .execute(pool)
            .await?;
    }
    Ok(())
}

/// The latest applied migration version, or `None` before `jobrelay migrate` ran.
pub async fn schema_version(pool: &PgPool) -> Result<Option<i64>> {
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
        .fetch_one(pool)
        .await?;
    if !exists {
        return Ok(None);
    }
    Ok(
        sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations WHERE success")
            .fetch_one(pool)
            .await?,
    )
}

/// The newest migration this binary carries.
pub fn latest_known_version() -> i64 {
    MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0)
}
