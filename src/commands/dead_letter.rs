//! `jobrelay dead-letter list|requeue|purge`.

use std::process::ExitCode;

use anyhow::{Context, Result};
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
            let rows = dead_letter::list(&pool, &config.table, queue.as_deref(), limit)
                .await
                .context("listing dead letters")?;
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
            let requeued = dead_letter::requeue(&pool, &config.table, &selection(s))
                .await
                .context("requeueing dead letters")?;
            println!("{requeued}");
        }
        DeadLetterCommand::Purge(s) => {
            let n = dead_letter::purge(&pool, &config.table, &selection(s))
                .await
                .context("purging dead letters")?;
            println!("purged {n} rows");
        }
    }
    Ok(ExitCode::SUCCESS)
}
