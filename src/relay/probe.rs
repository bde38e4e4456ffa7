//! The daemon's probe task: keeps readiness and the backlog gauges current while workers idle.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::health::{Dependency, Health};
use crate::redis_conn::RedisConnection;
use crate::table::TableName;
use crate::telemetry::metrics;

/// How often dependencies are pinged (readiness follows within about this much).
pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// How often the backlog gauges are sampled.
pub const BACKLOG_INTERVAL: Duration = Duration::from_secs(5);

/// Pings Postgres (and checks the outbox table exists) and Redis every [`PROBE_INTERVAL`],
/// samples the backlog every [`BACKLOG_INTERVAL`], until `shutdown`.
pub async fn probe(
    pool: PgPool,
    redis: redis::Client,
    table: TableName,
    health: Arc<Health>,
    shutdown: CancellationToken,
) {
    let schema_sql = format!("SELECT 1 FROM {} LIMIT 0", table.pending());
    let backlog_sql = format!(
        "SELECT (SELECT count(*) FROM {t}),
                (SELECT COALESCE(EXTRACT(EPOCH FROM now()
                     - min(created_at) FILTER (WHERE isfinite(created_at)))::float8, 0) FROM {t}),
                (SELECT count(*) FROM {d})",
        t = table.pending(),
        d = table.dead()
    );
    let mut last_backlog: Option<Instant> = None;
    let mut con: Option<RedisConnection> = None;
    let mut ticker = tokio::time::interval(PROBE_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = ticker.tick() => {}
        }
        // One round of checks; shutdown does not wait for a ping to a dependency that hangs.
        let round = async {
            let sent = Instant::now();
            let pg =
                tokio::time::timeout(PROBE_INTERVAL, sqlx::query(&schema_sql).execute(&pool)).await;
            match pg {
                Ok(Ok(_)) => {
                    health.ok_at(Dependency::Postgres, sent);
                    health.set_schema(true);
                }
                Ok(Err(sqlx::Error::Database(e))) if e.code().as_deref() == Some("42P01") => {
                    health.ok_at(Dependency::Postgres, sent);
                    health.set_schema(false);
                    tracing::debug!(table = %table, "outbox table missing: run `jobrelay migrate`");
                }
                Ok(Err(e)) => health.failed_at(Dependency::Postgres, sent, &e),
                Err(_) => health.failed_at(Dependency::Postgres, sent, &"ping timed out"),
            }
            let sent = Instant::now();
            // Connected lazily (and kept): the probe runs from the start, Redis up or not.
            if con.is_none() {
                match crate::redis_conn::connect(&redis, PROBE_INTERVAL).await {
                    Ok(c) => con = Some(c),
                    Err(e) => health.failed_at(Dependency::Redis, sent, &e),
                }
            }
            if let Some(c) = con.as_mut() {
                match tokio::time::timeout(PROBE_INTERVAL, writable(c)).await {
                    Ok(Ok(())) => health.ok_at(Dependency::Redis, sent),
                    Ok(Err(e)) => health.failed_at(Dependency::Redis, sent, &e),
                    Err(_) => health.failed_at(Dependency::Redis, sent, &"ping timed out"),
                }
            }
            if health.is_up(Dependency::Postgres)
                && last_backlog.is_none_or(|t| t.elapsed() >= BACKLOG_INTERVAL)
            {
                last_backlog = Some(Instant::now());
                let sample = tokio::time::timeout(
                    BACKLOG_INTERVAL,
                    sqlx::query_as::<_, (i64, f64, i64)>(&backlog_sql).fetch_one(&pool),
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

/// Whether Redis would take the relay's writes: it answers `PING` (refused while it is
/// `LOADING`, or `MASTERDOWN` on a stale replica) and `ROLE` says master. A read-only replica
/// answers `PING` but refuses every push with `READONLY`; reporting it as up would make the
/// probe and the workers log an outage and a recovery every second.
async fn writable(con: &mut RedisConnection) -> redis::RedisResult<()> {
    let (_pong, role): (String, Vec<redis::Value>) = redis::pipe()
        .cmd("PING")
        .cmd("ROLE")
        .query_async(con)
        .await?;
    let role = role
        .first()
        .and_then(|v| redis::from_redis_value::<String>(v).ok());
    match role.as_deref() {
        Some("master") => Ok(()),
        other => Err(redis::RedisError::from((
            redis::ErrorKind::ReadOnly,
            "not a master: writes are refused",
            format!("ROLE answered {other:?}"),
        ))),
    }
}
