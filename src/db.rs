//! Postgres: the embedded migrations, pools, and the schema version.

use std::sync::Arc;
use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgRow};
use sqlx::{Connection, PgConnection, PgPool, Postgres};
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::table::TableName;

/// The migrations in `migrations/`, embedded in the binary.
pub static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// How long a pool waits for a connection (or to open one) before it gives up.
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

/// Bound on the check a connection passes when it goes back to the pool. sqlx checks it with
/// a round trip of its own that has no bound: a connection frozen mid-statement (a primary
/// gone silent, no RST) would keep its pool slot until the kernel gives up on the socket
/// (about 15 minutes), and a pool whose slots all hang that way serves no one, even once new
/// connections would reach a live server again.
pub const RELEASE_CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// A pool of at most `max` connections that connects on first use, so a relay starts (and
/// serves its probes) while Postgres is still down. A connection handed back is closed
/// instead of kept when it does not answer within [`RELEASE_CHECK_TIMEOUT`].
pub fn lazy_pool(opts: PgConnectOptions, max: u32) -> PgPool {
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .after_release(|conn, _meta| {
            Box::pin(async move {
                match tokio::time::timeout(RELEASE_CHECK_TIMEOUT, conn.ping()).await {
                    Ok(Ok(())) => Ok(true),
                    Ok(Err(e)) => Err(e),
                    // Err: sqlx drops the connection without a goodbye (a frozen socket
                    // would not take one).
                    Err(_) => Err(sqlx::Error::Io(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "connection did not answer when handed back to the pool",
                    ))),
                }
            })
        })
        .connect_lazy_with(opts)
}

/// Opens one connection first, so that a wrong password or an unreachable server fails at once
/// with Postgres's own error (a pool would only say it timed out), then returns a lazy pool.
pub async fn checked_pool(opts: PgConnectOptions, max: u32, timeout: Duration) -> Result<PgPool> {
    let conn = crate::error::within(
        crate::error::Dependency::Postgres,
        "postgres connect",
        timeout,
        PgConnection::connect_with(&opts),
    )
    .await?;
    let _ = conn.close().await;
    Ok(lazy_pool(opts, max))
}

/// Takes a connection from `pool` within `limit` (`what` names the wait in the error).
///
/// When the pool has no idle connection (it would open one) and the relay's [`ConnectGate`]
/// for that server is failing, the gate first makes its one attempt (or says when the next is
/// due), within `limit`: sqlx's pool retries a server that refuses connections with
/// `too many connections` (SQLSTATE 53300: `max_connections`, or a role's or database's
/// `CONNECTION LIMIT`) every few milliseconds, doubling from 10 ms, in every acquire at once
/// (issue 34: 11-12 refused attempts a second per relay, 211 a second from 30 relays, 1.2
/// cores of the server's 2). The gate's attempt names the server's refusal (`too many
/// connections`), where the pool would only say that it timed out.
///
/// Returns within `limit`. When the pool could not open a connection in time, the next
/// acquire goes through the gate.
pub async fn acquire(
    pool: &PgPool,
    limit: Duration,
    what: &'static str,
) -> Result<PoolConnection<Postgres>> {
    let deadline = Instant::now() + limit;
    let opts = pool.connect_options();
    let gate = ConnectGate::of(&opts);
    if pool.num_idle() == 0 {
        gate.admit(&opts, limit).await?;
    }
    let timed_out = || {
        if pool.size() < pool.options().get_max_connections() {
            // The pool was (probably) opening a connection: the next one goes through the gate.
            gate.fail_next();
        }
        Error::Timeout {
            dependency: crate::error::Dependency::Postgres,
            what,
            after: limit,
        }
    };
    match tokio::time::timeout_at(deadline, pool.acquire()).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(sqlx::Error::PoolTimedOut)) | Err(_) => Err(timed_out()),
        Ok(Err(e)) => {
            let connecting = is_connect_failure(&e);
            let e = Error::Database(e);
            if connecting {
                gate.failed(&e);
            }
            Err(e)
        }
    }
}

/// Whether a pool's error is a failure to open a connection (not of a statement).
fn is_connect_failure(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => db.code().is_some_and(|c| {
            c.starts_with("08") || c.starts_with("28") || c == "53300" || c == "57P03"
        }),
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::Protocol(_) => true,
        _ => false,
    }
}

/// The first step of the relay's connection backoff ([`ConnectGate`]).
pub const CONNECT_BACKOFF_BASE: Duration = Duration::from_millis(250);
/// The longest step of the relay's connection backoff: a server that has room again is
/// reached within this (and half of it at least, by the jitter).
pub const CONNECT_BACKOFF_CAP: Duration = Duration::from_secs(4);

