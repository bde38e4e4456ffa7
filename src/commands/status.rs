//! `jobrelay status`: the backlog.

use std::process::ExitCode;

use anyhow::Result;
use jobrelay::admin::status;
use jobrelay::config::Config;

/// Prints pending rows, the oldest pending age, dead letters, per queue (`--json`: one object).
pub(super) async fn run(config: &Config, json: bool) -> Result<ExitCode> {
    let pool = super::command_pool(config).await?;
    let s = match status::status(&pool, &config.table).await {
        Err(e) => match super::table_missing(config, &e) {
            Some(code) => return Ok(code),
            None => return Err(anyhow::Error::new(e).context("reading the backlog")),
        },
        Ok(s) => s,
    };
    if json {
        println!("{}", serde_json::to_string(&s)?);
    } else {
        print!("{s}");
    }
    Ok(ExitCode::SUCCESS)
}
