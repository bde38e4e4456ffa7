//! The relay the stages run: the binary's wiring (one pool, one Redis connection per worker),
//! on a runtime of its own so that the benchmark's producers and consumer do not queue its
//! tasks (in production the relay is a process of its own).

use std::sync::Arc;
use std::time::Duration;

use jobrelay::broker::redis_sink::RedisSink;
use jobrelay::config::{DEFAULT_CLAIM_SLOTS, STATEMENT_TIMEOUT};
use jobrelay::relay::{self, BatchSettings, Health, RelaySettings};
use jobrelay::{Enqueuer, TableName};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::support::sandbox::Sandbox;
use super::{cpu, timed_sink, Args, BoxError};

/// A relay started by [`start_relay`].
pub struct RunningRelay {
    tracker: TaskTracker,
    shutdown: CancellationToken,
    runtime: tokio::runtime::Runtime,
}

/// Starts the relay with `args`' workers, batch size and layout; with `push_times`, it notes
/// when each job's push began and ended.
pub async fn start_relay(
    sb: &Sandbox,
    args: &Args,
    push_times: Option<timed_sink::PushTimes>,
) -> Result<RunningRelay, BoxError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(cpu::RELAY_THREAD)
        .enable_all()
        .build()?;
    let opts = jobrelay::config::session_settings(sb.url(None).parse()?);
    let pool = jobrelay::db::lazy_pool(opts, args.workers as u32 + 2);
    let enqueuer =
        Enqueuer::new(sb.namespace().to_owned(), Duration::from_secs(900)).with_layout(args.layout);
    let mut sinks = Vec::new();
    for _ in 0..args.workers {
        // Connected on the relay's runtime, so that the connection's driver task runs there.
        let client = sb.redis().clone();
        let con = runtime
            .spawn(async move {
                jobrelay::broker::connection::connect(&client, Duration::from_secs(5)).await
            })
            .await??;
        sinks.push(timed_sink::TimedSink {
            inner: RedisSink::new(enqueuer.clone(), con, Duration::from_secs(5)),
            times: push_times.clone(),
        });
    }
    let settings = RelaySettings {
        table: TableName::default(),
        batch: BatchSettings {
            batch_size: args.batch_size,
            max_attempts: 25,
            statement_timeout: STATEMENT_TIMEOUT,
            // As the daemon: its batches take a fleet-wide claim slot.
            claim_slots: Some(DEFAULT_CLAIM_SLOTS as u32),
            prepared_statements: args.prepared_statements,
            ..BatchSettings::default()
        },
        poll_interval: Duration::from_secs(1),
    };
    let tracker = TaskTracker::new();
    let shutdown = CancellationToken::new();
    {
        let _on_relay_runtime = runtime.enter();
        relay::spawn(
            &tracker,
            &settings,
            pool,
            sinks,
            Arc::new(Health::default()),
            shutdown.clone(),
        );
    }
    tracker.close();
    Ok(RunningRelay {
        tracker,
        shutdown,
        runtime,
    })
}

impl RunningRelay {
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.tracker.wait().await;
        self.runtime.shutdown_background();
    }
}