/// The connection attempts of one relay process to one server, database and role: while they
/// fail, one attempt per step of a backoff ([`CONNECT_BACKOFF_BASE`] doubling to
/// [`CONNECT_BACKOFF_CAP`], each step drawn from its upper half so that relays refused together
/// do not come back together), whichever of the relay's sessions (the pool's workers and probe,
/// the listener, the wake-up lock) wants one. A server short of connections is not asked
/// again every few milliseconds by every session of every relay (issue 34), and a relay that
/// had none yet makes one attempt before the pool's own retries (the first attempt of a
/// process goes through the gate too).
#[derive(Debug)]
pub struct ConnectGate {
    state: std::sync::Mutex<GateState>,
    /// One attempt at a time while failing.
    turn: tokio::sync::Mutex<()>,
}

#[derive(Debug)]
struct GateState {
    backoff: crate::backoff::Backoff,
    /// No attempt before this.
    closed_until: Option<Instant>,
    /// The last attempt failed, or none succeeded yet: connects go through the gate.
    failing: bool,
    /// What the last failed attempt said: its reason and its error without the dependency's
    /// prefix.
    last: Option<(crate::error::Reason, String)>,
    /// Attempts made through the gate, and how many failed (for tests and benchmarks).
    attempts: u64,
    failures: u64,
}

impl ConnectGate {
    fn new() -> Self {
        ConnectGate {
            state: std::sync::Mutex::new(GateState {
                backoff: crate::backoff::Backoff::new(CONNECT_BACKOFF_BASE, CONNECT_BACKOFF_CAP),
                closed_until: None,
                failing: true,
                last: None,
                attempts: 0,
                failures: 0,
            }),
            turn: tokio::sync::Mutex::new(()),
        }
    }

    /// The process's gate for the server, database and role `opts` name.
    pub fn of(opts: &PgConnectOptions) -> Arc<ConnectGate> {
        use std::collections::HashMap;
        use std::sync::{Mutex, OnceLock};
        static GATES: OnceLock<Mutex<HashMap<String, Arc<ConnectGate>>>> = OnceLock::new();
        let key = format!(
            "{}|{}|{:?}|{}|{}",
            opts.get_host(),
            opts.get_port(),
            opts.get_socket(),
            opts.get_database().unwrap_or_default(),
            opts.get_username()
        );
        GATES
            .get_or_init(Default::default)
            .lock()
            .expect("not poisoned")
            .entry(key)
            .or_insert_with(|| Arc::new(ConnectGate::new()))
            .clone()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().expect("not poisoned")
    }

    /// Whether connects go through the gate (the last attempt failed, or none was made).
    pub fn is_failing(&self) -> bool {
        self.state().failing
    }

    /// Attempts made through the gate, and how many of them failed.
    pub fn attempts(&self) -> (u64, u64) {
        let s = self.state();
        (s.attempts, s.failures)
    }

    /// A connect outside the gate failed (the pool's, the listener's): the next ones go
    /// through it, after the backoff's next step.
    pub fn failed(&self, e: &Error) {
        let mut s = self.state();
        s.failing = true;
        s.failures += 1;
        let delay = s.backoff.next_delay();
        s.closed_until = Some(Instant::now() + delay);
        s.last = Some((e.reason(), crate::error::without_dependency(&e.to_string())));
    }

    /// The next connect goes through the gate (at once, unless its backoff runs).
    pub fn fail_next(&self) {
        self.state().failing = true;
    }

    fn opened(&self) {
        let mut s = self.state();
        s.failing = false;
        s.closed_until = None;
        s.last = None;
        s.backoff.reset();
    }

    /// The error of a caller that may not wait for the next attempt (due after `limit`).
    fn backing_off(&self, limit: Instant) -> Error {
        let s = self.state();
        let retry_in = s.closed_until.map_or(Duration::ZERO, |t| {
            t.saturating_duration_since(Instant::now())
        });
        match &s.last {
            Some((reason, message)) => Error::ConnectBackoff {
                reason: *reason,
                message: message.clone(),
                retry_in,
            },
            None => Error::Timeout {
                dependency: crate::error::Dependency::Postgres,
                what: "postgres connect",
                after: limit.saturating_duration_since(Instant::now()),
            },
        }
    }

    /// Waits for the turn and the backoff (within `limit`), then makes one attempt.
    async fn attempt(
        &self,
        opts: &PgConnectOptions,
        limit: Duration,
        only_if_failing: bool,
    ) -> Result<Option<PgConnection>> {
        let deadline = Instant::now() + limit;
        let Ok(_turn) = tokio::time::timeout_at(deadline, self.turn.lock()).await else {
            return Err(self.backing_off(deadline));
        };
        if only_if_failing && !self.is_failing() {
            return Ok(None);
        }
        let until = self.state().closed_until;
        if let Some(until) = until {
            if until > deadline {
                return Err(self.backing_off(deadline));
            }
            tokio::time::sleep_until(until).await;
        }
        self.state().attempts += 1;
        match tokio::time::timeout_at(deadline, PgConnection::connect_with(opts)).await {
            Ok(Ok(conn)) => {
                self.opened();
                Ok(Some(conn))
            }
            Ok(Err(e)) => {
                let e = Error::Database(e);
                self.failed(&e);
                Err(e)
            }
            Err(_) => {
                let e = Error::Timeout {
                    dependency: crate::error::Dependency::Postgres,
                    what: "postgres connect",
                    after: limit,
                };
                self.failed(&e);
                Err(e)
            }
        }
    }

