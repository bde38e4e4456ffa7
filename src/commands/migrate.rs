//! `jobrelay migrate`: apply the embedded migrations (and create `--table`).

use std::process::ExitCode;

use anyhow::{Context, Result};
use jobrelay::config::Config;
use jobrelay::db;

/// Applies the migrations; an existing `--table` of another shape is refused (exit 2) before
/// anything is changed.
pub(super) async fn run(config: &Config) -> Result<ExitCode> {
    let pool = super::command_pool(config).await?;
    // An existing --table of another shape is refused before anything is changed.
    if let Some(unfit) = db::unfit_outbox(&pool, &config.table).await? {
        eprintln!("jobrelay: {unfit}; nothing was changed");
        return Ok(ExitCode::from(2));
    }
    db::migrate(&pool, &config.table)
        .await
        .context("applying migrations")?;
    let version = db::schema_version(&pool).await?.unwrap_or(0);
    println!("schema at version {version} (table {})", config.table);
    Ok(ExitCode::SUCCESS)
}
