//! The layout's housekeeping, run by the daemon every [`REPAIR_INTERVAL`]: in the conveyor
//! layout, children and heirs whose push raced their parent's close are set free
//! ([`crate::Enqueuer::repair`]).

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::broker::connection::{self, RedisConnection, RedisEndpoint};
use crate::broker::enqueue::Enqueuer;
use crate::telemetry::events::{self, Event as _};

/// How often the housekeeping runs.
pub const REPAIR_INTERVAL: Duration = Duration::from_secs(1);
/// How long after a push into a running job's lists the relay first looks whether the job's
/// close stranded it (a close takes a few round trips).
pub const REPAIR_GRACE: Duration = Duration::from_millis(500);
/// Watched jobs looked at per call.
pub const REPAIR_LIMIT: usize = 100;

/// Runs [`Enqueuer::repair`] every [`REPAIR_INTERVAL`] until `shutdown` (at once again when a
/// call hit its limit). Failures back off quietly: the workers report Redis outages.
pub async fn repair(
    enqueuer: Enqueuer,
    client: RedisEndpoint,
    timeout: Duration,
    shutdown: CancellationToken,
) {
    let mut backoff = Backoff::transient();
    let mut con = None;
    while !shutdown.is_cancelled() {
        let pause = match step(&enqueuer, &client, &mut con, timeout).await {
            Ok(n) => {
                backoff.reset();
                events::LateJobsRepaired { jobs: n }.emit();
                if n as usize >= REPAIR_LIMIT {
                    Duration::ZERO
                } else {
                    REPAIR_INTERVAL
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "layout housekeeping failed");
                con = None;
                backoff.next_delay().max(REPAIR_INTERVAL)
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(pause) => {}
        }
    }
}

/// One call, on `con` (connected first if `None`).
async fn step(
    enqueuer: &Enqueuer,
    client: &RedisEndpoint,
    con: &mut Option<RedisConnection>,
    timeout: Duration,
) -> crate::error::Result<u64> {
    let con = match con {
        Some(c) => c,
        None => con.insert(connection::connect(client, timeout).await?),
    };
    crate::error::within(
        crate::error::Dependency::Redis,
        "redis housekeeping",
        timeout,
        enqueuer.repair(con, REPAIR_GRACE, REPAIR_LIMIT),
    )
    .await
}
