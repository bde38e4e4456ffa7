//! `jobrelay status`: the backlog, and the queues' Redis side.

use std::process::ExitCode;

use anyhow::Result;
use jobrelay::admin::status;
use jobrelay::config::Config;
use jobrelay::telemetry::redact;

/// Prints pending rows, the oldest pending age, dead letters, per queue, the ordering keys held
/// by a dead-lettered row (with their dead heads and the fix), then each queue's Redis side:
/// waiting jobs, oldest job, consumers (`--json`: one object, the held keys under `held_keys`,
/// the Redis side under `redis`). Exit 1 when Redis cannot be read (the backlog is printed
/// first).
pub(super) async fn run(config: &Config, json: bool) -> Result<ExitCode> {
    let pool = super::command_pool(config).await?;
    let s = match status::status(&pool, &config.table).await {
        Err(e) => match super::table_missing(config, &e) {
            Some(code) => return Ok(code),
            None => return Err(anyhow::Error::new(e).context("reading the backlog")),
        },
        Ok(s) => s,
    };
    let look = super::redis_side::look(config, s.queues.keys().cloned().collect()).await;
    let code = if look.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    };
    if json {
        let mut out = serde_json::to_value(&s)?;
        out["redis"] = match &look {
            Ok(l) => {
                let mut side = serde_json::to_value(&l.side)?;
                side["queues_left_out"] = l.left_out.into();
                side["consumers_elsewhere"] = serde_json::to_value(&l.elsewhere)?;
                side
            }
            Err(e) => serde_json::json!({ "error": redact::scrub(&format!("{e:#}")) }),
        };
        println!("{out}");
        return Ok(code);
    }
    print!("{s}");
    match look {
        Ok(l) => {
            print!("{}", l.side);
            if l.left_out > 0 {
                println!("({} more queues not shown)", l.left_out);
            }
            for line in l.starving() {
                println!("warning: {line}");
            }
        }
        Err(e) => println!("redis: {}", redact::scrub(&format!("{e:#}"))),
    }
    Ok(code)
}
