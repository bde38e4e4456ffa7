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
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(e.exit_code().clamp(0, 255) as u8);
        }
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
    let version = async {
        let pool = command_pool(config).await?;
        let version = db::schema_version(&pool).await?;
        Ok::<_, anyhow::Error>((pool, version))
    };
    match tokio::time::timeout(STATEMENT_TIMEOUT, version).await {
        Ok(Ok((pool, Some(v)))) => {
            let latest = db::latest_known_version();
            let note = if v < latest {
                " (behind this binary: run `jobrelay migrate`)"
            } else {
                ""
            };
            println!("postgres: ok, schema version {v}{note}");
            let probe = format!("SELECT 1 FROM {} LIMIT 0", config.table.pending());
            if let Err(e) = sqlx::query(&probe).execute(&pool).await {
                ok = false;
                println!(
                    "postgres: table {} unusable: {}",
                    config.table,
                    redact::scrub(&e.to_string())
                );
            }
        }
        Ok(Ok((_, None))) => {
            ok = false;
            println!("postgres: reachable, but no schema: run `jobrelay migrate`");
        }
        Ok(Err(e)) => {
            ok = false;
            let msg = error_chain(&e);
            let msg = msg.strip_prefix("postgres: ").unwrap_or(&msg);
            println!("postgres: {}", redact::scrub(msg));
        }
        Err(_) => {
            ok = false;
            println!(
                "postgres: no answer within {}",
                humantime::format_duration(STATEMENT_TIMEOUT)
            );
        }
    }
    let client = config.redis_client()?;
    let ping = async {
        let mut con = client.get_multiplexed_async_connection().await?;
        redis::cmd("PING").query_async::<String>(&mut con).await
    };
    match tokio::time::timeout(config.push_timeout, ping).await {
        Ok(Ok(_)) => println!("redis: ok"),
        Ok(Err(e)) => {
            ok = false;
            println!("redis: {}", redact::scrub(&e.to_string()));
        }
        Err(_) => {
            ok = false;
            println!(
                "redis: no answer within {}",
                humantime::format_duration(config.push_timeout)
            );
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
        "database {}, redis {}, table {}, namespace {:?}, batch size {}, workers {}",
        c.database_url, c.redis_url, c.table, c.namespace, c.batch_size, c.workers
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
        max_attempts: config.max_attempts,
        statement_timeout: STATEMENT_TIMEOUT,
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
        Arc::new(relay::Queries::new(&config.table)),
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
            Err(e) => health.failed(Dependency::Redis, &e),
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
    let health = Arc::new(Health::default());
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
        batch: batch_settings(config),
        poll_interval: config.poll_interval,
    };
    let enqueuer = config.enqueuer();

    let started = {
        let (health, shutdown, tracker) = (health.clone(), shutdown.clone(), tracker.clone());
        let config_push = config.push_timeout;
        let workers = config.workers;
        let pool = pool.clone();
        let table = config.table.clone();
        async move {
            tracker.spawn(relay::probe::probe(
                pool.clone(),
                client.clone(),
                table,
                health.clone(),
                shutdown.clone(),
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
