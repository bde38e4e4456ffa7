//! `jobrelay status`: the backlog.

use std::process::ExitCode;

use anyhow::{Context, Result};
use jobrelay::admin::status;
use jobrelay::config::Config;

/// Prints pending rows, the oldest pending age, dead letters, per queue (`--json`: one object).
pub(super) async fn run(config: &Config, json: bool) -> Result<ExitCode> {
    let pool = super::command_pool(config).await?;
    let s = status::status(&pool, &config.table)
        .await
        .context("reading the backlog")?;
    if json {
        println!("{}", serde_json::to_string(&s)?);
    } else {
        print!("{s}");
    }
    Ok(ExitCode::SUCCESS)
}
