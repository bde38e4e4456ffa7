//! The daemon's HTTP listener (docs/metrics.md): `/metrics`, `/healthz`, `/readyz`.
//!
//! The listener must never be a way to exhaust the relay (its file descriptors are also its
//! Postgres and Redis connections), so every connection is bounded:
//!
//! - [`HEADER_READ_TIMEOUT`] (10 s), hyper's `header_read_timeout`: from the moment hyper
//!   waits for a request until that request's whole header is in. In hyper 1.12 it starts
//!   when the connection opens *and* again as soon as a response is done on a kept-alive
//!   connection, so it also closes a socket that never sends a byte, one that sends half a
//!   header, and a kept-alive one that sends no next request (the idle keep-alive wait).
//! - [`IDLE_TIMEOUT`] (20 s), our own: a connection on which no byte moved either way for
//!   this long while no request was being handled is closed, whatever state hyper is in: a
//!   client that never reads its responses (hyper then waits on a full socket, where its
//!   header timer does not run), a request body that never arrives, or a hyper version whose
//!   header timer covers less.
//! - [`MAX_CONNECTIONS`] (256) connections at once; one more is answered 503 and closed at
//!   once (see [`MAX_CONNECTIONS`] for why).
//!
//! Accept errors (`EMFILE` and the like) do not stop the listener: the first of an episode is
//! logged, and accepting is retried every [`ACCEPT_BACKOFF`]. On shutdown the listener stops
//! accepting, requests in flight finish, and kept-alive connections are closed.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::routing::get;
use axum::Router;
use hyper::service::Service as _;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::relay::Health;
use crate::telemetry::metrics;

pub use crate::relay::health::STALL_LIMIT;

/// How long hyper waits for a request's complete header, counted from when it starts waiting
/// for that request: when the connection opens, and again when the previous response on a
/// kept-alive connection is done (so this is also the idle keep-alive timeout). A probe or a
/// scrape sends its header in one packet; 10 s is ample on any network that can reach us.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection with no byte read or written for this long, and no request being handled, is
/// closed. Backs [`HEADER_READ_TIMEOUT`] where hyper's timer does not run (a response the
/// client does not read, a request body that does not come). Every handler here answers at
/// once, so 20 s without progress is never a legitimate client.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(20);

/// At most this many HTTP connections at once.
///
/// Prometheus, a liveness and a readiness probe need a handful; 256 leaves ample room for
/// several scrapers, retries and connections that are closing, while keeping the listener's
/// file descriptors far below the usual soft limit of 1024 (the relay itself needs two or so
/// per worker for Postgres and Redis, and must be able to reconnect).
///
/// At the cap a new connection is accepted, answered `503` without reading its request (best
/// effort, never blocking) and closed at once, rather than left waiting in the kernel's
/// backlog. Either way descriptors stay bounded (the cap plus the one being refused), but
/// refusing at once means a probe arriving during a flood fails fast and is retried later,
/// instead of queueing behind hundreds of idle sockets, and the backlog never fills with
/// connections whose clients gave up long ago that we would then accept and hold for
/// [`HEADER_READ_TIMEOUT`] each.
pub const MAX_CONNECTIONS: usize = 256;

/// The pause after an accept error that is not the peer's (`EMFILE`, `ENFILE`, `ENOBUFS`...)
/// before accepting again: short, so that the listener recovers soon after descriptors free up,
/// and long enough not to spin.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(250);

/// What a connection over [`MAX_CONNECTIONS`] is sent before it is closed.
const OVER_CAPACITY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\n\
content-type: text/plain; charset=utf-8\r\ncontent-length: 21\r\n\r\ntoo many connections\n";

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

/// Serves the endpoints on `listener` until `shutdown`, then lets the requests in flight finish
/// (every connection is bounded by the timeouts above, so this ends).
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
    accept_loop(listener, app, shutdown).await;
    Ok(())
}

