//! The dependency probe: one round of checks that `/readyz` (through the daemon's probe task)
//! and `jobrelay check` both run, so the two cannot disagree.
//!
//! - Postgres: a query on the outbox table answers (or says the table is missing), and the
//!   session could write: not a hot standby, not read-only by default. A read-only Postgres
//!   answers `SELECT` while it refuses every claim, like a Redis at `maxmemory` answers `PING`.
//! - Postgres locks: before it touches the table, the probe looks in `pg_locks` for another
//!   session holding a lock on the outbox (or its dead letters) that blocks the relay's claims
//!   (`LOCK TABLE ... IN ACCESS EXCLUSIVE MODE`, `ALTER TABLE`, `VACUUM FULL`, `CREATE INDEX`
//!   without `CONCURRENTLY`), for longer than [`LOCK_REPORT_AFTER`]: a `lock wait` naming the
//!   holder's pid, not a probe that times out behind it.
//! - The sink's endpoint: whatever its [`SinkProbe`] asks (for Redis, a write as a master that
//!   keeps its keys: the broker's `RedisProbe`). Even a write that succeeds may come with every
//!   batch failing (memory hovering at the limit, a script denied by an ACL): so the probe's
//!   success never ends an episode a failed push began; only a push does ([`Health`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::{PgPool, Row as _};
use tokio_util::sync::CancellationToken;

use super::backlog::Backlog;
pub use super::backlog::{HeldWatch, HorizonWatch};
use super::health::{Dependency, Health};
use crate::error::{within, Error, LockHolder, Reason, Result};
use crate::sink::{ClaimNeeds, SinkProbe};
use crate::table::TableName;
use crate::telemetry::events::Event as _;

/// How often the daemon probes (readiness follows within about this much).
pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// How often the backlog gauges are sampled.
pub const BACKLOG_INTERVAL: Duration = Duration::from_secs(5);
/// A lock that blocks the claims is reported once its holder's transaction has been open
/// this long: a migration's brief `ALTER TABLE` is not an outage.
pub const LOCK_REPORT_AFTER: Duration = Duration::from_secs(1);
pub use super::backlog::{Horizon, HORIZON_WARN_AFTER};

/// What one round of checks found.
#[derive(Debug)]
pub struct Findings {
    /// When the Postgres check was sent.
    pub postgres_sent: Instant,
    /// Postgres answered (`Ok(true)`: the table exists; `Ok(false)`: it does not), or why not.
    pub postgres: Result<bool>,
    /// When the endpoint's check was sent.
    pub endpoint_sent: Instant,
    /// The sink's endpoint takes writes (and what it says of itself), or why not.
    pub endpoint: Result<String>,
}

impl Findings {
    /// Reports the findings to `health` (which logs episodes once).
    pub fn report(&self, health: &Health) {
        match &self.postgres {
            Ok(present) => {
                health.check_ok_at(Dependency::Postgres, self.postgres_sent);
                if *present {
                    health.table_present_at(self.postgres_sent);
                } else {
                    health.table_missing_at(self.postgres_sent, &"relation does not exist");
                }
            }
            Err(e) => health.check_failed_with_at(e, self.postgres_sent),
        }
        match &self.endpoint {
            Ok(_) => health.check_ok_at(Dependency::Redis, self.endpoint_sent),
            Err(e) => health.check_failed_with_at(e, self.endpoint_sent),
        }
    }
}

/// The checks: of Postgres and the outbox here, of the sink's endpoint through `endpoint`.
pub struct Probe<E> {
    pool: PgPool,
    endpoint: E,
    table_sql: String,
    /// The outbox and its dead letters, quoted.
    tables: (String, String),
    /// [`LOCK_SQL`] for them, with its `$1` and `$2` as literals: sent with the simple query
    /// protocol (one round trip, whatever pooler is in between).
    lock_sql: String,
    timeout: Duration,
}

