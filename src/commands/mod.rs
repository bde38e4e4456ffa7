//! The `jobrelay` binary's commands, one file each: parse and validate the configuration,
//! then run the daemon, the sweep or a subcommand.
//!
//! Exit codes (docs/cli.md): 0 success; 1 runtime failure (for `--sweep`: some row was not
//! delivered; for the daemon: the shutdown timeout cut a batch off); 2 bad usage or
//! configuration, reported in one line that names the flag or variable.

mod check;
mod daemon;
mod dead_letter;
mod migrate;
mod peek;
mod redis_side;
mod status;
mod sweep;

use std::process::ExitCode;

use anyhow::Result;
use clap::Parser;
use jobrelay::config::cli::{Cli, Command};
use jobrelay::config::{Config, STATEMENT_TIMEOUT};
use jobrelay::db;
use jobrelay::telemetry::{logging, redact};

/// Runs the binary with the process's arguments and environment.
pub(crate) fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(&e),
    };
    let config = match Config::resolve(&cli.flags, &|k| std::env::var(k).ok()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("jobrelay: {}", redact::scrub(&e.to_string()));
            return ExitCode::from(2);
        }
    };
    logging::init(config.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("jobrelay: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(dispatch(cli.command, config));
    // Do not wait for tasks stuck on a dead connection.
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    match result {
        Ok(code) => code,
        Err(e) => {
            let msg = error_chain(&e);
            eprintln!("jobrelay: {}", redact::scrub(&msg));
            ExitCode::from(1)
        }
    }
}

/// Reports an error of the argument parser: `--help` and `--version` print as they are and
/// exit 0; every usage error is one line naming the flag (docs/cli.md), exit 2.
fn usage_error(e: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        let _ = e.print();
        return ExitCode::SUCCESS;
    }
    eprintln!("jobrelay: {}", usage_line(&e.to_string()));
    ExitCode::from(2)
}

/// The first paragraph of clap's rendered error, on one line, without its `error: ` prefix
/// (clap follows it with a usage block and a tip, each a paragraph of its own).
fn usage_line(rendered: &str) -> String {
    let first = rendered.split("\n\n").next().unwrap_or(rendered);
    let line = first
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    line.strip_prefix("error: ").unwrap_or(&line).to_owned()
}

/// The error and its causes, each cause shown only if the text so far does not already say it
/// (library errors often repeat their source's message).
fn error_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

async fn dispatch(command: Option<Command>, config: Config) -> Result<ExitCode> {
    match command {
        None if config.sweep => sweep::run(&config).await,
        None => daemon::run(&config, daemon::shutdown_signal()).await,
        Some(Command::Migrate) => migrate::run(&config).await,
        Some(Command::Status { json }) => status::run(&config, json).await,
        Some(Command::DeadLetter(cmd)) => dead_letter::run(&config, cmd).await,
        Some(Command::Check { strict }) => check::run(&config, strict).await,
        Some(Command::Peek(args)) => peek::run(&config, args).await,
    }
}

/// A one-shot command's failure for want of the outbox table (or its schema, or its dead
/// letters): one line naming `jobrelay migrate`, exit 1 (docs/cli.md#exit-codes). `None` for
/// any other failure.
fn table_missing(config: &Config, e: &jobrelay::Error) -> Option<ExitCode> {
    if e.reason() != jobrelay::error::Reason::TableMissing {
        return None;
    }
    let what = match e {
        jobrelay::Error::Database(sqlx::Error::Database(db)) => db.message().to_owned(),
        other => other.to_string(),
    };
    let table = config.table.to_string();
    let same = if table == "pending_jobs" {
        ""
    } else {
        " with the same --table"
    };
    eprintln!(
        "jobrelay: {what}: run `jobrelay migrate`{same} to create the outbox table {table} and \
         its dead letters"
    );
    Some(ExitCode::from(1))
}

/// One connection for a one-shot command, opened up front so that a bad password or an
/// unreachable server fails at once with Postgres's own error.
async fn command_pool(config: &Config) -> Result<sqlx::PgPool> {
    Ok(db::checked_pool(config.pg_options()?, 1, STATEMENT_TIMEOUT).await?)
}