    /// Opens a connection of its own (the wake-up lock's session): one attempt, when the
    /// backoff allows it within `limit`.
    pub async fn connect(&self, opts: &PgConnectOptions, limit: Duration) -> Result<PgConnection> {
        Ok(self
            .attempt(opts, limit, false)
            .await?
            .expect("attempted whether failing or not"))
    }

    /// While failing: one attempt (closed again at once) when the backoff allows it within
    /// `limit`, so that the caller's own connect (the pool's, the listener's) follows a
    /// success. Returns at once when not failing.
    pub async fn admit(&self, opts: &PgConnectOptions, limit: Duration) -> Result<()> {
        if !self.is_failing() {
            return Ok(());
        }
        if let Some(conn) = self.attempt(opts, limit, true).await? {
            let _ = tokio::time::timeout(limit, conn.close()).await;
        }
        Ok(())
    }
}

/// An [`Error`] as the `sqlx::Error` of a caller that only logs it (the wake-up lock).
pub(crate) fn into_sqlx(e: Error) -> sqlx::Error {
    match e {
        Error::Database(e) => e,
        other => sqlx::Error::Io(std::io::Error::other(other.to_string())),
    }
}

/// The statement that opens each of the relay's transactions: `BEGIN`, then the relay's
/// settings for that transaction only (`SET LOCAL`), in one round trip of the simple query
/// protocol.
///
/// Settings given at connection time (the startup packet's `options`) are refused by
/// PgBouncer unless it ignores them, and then they are lost; settings made with a session-level
/// `SET` would stay on a pooled server connection and reach the application's transactions
/// after it (PgBouncer in transaction mode). `SET LOCAL` works through any pooler and ends with
/// the transaction.
///
/// - `statement_timeout`: no claim or hand-back runs longer;
/// - `idle_in_transaction_session_timeout`: a relay that stops while it holds rows (paused,
///   partitioned away) loses its transaction, and the rows are claimable again;
/// - `synchronous_commit = off`: the relay's commits only delete rows whose jobs Redis already
///   holds. If Postgres crashes before such a commit reaches disk, the rows come back and are
///   pushed again, and the dedup marker turns that push into `duplicate`: waiting for the WAL
///   flush on every batch would buy nothing but latency. (Producers' commits are untouched.)
pub fn begin_statement(statement_timeout: Duration, idle_in_transaction: Duration) -> String {
    format!(
        "BEGIN; SET LOCAL statement_timeout = {}; \
         SET LOCAL idle_in_transaction_session_timeout = {}; \
         SET LOCAL synchronous_commit = off",
        statement_timeout.as_millis().max(1),
        idle_in_transaction.as_millis().max(1),
    )
}

/// The columns of an outbox table and their types (docs/schema.md), as `format_type` prints
/// them (`timestamptz` for `timestamp with time zone`), in the table's order. Other columns may
/// follow. The same list every statement on the outbox is rendered from.
pub const OUTBOX_COLUMNS: [(&str, &str); 16] = crate::columns::TYPED;

/// The columns of [`OUTBOX_COLUMNS`] that `migrate` adds to an existing outbox and its
/// dead-letter table that lack them (migration 8, `jobrelay_create_outbox`): their absence does
/// not make a table unfit. Present with another type, they do.
const ADDED_BY_MIGRATE: [&str; 2] = ["options", "ordering_key"];

/// The dead-letter table's column besides [`OUTBOX_COLUMNS`] (docs/schema.md).
pub const DEAD_LETTER_COLUMN: (&str, &str) = ("dead_at", "timestamptz");

pub use crate::error::UnfitOutbox;

