//! `jobrelay dead-letter list|requeue|purge`.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

use crate::error::Result;
use crate::table::TableName;

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
    pub created_at: DateTime<Utc>,
    /// When it was dead-lettered.
    pub dead_at: DateTime<Utc>,
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
/// payload, parent, predecessor, dead_parent, run_at, headers, created_at) with attempts reset
/// and available now. Returns how many rows moved. All or nothing: one transaction.
pub async fn requeue(pool: &PgPool, table: &TableName, sel: &Selection) -> Result<u64> {
    let sql = format!(
        "WITH moved AS (DELETE FROM {d} WHERE {cond}
                        RETURNING id, uuid, queue, job_type, payload, parent_uuid,
                                  predecessor_uuid, dead_parent, run_at, headers, created_at)
         INSERT INTO {t} (uuid, queue, job_type, payload, parent_uuid, predecessor_uuid,
                          dead_parent, run_at, headers, created_at)
         SELECT uuid, queue, job_type, payload, parent_uuid, predecessor_uuid, dead_parent,
                run_at, headers, created_at
         FROM moved ORDER BY id",
        d = table.dead(),
        t = table.pending(),
        cond = sel.condition()
    );
    Ok(sel
        .bind(sqlx::query(&sql))
        .execute(pool)
        .await?
        .rows_affected())
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
