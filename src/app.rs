//! The `jobrelay` binary: parse, validate, then run the daemon, the sweep or a subcommand.
//!
//! Exit codes (SPEC 6): 0 success; 1 runtime failure (for `--sweep`: some row was not
//! delivered; for the daemon: the shutdown timeout cut a batch off); 2 bad usage or
//! configuration, reported in one line that names the flag or variable.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Parser;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admin::{dead_letter, status};
use crate::backoff::Backoff;
use crate::config::cli::{Cli, Command, DeadLetterCommand, Selection};
use crate::config::{Config, STATEMENT_TIMEOUT};
use crate::redis_conn::RedisConnection;
use crate::relay::{self, BatchSettings, Batcher, Dependency, Health, RedisSink, RelaySettings};
use crate::telemetry::{logging, redact};
use crate::{db, http};

/// Runs the binary with the process's arguments and environment.
pub fn main() -> ExitCode {
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
/// exit 0; every usage error is one line naming the flag (SPEC 6), exit 2.
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
pub fn usage_line(rendered: &str) -> String {
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
pub fn error_chain(e: &anyhow::Error) -> String {
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
        None if config.sweep => run_sweep(&config).await,
        None => run_daemon(&config, shutdown_signal()).await,
        Some(Command::Migrate) => {
            let pool = command_pool(&config).await?;
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
        Some(Command::Status { json }) => {
            let pool = command_pool(&config).await?;
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
        Some(Command::DeadLetter(cmd)) => run_dead_letter(&config, cmd).await,
        Some(Command::Check) => run_check(&config).await,
    }
}

async fn run_dead_letter(config: &Config, cmd: DeadLetterCommand) -> Result<ExitCode> {
    let pool = command_pool(config).await?;
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

async fn run_check(config: &Config) -> Result<ExitCode> {
    println!("config: ok ({})", describe(config));
    let mut ok = true;
    let pool = db::lazy_pool(config.pg_options()?, 1);
    let version = tokio::time::timeout(STATEMENT_TIMEOUT, db::schema_version(&pool)).await;
    // The same checks as the daemon's /readyz.
    let mut probe = relay::probe::Probe::new(
        pool,
        config.redis_client()?,
        &config.table,
        &config.namespace,
        config.push_timeout,
    );
    let found = probe.run_once().await;
    let version = version.map(|v| v.map_err(|e| e.to_string()));
    match (&found.postgres, version) {
        (Ok(present), Ok(Ok(version))) => {
            let latest = db::latest_known_version();
            let schema = match version {
                Some(v) if v < latest => {
                    format!("schema version {v} (behind this binary: run `jobrelay migrate`)")
                }
                Some(v) => format!("schema version {v}"),
                None => "no schema: run `jobrelay migrate`".to_owned(),
            };
            if version.is_none() || !present {
                ok = false;
            }
            if *present {
                println!("postgres: ok, {schema}");
            } else {
                println!(
                    "postgres: reachable, {schema}; table missing: {} does not exist (run `jobrelay migrate`)",
                    config.table
                );
            }
        }
        (Err(e), _) => {
            ok = false;
            println!(
                "postgres: {}: {}",
                e.reason(),
                redact::scrub(&e.to_string())
            );
        }
        (Ok(_), Ok(Err(e))) => {
            ok = false;
            println!("postgres: {}", redact::scrub(&e));
        }
        (Ok(_), Err(_)) => {
            ok = false;
            println!(
                "postgres: timeout: no answer within {}",
                humantime::format_duration(STATEMENT_TIMEOUT)
            );
        }
    }
    match &found.redis {
        Ok(()) => println!("redis: ok"),
        Err(e) => {
            ok = false;
            println!("redis: {}: {}", e.reason(), redact::scrub(&e.to_string()));
        }
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn describe(c: &Config) -> String {
    format!(
        "database {}, redis {}, table {}, namespace {:?}, layout {}, batch size {}, workers {}",
        c.database_url, c.redis_url, c.table, c.namespace, c.layout, c.batch_size, c.workers
    )
}

/// One connection for a one-shot command, opened up front so that a bad password or an
/// unreachable server fails at once with Postgres's own error.
async fn command_pool(config: &Config) -> Result<sqlx::PgPool> {
    Ok(db::checked_pool(config.pg_options()?, 1, STATEMENT_TIMEOUT).await?)
}

fn batch_settings(config: &Config) -> BatchSettings {
    BatchSettings {
        batch_size: config.batch_size,
        max_batch_bytes: config.batch_max_bytes,
        max_job_bytes: config.max_job_size,
        claim_slots: None,
        max_attempts: config.max_attempts,
        statement_timeout: STATEMENT_TIMEOUT,
        layout: config.layout,
    }
}

async fn run_sweep(config: &Config) -> Result<ExitCode> {
    let pool = db::checked_pool(config.pg_options()?, 2, STATEMENT_TIMEOUT).await?;
    let client = config.redis_client()?;
    let con = crate::redis_conn::connect(&client, config.push_timeout)
        .await
        .with_context(|| format!("connecting to redis at {}", config.redis_url))?;
    let sink = RedisSink::new(config.enqueuer(), con, config.push_timeout);
    let batcher = Batcher::new(
        pool,
        Arc::new(relay::Queries::for_layout(&config.table, config.layout)),
        Arc::new(batch_settings(config)),
        sink,
    );
    let (report, result) = relay::sweep(&batcher, config.batch_size, config.older_than).await;
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

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

/// Connects to Redis, retrying with backoff (an outage at start-up is waited out, logged once).
async fn connect_redis(
    client: &redis::Client,
    timeout: std::time::Duration,
    health: &Health,
    shutdown: &CancellationToken,
) -> Option<RedisConnection> {
    let mut backoff = Backoff::transient();
    loop {
        match crate::redis_conn::connect(client, timeout).await {
            Ok(con) => return Some(con),
            Err(e) => health.failed(Dependency::Redis, crate::error::redis_reason(&e), &e),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            _ = tokio::time::sleep(backoff.next_delay()) => {}
        }
    }
}

/// Runs the daemon until `signal` resolves, then drains within `--shutdown-timeout`.
pub async fn run_daemon(
    config: &Config,
    signal: impl std::future::Future<Output = ()>,
) -> Result<ExitCode> {
    let health = Arc::new(Health::for_table(config.table.clone()));
    let shutdown = CancellationToken::new();
    let tracker = TaskTracker::new();

    if let Some(addr) = config.http_addr {
        let prometheus = http::install_recorder().map_err(anyhow::Error::msg)?;
        let listener = http::bind(addr)
            .await
            .with_context(|| format!("binding --http-addr {addr}"))?;
        let (h, s) = (health.clone(), shutdown.clone());
        tokio::spawn(async move {
            if let Err(e) = http::serve(listener, prometheus, h, s).await {
                tracing::error!(error = %e, "http listener failed");
            }
        });
    }
    tracing::info!(
        table = %config.table,
        namespace = %config.namespace,
        layout = %config.layout,
        workers = config.workers,
        batch_size = config.batch_size,
        database = %config.database_url,
        redis = %config.redis_url,
        "jobrelay starting"
    );

    let pool = db::lazy_pool(config.pg_options()?, config.workers as u32 + 2);
    let client = config.redis_client()?;
    let settings = RelaySettings {
        table: config.table.clone(),
        batch: BatchSettings {
            claim_slots: Some(config.claim_slots as u32),
            ..batch_settings(config)
        },
        poll_interval: config.poll_interval,
    };
    let enqueuer = config.enqueuer();

    let started = {
        let (health, shutdown, tracker) = (health.clone(), shutdown.clone(), tracker.clone());
        let config_push = config.push_timeout;
        let workers = config.workers;
        let pool = pool.clone();
        let table = config.table.clone();
        let namespace = config.namespace.clone();
        async move {
            let (p, c, h, stop) = (
                pool.clone(),
                client.clone(),
                health.clone(),
                shutdown.clone(),
            );
            tracker.spawn(relay::supervise::supervised(
                "probe",
                health.clone(),
                shutdown.clone(),
                move || {
                    let probe = relay::probe::Probe::new(
                        p.clone(),
                        c.clone(),
                        &table,
                        &namespace,
                        relay::probe::PROBE_INTERVAL,
                    );
                    relay::probe::probe(probe, table.clone(), h.clone(), stop.clone())
                },
            ));
            let mut sinks = Vec::with_capacity(workers);
            for _ in 0..workers {
                // One connection per worker: a stalled push holds up only its own worker.
                let Some(con) = connect_redis(&client, config_push, &health, &shutdown).await
                else {
                    return;
                };
                sinks.push(RedisSink::new(enqueuer.clone(), con, config_push));
            }
            relay::spawn(&tracker, &settings, pool, sinks, health, shutdown);
        }
    };
    tokio::pin!(signal);
    tokio::select! {
        _ = started => {}
        _ = &mut signal => shutdown.cancel(),
    }
    if !shutdown.is_cancelled() {
        // Workers are running: wait for the signal.
        signal.await;
    }
    Ok(drain(config, &shutdown, &tracker).await)
}

async fn drain(config: &Config, shutdown: &CancellationToken, tracker: &TaskTracker) -> ExitCode {
    shutdown.cancel();
    tracker.close();
    tracing::info!(timeout = ?config.shutdown_timeout, "shutting down: finishing the batches in hand");
    match tokio::time::timeout(config.shutdown_timeout, tracker.wait()).await {
        Ok(()) => {
            let t = crate::telemetry::metrics::totals();
            tracing::info!(
                relayed = t.relayed,
                failed_per_job = t.per_job,
                failed_permanent = t.permanent,
                failed_transient = t.transient,
                dead_lettered = t.dead_lettered,
                "shutdown complete"
            );
            ExitCode::SUCCESS
        }
        Err(_) => {
            tracing::error!(
                timeout = ?config.shutdown_timeout,
                "shutdown timed out: batches in hand roll back (nothing is lost)"
            );
            ExitCode::from(1)
        }
    }
}
