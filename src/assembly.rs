//! The daemon's relay, assembled in one call: the relay's claim loop ([`crate::relay`]) with
//! the broker's Redis sinks and probe ([`crate::broker`]) plugged into its seam
//! ([`crate::sink`]): the probe, one Redis connection and sink per worker, the layout's
//! housekeeping, the watch of the queues' Redis side, the workers, the notification listener and the wake-up lock. The relay never
//! builds its sinks; this module is the one place that names both sides.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backoff::Backoff;
use crate::broker::connection::{self, RedisConnection, RedisEndpoint};
use crate::broker::enqueue::Enqueuer;
use crate::broker::fed_queues::FedQueues;
use crate::broker::redis_probe::RedisProbe;
#[cfg(feature = "daemon")]
use crate::broker::redis_side;
use crate::broker::redis_sink::RedisSink;
use crate::broker::repair;
use crate::broker::safety::RedisSafety;
use crate::relay::health::{Dependency, Health};
use crate::relay::{probe, supervise, RelaySettings, Wakeup};

/// What the daemon's relay is made of.
#[derive(Debug, Clone)]
pub struct Assembly {
    /// The table, the batches, the poll interval.
    pub settings: RelaySettings,
    /// Claim loops, each with its own Redis connection.
    pub workers: usize,
    /// The relay's Postgres pool: the workers' and the probe's connections.
    pub pool: PgPool,
    /// The listener and the wake-up lock (connections of their own).
    pub wakeup: Wakeup,
    /// The Redis server, Sentinel group or Cluster.
    pub redis: RedisEndpoint,
    /// The layout, namespace, marker TTL and size limits.
    pub enqueuer: Enqueuer,
    /// Bound on one push while rows are locked (and on connecting).
    pub push_timeout: Duration,
    /// What the sinks and the probe ask of Redis (eviction, replicas).
    pub safety: RedisSafety,
    /// Watch the Redis side of the queues fed this recently (`None`: no watch; only with the
    /// `daemon` feature).
    pub consumer_window: Option<Duration>,
}

impl Assembly {
    /// Starts the probe, connects one Redis connection per worker (an outage at start-up is
    /// waited out with backoff, and reported through `health`), then starts the workers, the
    /// listener and the wake-up lock: every task on `tracker`, supervised, until `shutdown`.
    /// Returns once the workers run, or early if `shutdown` fires first.
    pub async fn start(
        self,
        tracker: &TaskTracker,
        health: Arc<Health>,
        shutdown: CancellationToken,
    ) {
        let (pool, table) = (self.pool.clone(), self.settings.table.clone());
        let redis_probe = RedisProbe::new(
            self.redis.clone(),
            self.enqueuer.namespace(),
            probe::PROBE_INTERVAL,
        )
        .with_safety(self.safety);
        let (h, stop) = (health.clone(), shutdown.clone());
        let needs = self.enqueuer.claim_needs();
        tracker.spawn(supervise::supervised(
            "probe",
            health.clone(),
            shutdown.clone(),
            move || {
                let probe = probe::Probe::new(
                    pool.clone(),
                    &table,
                    probe::PROBE_INTERVAL,
                    redis_probe.clone(),
                );
                probe::probe(probe, table.clone(), needs, h.clone(), stop.clone())
            },
        ));
        if self.enqueuer.needs_repair() {
            let (e, c, t, stop) = (
                self.enqueuer.clone(),
                self.redis.clone(),
                self.push_timeout,
                shutdown.clone(),
            );
            tracker.spawn(supervise::supervised(
                "repair",
                health.clone(),
                shutdown.clone(),
                move || repair::repair(e.clone(), c.clone(), t, stop.clone()),
            ));
        }
        let fed = Arc::new(FedQueues::default());
        #[cfg(feature = "daemon")]
        if let Some(window) = self.consumer_window {
            let w = redis_side::Watch {
                redis: self.redis.clone(),
                layout: self.enqueuer.layout(),
                namespace: self.enqueuer.namespace().to_owned(),
                window,
                timeout: self.push_timeout,
            };
            let (fed, stop) = (fed.clone(), shutdown.clone());
            tracker.spawn(supervise::supervised(
                "redis-side",
                health.clone(),
                shutdown.clone(),
                move || redis_side::watch(w.clone(), fed.clone(), stop.clone()),
            ));
        }
        let mut sinks = Vec::with_capacity(self.workers);
        for _ in 0..self.workers {
            // One connection per worker: a stalled push holds up only its own worker.
            let Some(con) = connect(&self.redis, self.push_timeout, &health, &shutdown).await
            else {
                return;
            };
            sinks.push(
                RedisSink::new(self.enqueuer.clone(), con, self.push_timeout)
                    .with_safety(self.safety)
                    .noting_fed(fed.clone()),
            );
        }
        crate::relay::spawn_with(
            tracker,
            &self.settings,
            &self.wakeup,
            self.pool,
            sinks,
            health,
            shutdown,
        );
    }
}

/// Connects to Redis, retrying with backoff until `shutdown`.
async fn connect(
    client: &RedisEndpoint,
    timeout: Duration,
    health: &Health,
    shutdown: &CancellationToken,
) -> Option<RedisConnection> {
    let mut backoff = Backoff::transient();
    loop {
        match connection::connect(client, timeout).await {
            Ok(con) => return Some(con),
            Err(e) => health.failed(Dependency::Redis, crate::error::redis_reason(&e), &e),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            _ = tokio::time::sleep(backoff.next_delay()) => {}
        }
    }
}
