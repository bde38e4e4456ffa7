//! The dependency probe: one round of checks that `/readyz` (through the daemon's probe task)
//! and `jobrelay check` both run, so the two cannot disagree.
//!
//! - Postgres: a query on the outbox table answers (or says the table is missing), and the
//!   session could write: not a hot standby, not read-only by default. A read-only Postgres
//!   answers `SELECT` while it refuses every claim, like a Redis at `maxmemory` answers `PING`.
//! - Redis: a write (`SET <ns>jobrelay:probe ... PX`) and `ROLE` = master. A `PING` is not
//!   enough: a Redis at `maxmemory` (`OOM`) or a read-only replica answers it while it refuses
//!   every push, and a probe that said "up" would end each outage the workers begin, logging
//!   one outage and one recovery per second.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::health::{Dependency, Health};
use crate::error::{Error, Reason, Result};
use crate::redis::connection::{RedisConnection, RedisEndpoint};
use crate::table::TableName;
use crate::telemetry::metrics;

/// How often the daemon probes (readiness follows within about this much).
pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// How often the backlog gauges are sampled.
pub const BACKLOG_INTERVAL: Duration = Duration::from_secs(5);

/// What one round of checks found.
#[derive(Debug)]
pub struct Findings {
    /// When the Postgres check was sent.
    pub postgres_sent: Instant,
    /// Postgres answered (`Ok(true)`: the table exists; `Ok(false)`: it does not), or why not.
    pub postgres: Result<bool>,
    /// When the Redis check was sent.
    pub redis_sent: Instant,
    /// Redis took a write as a master, or why not.
    pub redis: Result<()>,
}

impl Findings {
    /// Reports the findings to `health` (which logs episodes once).
    pub fn report(&self, health: &Health) {
        match &self.postgres {
            Ok(present) => {
                health.ok_at(Dependency::Postgres, self.postgres_sent);
                if *present {
                    health.table_present_at(self.postgres_sent);
                } else {
                    health.table_missing_at(self.postgres_sent, &"relation does not exist");
                }
            }
            Err(e) => health.failed_with_at(e, self.postgres_sent),
        }
        match &self.redis {
            Ok(()) => health.ok_at(Dependency::Redis, self.redis_sent),
            Err(e) => health.failed_with_at(e, self.redis_sent),
        }
    }
}

/// The checks, with the Redis connection they keep between rounds.
pub struct Probe {
    pool: PgPool,
    redis: RedisEndpoint,
    con: Option<RedisConnection>,
    table_sql: String,
    probe_key: String,
    timeout: Duration,
}

impl Probe {
    /// A probe of `table` on `pool` and of Redis through `redis`, writing its key under
    /// `namespace`; each check is bounded by `timeout`.
    pub fn new(
        pool: PgPool,
        redis: impl Into<RedisEndpoint>,
        table: &TableName,
        namespace: &str,
        timeout: Duration,
    ) -> Self {
        Probe {
            pool,
            redis: redis.into(),
            con: None,
            // Fails with undefined_table when the outbox is missing; says whether this
            // session could write (not a hot standby, not a read-only default).
            table_sql: format!(
                "SELECT pg_is_in_recovery(), current_setting('transaction_read_only') = 'on'
                 FROM (SELECT 1 FROM {} LIMIT 0) AS present RIGHT JOIN (SELECT 1) AS one ON true",
                table.pending()
            ),
            probe_key: format!("{namespace}jobrelay:probe"),
            timeout,
        }
    }