/// Whether `table` or its dead-letter table already exists with a shape the relay cannot use:
/// not a plain table, or without one of the columns of docs/schema.md (with its type; a
/// missing `options` is fine: `migrate` adds it). Tables that do
/// not exist yet are fine (`migrate` creates them), and so are additional columns. Reads the
/// catalog only.
pub async fn unfit_outbox(pool: &PgPool, table: &TableName) -> Result<Option<UnfitOutbox>> {
    let outbox = table.to_string();
    let dead = format!("{outbox}_dead");
    let dead_columns: Vec<(&str, &str)> = OUTBOX_COLUMNS
        .iter()
        .copied()
        .chain([DEAD_LETTER_COLUMN])
        .collect();
    for (name, quoted, columns) in [
        (&outbox, table.pending(), &OUTBOX_COLUMNS[..]),
        (&dead, table.dead(), &dead_columns[..]),
    ] {
        let problems = table_problems(pool, &quoted, columns).await?;
        if !problems.is_empty() {
            return Ok(Some(UnfitOutbox {
                outbox: outbox.clone(),
                table: name.clone(),
                problems,
            }));
        }
    }
    Ok(None)
}

/// What keeps the table `quoted` (an SQL name) from having `columns`; empty when it does or
/// does not exist.
async fn table_problems(
    pool: &PgPool,
    quoted: &str,
    columns: &[(&str, &str)],
) -> Result<Vec<String>> {
    let kind: Option<String> =
        sqlx::query_scalar("SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)")
            .bind(quoted)
            .fetch_optional(pool)
            .await?;
    match kind.as_deref() {
        None => return Ok(Vec::new()),
        Some("r") => {}
        Some(other) => {
            let what = match other {
                "v" => "a view",
                "m" => "a materialized view",
                "p" => "a partitioned table",
                "f" => "a foreign table",
                "S" => "a sequence",
                "i" | "I" => "an index",
                _ => "not a plain table",
            };
            return Ok(vec![format!("it is {what}, not a plain table")]);
        }
    }
    let have: Vec<(String, String)> = sqlx::query_as(
        "SELECT attname::text, format_type(atttypid, NULL) FROM pg_attribute
         WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped",
    )
    .bind(quoted)
    .fetch_all(pool)
    .await?;
    let short = |t: &str| match t {
        "timestamp with time zone" => "timestamptz".to_owned(),
        other => other.to_owned(),
    };
    let mut missing = Vec::new();
    let mut wrong = Vec::new();
    for &(name, ty) in columns {
        match have.iter().find(|(n, _)| n == name) {
            // `migrate` adds it to an outbox made before it existed.
            None if ADDED_BY_MIGRATE.contains(&name) => {}
            None => missing.push(format!("{name} {ty}")),
            Some((_, actual)) if short(actual) != ty => {
                wrong.push(format!("{name} is {}, not {ty}", short(actual)));
            }
            Some(_) => {}
        }
    }
    let mut problems = Vec::new();
    if !missing.is_empty() {
        problems.push(format!("missing columns {}", missing.join(", ")));
    }
    problems.extend(wrong);
    Ok(problems)
}

/// Applies the embedded migrations; when `table` is not `pending_jobs`, also creates it, its
/// dead-letter table and its trigger (`jobrelay_create_outbox`).
///
/// First checks [`unfit_outbox`]: an existing table of another shape (an application's own
/// `orders`, say) is refused before anything is changed, with [`Error::NotAnOutbox`].
pub async fn migrate(pool: &PgPool, table: &TableName) -> Result<()> {
    if let Some(unfit) = unfit_outbox(pool, table).await? {
        return Err(Error::NotAnOutbox(unfit));
    }
    MIGRATOR.run(pool).await?;
    if *table != TableName::default() {
        sqlx::query("SELECT jobrelay_create_outbox($1)")
            .bind(table.to_string())
            .execute(pool)
            .await?;
    }
    Ok(())
}

/// The latest applied migration version, or `None` before `jobrelay migrate` ran.
pub async fn schema_version(pool: &PgPool) -> Result<Option<i64>> {
    use sqlx::Row as _;
    // The simple query protocol: one round trip, safe through PgBouncer in transaction mode
    // (see [`simple_query`]).
    let mut conn = pool.acquire().await?;
    let exists: bool = simple_query(
        &mut conn,
        "SELECT to_regclass('_sqlx_migrations') IS NOT NULL",
    )
    .await?
    .try_get(0)?;
    if !exists {
        return Ok(None);
    }
    Ok(simple_query(
        &mut conn,
        "SELECT max(version) FROM _sqlx_migrations WHERE success",
    )
    .await?
    .try_get(0)?)
}

/// Runs one parameterless statement with the simple query protocol and returns its first row.
///
/// A statement with the extended protocol outside a transaction takes two round trips, each
/// ended by a Sync; PgBouncer in transaction mode may run the second on another server
/// connection than the first, where the statement it binds does not exist (or is another
/// client's). A simple query is one message, run by one server connection.
pub async fn simple_query(conn: &mut PgConnection, sql: &str) -> sqlx::Result<PgRow> {
    // A bare `&str` has no arguments: sqlx sends it as a simple Query message.
    sqlx::Executor::fetch_one(conn, sql).await
}

/// The newest migration this binary carries.
pub fn latest_known_version() -> i64 {
    MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0)
}
