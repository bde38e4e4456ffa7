//! `jobrelay dead-letter list|requeue|purge`.

use std::process::ExitCode;

use anyhow::Result;
use jobrelay::admin::dead_letter;
use jobrelay::config::cli::{DeadLetterCommand, Selection};
use jobrelay::config::Config;

/// Lists, requeues or purges dead-lettered rows.
pub(super) async fn run(config: &Config, cmd: DeadLetterCommand) -> Result<ExitCode> {
    let pool = super::command_pool(config).await?;
    let selection = |s: Selection| {
        if s.all {
            dead_letter::Selection::All
        } else if let Some(q) = s.queue {
            dead_letter::Selection::Queue(q)
        } else {
            dead_letter::Selection::Ids(s.id)
        }
    };
    match cmd {
        DeadLetterCommand::List { queue, limit, json } => {
            let rows =
                dead_letter::list(&pool, &config.table, config.layout, queue.as_deref(), limit)
                    .await;
            let rows = missing_or(config, rows, "listing dead letters")?;
            let rows = match rows {
                Ok(rows) => rows,
                Err(code) => return Ok(code),
            };
            for r in &rows {
                if json {
                    println!("{}", serde_json::to_string(r)?);
                } else {
                    println!("{r}");
                }
            }
            // On stderr, so that --json output stays one object per line.
            eprintln!("{} dead-lettered rows listed", rows.len());
        }
        DeadLetterCommand::Requeue(s) => {
            let requeued = dead_letter::requeue(&pool, &config.table, &selection(s)).await;
            let requeued = match missing_or(config, requeued, "requeueing dead letters")? {
                Ok(r) => r,
                Err(code) => return Ok(code),
            };
            println!("{requeued}");
        }
        DeadLetterCommand::Purge(s) => {
            let n = dead_letter::purge(&pool, &config.table, &selection(s)).await;
            let n = match missing_or(config, n, "purging dead letters")? {
                Ok(n) => n,
                Err(code) => return Ok(code),
            };
            println!("purged {n} rows");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The command's result; a missing table as its exit code (said in one line), any other
/// failure as the error, with `what` the command was doing.
fn missing_or<T>(
    config: &Config,
    r: jobrelay::Result<T>,
    what: &'static str,
) -> Result<std::result::Result<T, ExitCode>> {
    match r {
        Ok(v) => Ok(Ok(v)),
        Err(e) => match super::table_missing(config, &e) {
            Some(code) => Ok(Err(code)),
            None => Err(anyhow::Error::new(e).context(what)),
        },
    }
}