    /// One round of checks.
    pub async fn run_once(&mut self) -> Findings {
        let postgres_sent = Instant::now();
        let check = async {
            let mut conn = self.pool.acquire().await?;
            let found = sqlx::query_as::<_, (bool, bool)>(&self.table_sql)
                .fetch_one(&mut *conn)
                .await;
            if matches!(found, Ok((a, b)) if a || b) {
                // A read-only session stays so: let the pool open a new one next time.
                let _ = conn.close().await;
            }
            found
        };
        let postgres = match tokio::time::timeout(self.timeout, check).await {
            Err(_) => Err(Error::Timeout {
                what: "postgres probe",
                after: self.timeout,
            }),
            Ok(Ok((false, false))) => Ok(true),
            Ok(Ok((standby, _))) => Err(Error::NotWritable {
                dependency: Dependency::Postgres,
                reason: Reason::ReadOnly,
                detail: if standby {
                    "a hot standby (pg_is_in_recovery)".to_owned()
                } else {
                    "sessions are read-only (default_transaction_read_only)".to_owned()
                },
            }),
            Ok(Err(e)) => {
                let e = Error::Database(e);
                if e.reason() == Reason::TableMissing && missing_relation(&e) {
                    Ok(false)
                } else {
                    Err(e)
                }
            }
        };
        let redis_sent = Instant::now();
        let redis = self.redis_writable().await;
        Findings {
            postgres_sent,
            postgres,
            redis_sent,
            redis,
        }
    }

    async fn redis_writable(&mut self) -> Result<()> {
        let timeout = self.timeout;
        let timed_out = || Error::Timeout {
            what: "redis probe",
            after: timeout,
        };
        // Connected lazily (and kept): the probe runs from the start, Redis up or not.
        if self.con.is_none() {
            let con = tokio::time::timeout(
                timeout,
                crate::redis::connection::connect(&self.redis, timeout),
            )
            .await
            .map_err(|_| timed_out())??;
            self.con = Some(con);
        }
        let con = self.con.as_mut().expect("connected above");
        let found =
            tokio::time::timeout(timeout, crate::redis::probe::writable(con, &self.probe_key))
                .await
                .map_err(|_| timed_out())?
                .map_err(Error::Redis);
        if matches!(&found, Err(e) if e.reason() == Reason::ReadOnly) {
            // A replica (the primary moved, or the name now points elsewhere): the next round
            // connects anew, as the workers do.
            con.reconnect();
        }
        found
    }
}

/// Whether the error says the relation itself is missing (not the schema or the database,
/// which are as much a reason not to be ready but are reported as Postgres failures).
fn missing_relation(e: &Error) -> bool {
    matches!(e, Error::Database(sqlx::Error::Database(db)) if db.code().as_deref() == Some("42P01"))
}

/// The daemon's probe task: runs the [`Probe`] every [`PROBE_INTERVAL`] and reports to
/// `health`; samples the backlog every [`BACKLOG_INTERVAL`], until `shutdown`.
pub async fn probe(
    mut probe: Probe,
    table: TableName,
    health: Arc<Health>,
    shutdown: CancellationToken,
) {
    let backlog_sql = format!(
        "SELECT (SELECT count(*) FROM {t}),
                (SELECT COALESCE(EXTRACT(EPOCH FROM now()
                     - min(created_at) FILTER (WHERE isfinite(created_at)))::float8, 0) FROM {t}),
                (SELECT count(*) FROM {d})",
        t = table.pending(),
        d = table.dead()
    );
    let mut last_backlog: Option<Instant> = None;
    let mut ticker = tokio::time::interval(PROBE_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = ticker.tick() => {}
        }
        // One round of checks; shutdown does not wait for a ping to a dependency that hangs.
        let round = async {
            probe.run_once().await.report(&health);
            if health.is_up(Dependency::Postgres)
                && health.table_present()
                && last_backlog.is_none_or(|t| t.elapsed() >= BACKLOG_INTERVAL)
            {
                last_backlog = Some(Instant::now());
                let sample = tokio::time::timeout(
                    BACKLOG_INTERVAL,
                    sqlx::query_as::<_, (i64, f64, i64)>(&backlog_sql).fetch_one(&probe.pool),
                )
                .await;
                if let Ok(Ok((pending, oldest, dead))) = sample {
                    metrics::backlog(pending, oldest, dead);
                }
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            () = round => {}
        }
    }
}
