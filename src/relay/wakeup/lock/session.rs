//! The lock's own Postgres session: taking the lock in its transaction, and releasing it and
//! waiting for older transactions; every statement bounded.

use std::time::{Duration, Instant};

use sqlx::{Connection, PgConnection, PgPool};
use tokio_util::sync::CancellationToken;

/// How long the relay waits to take the lock (producers' transactions hold it shared until
/// they end); it tries again this often while awake.
pub const LOCK_WAIT: Duration = Duration::from_millis(200);
/// The server ends the lock's transaction when it has been idle this long (a hung relay).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(5);
/// Client-side bound on each of the lock's statements (and on connecting).
pub const STATEMENT_LIMIT: Duration = Duration::from_secs(3);
/// Longest wait for older transactions to end after unlocking.
pub const XMIN_WAIT_LIMIT: Duration = Duration::from_secs(10);
/// First key of the wake-up lock ("jr"); the second is `hashtext(<channel>)`.
pub const LOCK_CLASS: i32 = 0x6A72;
/// The keep-alive statement of a lock held while every worker is busy: reads no table, and
/// its snapshot ends with it.
pub(super) const KEEPALIVE_SQL: &str = "SELECT 1";

/// `fut` within [`STATEMENT_LIMIT`]; a timeout is an I/O error (the caller drops the session).
pub(super) async fn bounded<T>(
    fut: impl std::future::Future<Output = sqlx::Result<T>>,
) -> sqlx::Result<T> {
    tokio::time::timeout(STATEMENT_LIMIT, fut)
        .await
        .unwrap_or_else(|_| {
            Err(sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "no answer within {}",
                    humantime::format_duration(STATEMENT_LIMIT)
                ),
            )))
        })
}

/// Opens the lock's transaction: `lock_timeout` [`LOCK_WAIT`], `idle_in_transaction_session_timeout`
/// [`IDLE_TIMEOUT`] and `statement_timeout` [`STATEMENT_LIMIT`], and the claims' planner
/// settings, all for this transaction only.
fn begin_statement() -> String {
    format!(
        "BEGIN; SET LOCAL lock_timeout = {}; SET LOCAL idle_in_transaction_session_timeout = {}; \
         SET LOCAL statement_timeout = {}; {}",
        LOCK_WAIT.as_millis(),
        IDLE_TIMEOUT.as_millis(),
        STATEMENT_LIMIT.as_millis(),
        // The awake poll reads the outbox in `id` order: the claims' planner settings.
        crate::relay::queries::PLANNER_SET_LOCAL
    )
}

/// Takes the wake-up lock in `session` (a connection of its own to the pool's server, opened
/// if `None`), in a transaction opened if `in_tx` is false; `false` when producers'
/// transactions held it shared for longer than [`LOCK_WAIT`] (the transaction is then rolled
/// back, the session kept). While this waits, producers cannot take the lock shared either (a
/// waiting exclusive request blocks new shared ones), so they skip NOTIFY: the relay is awake
/// and polls right after.
pub(super) async fn try_lock(
    pool: &PgPool,
    session: &mut Option<PgConnection>,
    in_tx: &mut bool,
    channel: &str,
) -> sqlx::Result<bool> {
    let con = match session {
        Some(con) => con,
        None => {
            // Not from the pool: the lock's session is counted apart (--pg-max-connections).
            // Through the relay's connect gate: while Postgres refuses connections, one
            // attempt per backoff step for all of the relay's sessions.
            let opts = pool.connect_options();
            let con = crate::db::ConnectGate::of(&opts)
                .connect(&opts, STATEMENT_LIMIT)
                .await
                .map_err(crate::db::into_sqlx)?;
            session.insert(con)
        }
    };
    if !*in_tx {
        bounded(sqlx::Executor::execute(
            &mut *con,
            begin_statement().as_str(),
        ))
        .await?;
        *in_tx = true;
    }
    // Unnamed: a named statement would outlive the transaction on a pooled server connection.
    match bounded(
        sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext($2))")
            .persistent(false)
            .bind(LOCK_CLASS)
            .bind(channel)
            .execute(&mut *con),
    )
    .await
    {
        Ok(_) => Ok(true),
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("55P03") => {
            bounded(sqlx::Executor::execute(&mut *con, "ROLLBACK")).await?;
            *in_tx = false;
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// Commits the lock's transaction if `in_tx` (which unlocks), then waits until every
/// transaction running at that moment has ended: a producer that skipped its NOTIFY has then
/// committed (its row is visible) or aborted. Closes the session.
pub(super) async fn unlock_and_settle(
    mut con: PgConnection,
    in_tx: bool,
    shutdown: &CancellationToken,
) -> sqlx::Result<()> {
    use sqlx::Row as _;
    if in_tx {
        bounded(sqlx::Executor::execute(&mut con, "COMMIT")).await?;
    }
    // A fresh transaction id: every id below it was assigned before this point. (A snapshot's
    // xmax would not do: it is one past the latest *completed* id, so a producer whose
    // transaction holds the newest id is not below it, and the wait below would pass while
    // that producer is still open.) The simple query protocol, with the id written into the
    // statement: one round trip each, whatever pooler is in between.
    let next: String = bounded(crate::db::simple_query(
        &mut con,
        "SELECT pg_current_xact_id()::text",
    ))
    .await?
    .try_get(0)?;
    let next: u64 = next
        .parse()
        .map_err(|_| sqlx::Error::Protocol(format!("pg_current_xact_id() returned {next:?}")))?;
    // Only this database's transactions can have inserted into the outbox: one that holds
    // an older id, open or prepared, is waited for; a long transaction of another database on
    // the same server (a report, another application) is not. `age` orders ids: an older id
    // is further behind.
    let passed_sql = format!(
        "SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity
                            WHERE datname = current_database() AND backend_xid IS NOT NULL
                              AND pid <> pg_backend_pid()
                              AND age(backend_xid) > age(xid('{next}'::xid8)))
            AND NOT EXISTS (SELECT 1 FROM pg_prepared_xacts
                            WHERE database = current_database()
                              AND age(transaction) > age(xid('{next}'::xid8)))"
    );
    let started = Instant::now();
    loop {
        let passed: bool = bounded(crate::db::simple_query(&mut con, &passed_sql))
            .await?
            .try_get(0)?;
        if passed || shutdown.is_cancelled() {
            break;
        }
        if started.elapsed() > XMIN_WAIT_LIMIT {
            tracing::debug!("an old transaction holds the xmin back; relying on the poll interval");
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    bounded(con.close()).await
}
