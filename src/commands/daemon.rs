//! The daemon: relay until SIGTERM or SIGINT, then finish the batches in hand.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use jobrelay::config::Config;
use jobrelay::http;
use jobrelay::relay::Health;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Resolves on SIGTERM or SIGINT.
pub(super) async fn shutdown_signal() {
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

/// Runs the daemon until `signal` resolves, then drains within `--shutdown-timeout`.
pub(super) async fn run(
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

    let started = config
        .assembly()?
        .start(&tracker, health.clone(), shutdown.clone());
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
            let t = jobrelay::telemetry::metrics::totals();
            tracing::info!(
                relayed = t.relayed,
                failed_per_job = t.per_job,
                failed_permanent = t.permanent,
                failed_transient = t.transient,
                failed_config = t.config,
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