/// Accepts connections until `shutdown`, each served on its own task within
/// [`MAX_CONNECTIONS`]; then waits for those tasks.
async fn accept_loop(listener: tokio::net::TcpListener, app: Router, shutdown: CancellationToken) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let connections = TaskTracker::new();
    // Episodes, each logged once when it starts and once when it ends.
    let mut accept_failures = 0u64;
    let mut refused = 0u64;
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            // The peer gave up before we accepted: nothing to back off from.
            Err(e) if is_peer_error(&e) => continue,
            Err(e) => {
                if accept_failures == 0 {
                    tracing::error!(error = %e, backoff = ?ACCEPT_BACKOFF, "http accept failing; retrying");
                }
                accept_failures += 1;
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
                }
            }
        };
        if accept_failures > 0 {
            tracing::info!(failures = accept_failures, "http accept recovered");
            accept_failures = 0;
        }
        match slots.clone().try_acquire_owned() {
            Ok(slot) => {
                if refused > 0 {
                    tracing::info!(refused, "http connections below the limit again");
                    refused = 0;
                }
                let (app, shutdown) = (app.clone(), shutdown.clone());
                connections.spawn(async move {
                    serve_connection(stream, app, shutdown).await;
                    drop(slot);
                });
            }
            Err(_) => {
                if refused == 0 {
                    tracing::warn!(
                        limit = MAX_CONNECTIONS,
                        "http connection limit reached: refusing new connections with 503"
                    );
                }
                refused += 1;
                // Best effort: whatever fits in the socket buffer now, never waiting.
                let _ = stream.try_write(OVER_CAPACITY);
                drop(stream);
            }
        }
    }
    drop(listener);
    connections.close();
    connections.wait().await;
}

/// Errors of one connection that `accept` reports, rather than of the listener.
fn is_peer_error(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::ConnectionRefused
    )
}

/// Serves one connection until the client or hyper closes it, [`IDLE_TIMEOUT`] passes without
/// progress, or shutdown (which finishes the request in flight, then closes).
async fn serve_connection(stream: TcpStream, app: Router, shutdown: CancellationToken) {
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Tracked {
        inner: stream,
        activity: activity.clone(),
    });
    let router = TowerToHyperService::new(app);
    let handling = activity.clone();
    let service = hyper::service::service_fn(move |request| {
        let busy = InFlight::enter(&handling);
        let response = router.call(request);
        async move {
            let response = response.await;
            drop(busy);
            response
        }
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(io, service);
    tokio::pin!(connection);
    let mut draining = false;
    loop {
        tokio::select! {
            done = connection.as_mut() => {
                if let Err(e) = done {
                    tracing::debug!(error = %e, "http connection ended");
                }
                return;
            }
            _ = activity.idle(IDLE_TIMEOUT) => {
                tracing::debug!(timeout = ?IDLE_TIMEOUT, "closing an idle http connection");
                return;
            }
            _ = shutdown.cancelled(), if !draining => {
                draining = true;
                connection.as_mut().graceful_shutdown();
            }
        }
    }
}

/// When a connection last moved a byte, and how many of its requests are being handled.
struct Activity {
    origin: Instant,
    /// Milliseconds from `origin` to the last read or write that moved data.
    last_ms: AtomicU64,
    in_flight: AtomicUsize,
}

impl Activity {
    fn new() -> Self {
        Activity {
            origin: Instant::now(),
            last_ms: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
        }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// Resolves once no data moved for `limit` and no request is being handled.
    async fn idle(&self, limit: Duration) {
        loop {
            let last = self.origin + Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
            let deadline = last + limit;
            if Instant::now() < deadline {
                tokio::time::sleep_until(deadline).await;
            } else if self.in_flight.load(Ordering::Relaxed) > 0 {
                // A handler is running; its response will count as progress.
                tokio::time::sleep(limit).await;
            } else {
                return;
            }
        }
    }
}

/// A request being handled, for as long as it lives.
struct InFlight(Arc<Activity>);

impl InFlight {
    fn enter(activity: &Arc<Activity>) -> Self {
        activity.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(activity.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.0.touch();
    }
}

/// A socket that records in [`Activity`] every read or write that moved data.
struct Tracked {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
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
    ([(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)], {
        let mut text = s.prometheus.render();
        metrics::render_queue_sides(&mut text);
        text
    })
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
