//! The one-shot recovery sweep (docs/guarantees.md#the-sweep).

use std::time::Duration;

use super::batch::Batcher;
use crate::backoff::Backoff;
use crate::error::Result;
use crate::report::Report;
use crate::sink::JobSink;

/// Transient failures a sweep rides out (with backoff) before it gives up.
pub const SWEEP_RETRIES: u32 = 5;

/// Relays every claimable row created at least `older_than` ago, batch after batch, until
/// none is left. Rows refused by Redis are handed back (or dead-lettered) as by the daemon and
/// counted as failed. A transient failure is retried up to [`SWEEP_RETRIES`] times; after that
/// the sweep stops with the error and the report so far.
pub async fn sweep<S: JobSink>(
    batcher: &Batcher<S>,
    batch_size: usize,
    older_than: Duration,
) -> (Report, Result<()>) {
    let mut total = Report::default();
    let mut backoff = Backoff::transient();
    loop {
        match batcher.run_once(Some(older_than)).await {
            Ok(report) if report.interrupted.is_some() => {
                // Part of the batch landed (committed), the rest was kept: ride it out.
                total.add(&report);
                if backoff.failures() >= SWEEP_RETRIES {
                    let cut = report.interrupted.expect("checked");
                    let e = crate::error::Error::NotWritable {
                        dependency: cut.dependency,
                        reason: cut.reason,
                        detail: cut.error,
                    };
                    return (total, Err(e));
                }
                let delay = backoff.next_delay();
                tracing::warn!(kept = report.kept, retry_in = ?delay, "sweep batch partly acknowledged; retrying the rest");
                tokio::time::sleep(delay).await;
            }
            Ok(report) => {
                backoff.reset();
                total.add(&report);
                if !report.more && (report.claimed as usize) < batch_size {
                    return (total, Ok(()));
                }
            }
            Err(e) => {
                if backoff.failures() >= SWEEP_RETRIES {
                    return (total, Err(e));
                }
                let delay = backoff.next_delay();
                tracing::warn!(error = %e, retry_in = ?delay, "sweep batch failed; retrying");
                tokio::time::sleep(delay).await;
            }
        }
    }
}
