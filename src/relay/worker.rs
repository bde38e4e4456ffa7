//! The relay loop of one worker (docs/guarantees.md#the-relay-step).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::batch::Batcher;
use super::health::{Dependency, Health};
use super::slots::SlotGate;
use crate::backoff::Backoff;
use crate::relay::wakeup::lock::Activity;
use crate::sink::JobSink;
use crate::telemetry::redact;

/// Repeats batches until `shutdown`: a full batch (`batch_size` rows, or stopped at the byte
/// cap) loops at once, and sends one more waiting worker to claim ([`Activity::recruit`]);
/// otherwise the worker waits for a wake-up (which one waiting worker takes,
/// [`Activity::take_wake`]), another's full batch, or `poll_interval`. A transient failure backs off (100 ms doubling to 30 s, with
/// jitter), cut short when [`Health`] sees a dependency recover. While the fleet's claim slots
/// are all taken, the relay's workers wait at `slots` (one of them asks; a worker whose full
/// batch held a slot keeps its turn). The batch in hand
/// when `shutdown` fires is finished, not abandoned.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn work<S: JobSink>(
    batcher: Arc<Batcher<S>>,
    batch_size: usize,
    poll_interval: Duration,
    mut wake: watch::Receiver<u64>,
    activity: Arc<Activity>,
    slots: Arc<SlotGate>,
    health: Arc<Health>,
    shutdown: CancellationToken,
) {
    let mut backoff = Backoff::transient();
    let mut recovered = health.recoveries();
    // The last batch held a claim slot and came back full: the next one goes at once.
    let mut turn = false;
    'work: while !shutdown.is_cancelled() {
        health.beat();
        wake.borrow_and_update();
        recovered.borrow_and_update();
        let Some(pass) = slots.admit(&shutdown, std::mem::take(&mut turn)).await else {
            break;
        };
        let started = Instant::now();
        let idle_wait = match batcher.run_once(None).await {
            Ok(report) if report.no_slot => {
                // The fleet's claim slots are busy: their holders drain the table. This relay
                // looks again soon (a slot taken by another relay's idle poll is free in a
                // millisecond), then less and less often, up to the poll interval: not at every
                // wake-up, which comes every millisecond while this relay holds the wake-up
                // lock. Its other workers do not ask meanwhile.
                tracing::debug!("no claim slot free");
                health.batch_completed();
                health.ok_at(Dependency::Postgres, started);
                backoff.reset();
                pass.none_free(poll_interval);
                continue;
            }
            Ok(report) => {
                pass.got_one();
                health.batch_completed();
                if report.claimed > 0 {
                    activity.mark();
                }
                health.ok_at(Dependency::Postgres, started);
                if report.handed_back > 0 {
                    health.wrote_at(Dependency::Postgres, started);
                }
                health.table_present_at(started);
                if let Some(cut) = &report.unsettled {
                    // The failed rows could not be handed back (a full disk): the acknowledged
                    // ones were deleted, the rest stay pending. Go on while batches deliver.
                    health.interrupted_at(cut, started);
                }
                if let Some(cut) = &report.interrupted {
                    // Not a sign of recovery, though part of it was acknowledged: with memory
                    // hovering at maxmemory, every batch may get one call through.
                    // Redis acknowledged part of the batch (committed) and failed the rest
                    // (kept): an outage like any other for the rows behind.
                    health.interrupted_at(cut, started);
                }
                let stuck = report
                    .unsettled
                    .as_ref()
                    .filter(|_| report.delivered() == 0);
                if let Some(cut) = report.interrupted.as_ref().or(stuck) {
                    let delay = backoff.next_delay();
                    tracing::debug!(error = %cut, kept = report.kept, retry_in = ?delay,
                        "batch partly acknowledged; the rest kept; backing off");
                    delay
                } else {
                    if report.delivered() > 0 || report.refused > 0 {
                        // Redis answered the push.
                        health.ok_at(Dependency::Redis, started);
                    }
                    backoff.reset();
                    if report.more || report.claimed as usize >= batch_size {
                        activity.recruit();
                        turn = true;
                        continue;
                    }
                    poll_interval
                }
            }
            Err(e) => {
                health.failed_with_at(&e, started);
                let delay = backoff.next_delay();
                tracing::debug!(error = %redact::scrub(&e.to_string()), retry_in = ?delay,
                    "batch rolled back; backing off");
                delay
            }
        };
        // Between batches, a worker that can be woken tells the wake-up lock's poll it waits.
        let idle = backoff.failures() == 0;
        let _waiting = idle.then(|| activity.waiting());
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break 'work,
                _ = tokio::time::sleep(idle_wait) => {
                    // One idle poll per relay and interval ([`Activity::take_idle_poll`]).
                    if idle && !activity.take_idle_poll(poll_interval) {
                        continue;
                    }
                }
                // Another worker's batch came back full: rows wait.
                _ = activity.recruited(), if idle => {}
                // The probe saw a dependency come back: no need to sit out the rest of the
                // backoff.
                _ = recovered.changed(), if !idle => {}
                changed = wake.changed(), if idle => {
                    if changed.is_err() {
                        // No listener any more: fall back to polling, every worker.
                        tokio::select! {
                            _ = shutdown.cancelled() => break 'work,
                            _ = tokio::time::sleep(idle_wait) => {}
                        }
                    } else if !activity.take_wake(*wake.borrow_and_update()) {
                        // Another worker took this wake-up.
                        continue;
                    }
                }
            }
            break;
        }
    }
}
