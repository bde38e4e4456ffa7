//! Restarts a relay task that panicked, so that a bug in a dependency or in the relay cannot
//! leave a silent zombie: a process that stays up, answers `/healthz`, and relays nothing.
//!
//! A panic unwinds the task's future; a batch in hand is dropped with its transaction, which
//! rolls back (its rows are claimed again). The panic is logged and counted
//! (`jobrelay_task_panics_total{task}`), the task starts again after a backoff, and
//! [`Health::liveness`] fails once tasks panic [`super::health::PANIC_LIMIT`] times in a row
//! without a batch completing in between, so that Kubernetes restarts the process.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::FutureExt as _;
use tokio_util::sync::CancellationToken;

use super::health::Health;
use crate::backoff::Backoff;
use crate::telemetry::panic;

/// A run this long without a panic resets the restart backoff.
const STABLE_RUN: Duration = Duration::from_secs(60);

/// Runs `make()` until it returns; each time it panics, records it in `health` and runs a new
/// `make()` after a backoff (100 ms doubling to 30 s), unless `shutdown` fires first.
pub(crate) async fn supervised<F, Fut>(
    task: &'static str,
    health: Arc<Health>,
    shutdown: CancellationToken,
    mut make: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut backoff = Backoff::transient();
    loop {
        let started = Instant::now();
        let Err(payload) = AssertUnwindSafe(make()).catch_unwind().await else {
            return;
        };
        health.panicked(task, &panic::message(payload.as_ref()));
        if started.elapsed() >= STABLE_RUN {
            backoff.reset();
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(backoff.next_delay()) => {}
        }
    }
}
