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

/// Applies the embedded migrations; when `table` is not `pending_jobs`, also creates it, its
/// dead-letter table and its trigger (`jobrelay_create_outbox`).
pub async fn migrate(pool: &PgPool, table: &TableName) -> Result<()> {
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
