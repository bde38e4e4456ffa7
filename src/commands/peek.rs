//! `jobrelay peek`: jobs waiting in Redis, decoded, read without moving them.

use std::process::ExitCode;

use anyhow::{Context, Result};
use jobrelay::admin::peek::{self, PeekError};
use jobrelay::broker::layout::peek::Wanted;
use jobrelay::config::cli::PeekArgs;
use jobrelay::config::Config;

/// Prints the jobs `args` name: a block of lines per job, or one JSON object per line; a
/// summary line on stderr. Exit 2 when the layout keeps no such jobs, or what it
/// read is another layout's jobs (naming the `--layout` to pass).
pub(super) async fn run(config: &Config, args: PeekArgs) -> Result<ExitCode> {
    let wanted = if let Some(u) = args.children_of {
        Wanted::Children(u.hyphenated().to_string())
    } else if let Some(u) = args.on_complete_of {
        Wanted::OnComplete(u.hyphenated().to_string())
    } else if args.scheduled {
        Wanted::Scheduled(args.queue)
    } else {
        Wanted::Queue(args.queue.unwrap_or_default())
    };
    let client = config.redis_client()?;
    let mut con = jobrelay::broker::connection::connect(&client, config.push_timeout)
        .await
        .with_context(|| format!("connecting to redis at {}", config.redis_url))?;
    let page = match peek::peek(
        &mut con,
        config.layout,
        &config.namespace,
        &wanted,
        args.limit as usize,
    )
    .await
    {
        Ok(page) => page,
        Err(e @ (PeekError::NoShelf(_) | PeekError::OtherLayout { .. })) => {
            eprintln!("jobrelay: {e}");
            return Ok(ExitCode::from(2));
        }
        Err(e) => return Err(e.into()),
    };
    for job in &page.jobs {
        if args.json {
            println!("{}", serde_json::to_string(job)?);
        } else {
            print!("{job}");
        }
    }
    // On stderr, so that --json output stays one object per line.
    eprintln!("{}", page.summary());
    Ok(ExitCode::SUCCESS)
}