/// Another session's granted lock on `$1` or `$2` that conflicts with the claims' `ROW
/// EXCLUSIVE` (and the probe's `ACCESS SHARE`), the oldest transaction's first; its age is
/// unknown for a prepared transaction, or a role whose statistics the relay's may not read.
/// Touches neither table, so it never waits for the lock itself.
const LOCK_SQL: &str = "
    SELECT l.relation::regclass::text, l.pid, l.mode,
           EXTRACT(EPOCH FROM now() - a.xact_start)::float8, a.state
    FROM pg_locks l
    LEFT JOIN LATERAL pg_stat_get_activity(l.pid) a ON l.pid IS NOT NULL
    WHERE l.locktype = 'relation' AND l.granted
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.relation IN (to_regclass($1), to_regclass($2))
      AND l.mode IN ('ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock')
      AND l.pid IS DISTINCT FROM pg_backend_pid()
    ORDER BY a.xact_start NULLS FIRST
    LIMIT 1";

/// The oldest of what holds the database's xmin horizon back (see [`Horizon`]): sessions of
/// this database with a snapshot (`backend_xmin`) or a transaction id (`backend_xid`: a writer
/// idle in its transaction holds the horizon without a snapshot), standbys reporting theirs
/// (`hot_standby_feedback`), prepared transactions, replication slots.
///
/// Judged by what a session holds, not by how long its transaction has been open: a session
/// is timed from when its snapshot can have been taken, its running statement's start while
/// it is `active` (a `READ COMMITTED` transaction takes a new snapshot per statement, and one
/// open for minutes that runs a statement now holds nothing old), its transaction's start
/// otherwise (a snapshot kept between statements: `REPEATABLE READ`, a cursor; or only a
/// transaction id). [`HorizonWatch`] keeps timing a holder whose horizon stays the same from
/// sample to sample, so a `REPEATABLE READ` transaction's later statements do not reset it.
///
/// The relay's own sessions (this session's `application_name`, `jobrelay` unless the URL
/// says otherwise: every relay's of the fleet) are never named: their transactions are bounded
/// by their statement and idle-in-transaction timeouts, and the wake-up lock's transaction,
/// open while the relay is awake, holds neither a transaction id nor, between its statements,
/// a snapshot (issue 34: it was named as the holder, `open for 179s`, with `xids: 0`).
const HORIZON_SQL: &str = "
    SELECT kind, pid, seconds, xids, detail, horizon FROM (
        SELECT CASE WHEN backend_type = 'walsender' THEN 'standby feedback'
                    ELSE 'transaction' END AS kind,
               pid,
               EXTRACT(EPOCH FROM now() - CASE WHEN state = 'active' AND backend_xmin IS NOT NULL
                                               THEN query_start ELSE xact_start END)::float8
                   AS seconds,
               greatest(age(backend_xmin), age(backend_xid))::int8 AS xids,
               concat_ws(', ', state, 'application_name=' || quote_literal(application_name),
                         'user=' || usename) AS detail,
               COALESCE(backend_xmin, backend_xid)::text AS horizon
        FROM pg_stat_activity
        WHERE (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
          AND pid <> pg_backend_pid()
          AND backend_type <> 'autovacuum worker'
          AND (datname = current_database() OR backend_type = 'walsender')
          AND (application_name IS DISTINCT FROM current_setting('application_name')
               OR current_setting('application_name') = '' OR backend_type = 'walsender')
        UNION ALL
        SELECT 'prepared transaction', NULL, EXTRACT(EPOCH FROM now() - prepared)::float8,
               age(transaction)::int8, 'gid=' || quote_literal(gid), transaction::text
        FROM pg_prepared_xacts WHERE database = current_database()
        UNION ALL
        SELECT 'replication slot', active_pid, NULL, age(xmin)::int8,
               'slot_name=' || quote_literal(slot_name), xmin::text
        FROM pg_replication_slots WHERE xmin IS NOT NULL
    ) h
    ORDER BY xids DESC, seconds DESC NULLS LAST
    LIMIT 1";

impl<E: SinkProbe> Probe<E> {
    /// A probe of `table` on `pool`, each check bounded by `timeout`, and of the sink's
    /// endpoint through `endpoint` (which bounds its own).
    pub fn new(pool: PgPool, table: &TableName, timeout: Duration, endpoint: E) -> Self {
        Probe {
            pool,
            endpoint,
            // Fails with undefined_table when the outbox is missing; says whether this
            // session could write (not a hot standby, not a read-only default).
            table_sql: format!(
                "SELECT pg_is_in_recovery(), current_setting('transaction_read_only') = 'on'
                 FROM (SELECT 1 FROM {} LIMIT 0) AS present RIGHT JOIN (SELECT 1) AS one ON true",
                table.pending()
            ),
            lock_sql: LOCK_SQL
                .replace("$1", &super::queries::sql_literal(&table.pending()))
                .replace("$2", &super::queries::sql_literal(&table.dead())),
            tables: (table.pending(), table.dead()),
            timeout,
        }
    }

    /// One round of checks.
    pub async fn run_once(&mut self) -> Findings {
        let postgres_sent = Instant::now();
        let postgres = self.postgres().await;
        let endpoint_sent = Instant::now();
        let endpoint = self.endpoint.writable().await;
        Findings {
            postgres_sent,
            postgres,
            endpoint_sent,
            endpoint,
        }
    }

    /// Whether Postgres answers as a writable primary, and the table exists.
    async fn postgres(&self) -> Result<bool> {
        // Taken apart from the query, so that a server that refuses connections is named for
        // what it says (`too many connections`), not as a timeout.
        let mut conn = crate::db::acquire(&self.pool, self.timeout, "postgres probe").await?;
        // The simple query protocol: one round trip, whatever pooler is in between.
        let check = async {
            if let Some(holder) = lock_holder(&mut conn, &self.lock_sql).await? {
                // Not past the lock: the query below would wait behind it. A lock younger
                // than LOCK_REPORT_AFTER (a migration's brief ALTER TABLE) is no outage, and
                // the table it locks exists.
                if holder
                    .seconds
                    .is_some_and(|s| s < LOCK_REPORT_AFTER.as_secs_f64())
                {
                    return Ok(Ok((false, false)));
                }
                return Ok(Err(holder));
            }
            let row = crate::db::simple_query(&mut conn, &self.table_sql).await?;
            Ok::<_, sqlx::Error>(Ok((row.try_get::<bool, _>(0)?, row.try_get::<bool, _>(1)?)))
        };
        let found = tokio::time::timeout(self.timeout, check).await;
        match found {
            Ok(Ok(Ok((false, false)))) | Ok(Ok(Err(_))) | Ok(Err(_)) => {}
            Ok(Ok(Ok(_))) => {
                // A read-only session stays so: let the pool open a new one next time.
                let _ = tokio::time::timeout(self.timeout, conn.close()).await;
            }
            // No answer: the session is dropped at once, not handed back to be checked.
            Err(_) => drop(conn.detach()),
        }
        match found {
            Err(_) => Err(self.timed_out().await),
            Ok(Ok(Err(holder))) => Err(Error::Locked(holder)),
            Ok(Ok(Ok((false, false)))) => Ok(true),
            Ok(Ok(Ok((standby, _)))) => Err(Error::NotWritable {
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
        }
    }

    /// The Postgres check timed out: a lock taken between the lock check and the query, or a
    /// server that does not answer. Looks again on another connection, if the pool has one
    /// idle, for a lock to name.
    async fn timed_out(&self) -> Error {
        let timeout = Error::Timeout {
            dependency: crate::error::Dependency::Postgres,
            what: "postgres probe",
            after: self.timeout,
        };
        let Some(mut conn) = self.pool.try_acquire() else {
            return timeout;
        };
        match tokio::time::timeout(self.timeout, lock_holder(&mut conn, &self.lock_sql)).await {
            Ok(Ok(Some(holder))) if holder.seconds.is_none_or(|s| s >= 0.5) => {
                Error::Locked(holder)
            }
            _ => timeout,
        }
    }

    /// Whether Postgres has room for new rows in the outbox's tablespace: `jobrelay check`
    /// makes a temporary table there and writes one row, which extends a file (a page of
    /// its own), then rolls back. A read, or a write into a page with room left, would
    /// succeed on a full disk. `Ok(false)`: could not tell (the role may not create a table in
    /// that tablespace).
    pub async fn room_for_rows(&self) -> Result<bool> {
        let check = async {
            let mut tx = self.pool.begin().await?;
            let tablespace: Option<String> = sqlx::query_scalar(
                "SELECT quote_ident(spcname) FROM pg_tablespace
                 WHERE oid = (SELECT CASE reltablespace WHEN 0 THEN
                                         (SELECT dattablespace FROM pg_database
                                          WHERE datname = current_database())
                                     ELSE reltablespace END
                              FROM pg_class WHERE oid = to_regclass($1))",
            )
            .bind(&self.tables.0)
            .fetch_optional(&mut *tx)
            .await?;
            let Some(tablespace) = tablespace else {
                return Ok(false);
            };
            let made = sqlx::query(&format!(
                "CREATE TEMPORARY TABLE jobrelay_check_room (b int) ON COMMIT DROP \
                 TABLESPACE {tablespace}"
            ))
            .execute(&mut *tx)
            .await;
            match made {
                Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42501") => {
                    return Ok(false)
                }
                made => made?,
            };
            sqlx::query("INSERT INTO jobrelay_check_room VALUES (1)")
                .execute(&mut *tx)
                .await?;
            tx.rollback().await?;
            Ok::<_, sqlx::Error>(true)
        };
        let after = self.timeout.max(BACKLOG_INTERVAL);
        within(Dependency::Postgres, "postgres room check", after, check).await
    }

    /// The oldest of what holds the database's xmin horizon back, if anything does.
    pub async fn horizon(&self) -> Result<Option<Horizon>> {
        // The simple query protocol: one round trip, whatever pooler is in between.
        let found = within(
            Dependency::Postgres,
            "postgres horizon check",
            self.timeout.max(BACKLOG_INTERVAL),
            sqlx::Executor::fetch_optional(&self.pool, HORIZON_SQL),
        )
        .await?;
        let Some(row) = found else {
            return Ok(None);
        };
        Ok(Some(Horizon {
            kind: row.try_get(0)?,
            pid: row.try_get(1)?,
            seconds: row.try_get(2)?,
            xids: row.try_get(3)?,
            detail: row.try_get::<Option<String>, _>(4)?.unwrap_or_default(),
            horizon: row.try_get(5)?,
        }))
    }
}

/// Another session's lock on the outbox (or its dead letters) that blocks the claims (see
/// [`LOCK_SQL`]).
async fn lock_holder(
    conn: &mut sqlx::PgConnection,
    lock_sql: &str,
) -> sqlx::Result<Option<LockHolder>> {
    let Some(row) = sqlx::Executor::fetch_optional(conn, lock_sql).await? else {
        return Ok(None);
    };
    Ok(Some(LockHolder {
        table: row.try_get(0)?,
        pid: row.try_get(1)?,
        mode: row.try_get(2)?,
        seconds: row.try_get(3)?,
        state: row.try_get(4)?,
    }))
}

/// Whether the error says the relation itself is missing (not the schema or the database,
/// which are as much a reason not to be ready but are reported as Postgres failures).
fn missing_relation(e: &Error) -> bool {
    matches!(e, Error::Database(sqlx::Error::Database(db)) if db.code().as_deref() == Some("42P01"))
}

/// The daemon's probe task: runs the [`Probe`] every [`PROBE_INTERVAL`] and reports to
/// `health`; samples the backlog ([`Backlog`], for what the runner `needs` of the claim), the
/// held ordering keys ([`HeldWatch`]) and the xmin horizon every [`BACKLOG_INTERVAL`], until
/// `shutdown`.
pub async fn probe<E: SinkProbe>(
    mut probe: Probe<E>,
    table: TableName,
    needs: ClaimNeeds,
    health: Arc<Health>,
    shutdown: CancellationToken,
) {
    let mut backlog = Backlog::new(&table, needs);
    let mut last_backlog: Option<Instant> = None;
    let mut held = HeldWatch::new(&table);
    let mut horizon = HorizonWatch::default();
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
                let sample = tokio::time::timeout(BACKLOG_INTERVAL, backlog.sample(&probe.pool));
                if let Ok(Ok(sampled)) = sample.await {
                    sampled.emit();
                }
                let sample = tokio::time::timeout(BACKLOG_INTERVAL, held.sample(&probe.pool));
                if let Ok(Err(e)) = sample.await {
                    tracing::debug!(error = %crate::telemetry::redact::scrub(&e.to_string()),
                        "could not look at the held ordering keys");
                }
                match probe.horizon().await {
                    Ok(found) => horizon.saw(found.as_ref()),
                    Err(e) => {
                        tracing::debug!(error = %crate::telemetry::redact::scrub(&e.to_string()),
                        "could not look at the xmin horizon")
                    }
                }
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            () = round => {}
        }
    }
}
