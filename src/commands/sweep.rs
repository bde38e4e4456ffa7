//! `jobrelay --sweep`: relay every claimable row older than `--older-than`, then exit.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use jobrelay::broker::redis_sink::RedisSink;
use jobrelay::broker::repair::{REPAIR_GRACE, REPAIR_LIMIT};
use jobrelay::config::{Config, STATEMENT_TIMEOUT};
use jobrelay::db;
use jobrelay::relay::{self, Batcher, JobSink as _};
use jobrelay::Outcome;

/// Exit 0 if every claimed row was delivered, 1 otherwise.
pub(super) async fn run(config: &Config) -> Result<ExitCode> {
    let pool = db::checked_pool(config.pg_options()?, 2, STATEMENT_TIMEOUT).await?;
    let client = config.redis_client()?;
    let con = jobrelay::broker::connection::connect(&client, config.push_timeout)
        .await
        .with_context(|| format!("connecting to redis at {}", config.redis_url))?;
    let mut repair_con = con.clone();
    let sink = RedisSink::new(config.enqueuer(), con, config.push_timeout)
        .with_safety(config.redis_safety());
    let batcher = Batcher::new(
        pool,
        Arc::new(relay::Queries::for_needs(&config.table, sink.claim_needs())),
        Arc::new(config.batch_settings()),
        sink,
    );
    let (mut report, result) = relay::sweep(&batcher, config.batch_size, config.older_than).await;
    if result.is_ok() {
        // The layout's housekeeping too (conveyor: children stranded by a racing close).
        let enqueuer = config.enqueuer();
        loop {
            let freed = enqueuer
                .repair(&mut repair_con, REPAIR_GRACE, REPAIR_LIMIT)
                .await
                .context("layout housekeeping")?;
            report.outcomes[Outcome::Late.index()] += freed;
            if (freed as usize) < REPAIR_LIMIT {
                break;
            }
        }
    }
    println!("sweep: {report}");
    match result {
        Err(e) => Err(anyhow::Error::new(e).context("sweep stopped")),
        Ok(()) if report.failed() > 0 => {
            tracing::warn!(failed = report.failed(), "sweep left rows undelivered");
            Ok(ExitCode::from(1))
        }
        Ok(()) => Ok(ExitCode::SUCCESS),
    }
}
