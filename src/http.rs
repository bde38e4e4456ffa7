//! The daemon's HTTP listener (SPEC 7): `/metrics`, `/healthz`, `/readyz`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio_util::sync::CancellationToken;

use crate::relay::Health;
use crate::telemetry::metrics;

pub use crate::relay::health::STALL_LIMIT;

/// Installs the Prometheus recorder (once per process) and returns its handle.
pub fn install_recorder() -> Result<PrometheusHandle, String> {
    static HANDLE: std::sync::OnceLock<Result<PrometheusHandle, String>> =
        std::sync::OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let latency = [
                0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                60.0, 300.0, 900.0, 3600.0,
            ];
            let handle = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Full(metrics::BATCH_DURATION.into()), &latency)
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Full(metrics::RELAY_LAG.into()), &latency)
                })
                .and_then(|b| b.install_recorder())
                .map_err(|e| e.to_string())?;
            metrics::describe();
            Ok(handle)
        })
        .clone()
}

#[derive(Clone)]
struct AppState {
    prometheus: PrometheusHandle,
    health: Arc<Health>,
}

/// Serves the endpoints on `listener` until `shutdown`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    prometheus: PrometheusHandle,
    health: Arc<Health>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let upkeep = prometheus.clone();
    let upkeep_stop = shutdown.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tokio::select! {
                _ = upkeep_stop.cancelled() => return,
                _ = tick.tick() => upkeep.run_upkeep(),
            }
        }
    });
    let app = Router::new()
        .route("/metrics", get(render_metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(AppState { prometheus, health });
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

/// Binds `addr` (before anything else starts, so a taken port fails fast).
pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await
}

/// The Prometheus text exposition format, version 0.0.4.
pub const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

async fn render_metrics(
    State(s): State<AppState>,
) -> ([(header::HeaderName, &'static str); 1], String) {
    (
        [(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)],
        s.prometheus.render(),
    )
}

async fn healthz(State(s): State<AppState>) -> (StatusCode, String) {
    match s.health.liveness() {
        Ok(()) => (StatusCode::OK, "ok\n".into()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    }
}

/// 200 `ready`, or 503 with one line per reason, e.g. `redis: out of memory (OOM ...)`.
async fn readyz(State(s): State<AppState>) -> (StatusCode, String) {
    match s.health.readiness() {
        Ok(()) => (StatusCode::OK, "ready\n".into()),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{}\n", why.join("\n")),
        ),
    }
}
