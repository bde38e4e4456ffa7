//! The fleet benchmark (issue "Scale-out", acceptance item 1): P relay processes of W workers
//! each on one table against the baseline of 1 process of 2 workers, alternating, in the same
//! run. Prints one JSON object on stdout and a short summary on stderr.
//!
//! ```text
//! cargo build --release                       # the relay binary the benchmark starts
//! cargo run --release --example fleet
//! FLEET_ROWS=20000 FLEET_PROCESSES=4 FLEET_WORKERS=2 FLEET_ROUNDS=1 cargo run --release --example fleet
//! ```
//!
//! Each round runs the baseline, then the fleet. Each run: empty the table (TRUNCATE), start
//! the relay processes (the real binary, `--http-addr off --log-format json --workers W`,
//! default batch size and claim slots, `RUST_LOG=info,jobrelay=debug`, stderr to a file per
//! process) and wait until each has logged that it reached Postgres and Redis (plus 300 ms for
//! its workers to start), then COPY `FLEET_ROWS` rows (200-byte payloads over 4 queues, uuids
//! chosen here) in one transaction and time from its commit until every job is in Redis and
//! the table is empty: a running fleet draining a backlog, as sidecars do, not process
//! start-up. Then check exactly-once (every COPYed uuid in the queues once, no
//! other job, nothing left in the table or the dead letters), SIGTERM the relays and require
//! exit 0, read their logs, and delete the namespace's keys.
//!
//! Per run: rows/s; the claim statement's duration (`claim_ms` of every "batch committed" debug
//! line of every process: p50, p99, max); Postgres CPU per row (µs), from `/proc`: the relays'
//! own backends (found by their `application_name`; CPU counted from the commit of the rows) and, for reference, every Postgres process on the host
//! (which includes the WAL writer, the checkpointer, and any other client of this server);
//! the relays' and Redis's CPU per row; cores busy. Per configuration, the medians over the
//! rounds; per round, and as a median, the ratio fleet/baseline of the drain rates.
//!
//! Then, once, the idle fleet (issue: "24 idle relays cost Postgres at most 5 % of one core
//! together, and a single committed row reaches Redis within 50 ms with 24 relays running"):
//! `FLEET_IDLE_RELAYS` relays of the default workers on the empty table, ready, then 2 s more;
//! over `FLEET_IDLE_SECONDS` the CPU of every Postgres process on the host (and of the relays'
//! backends alone), of the relays (their threads' `schedstat`) and of Redis, as percentages of
//! one core. Then a consumer thread BRPOPs the queues on a blocking connection while rows are
//! inserted one by one, each in its own transaction (autocommit INSERT, uuid chosen here): the
//! "steady" series, `FLEET_LATENCY_ROWS` rows one every `FLEET_LATENCY_GAP`, and the "quiet"
//! series, `FLEET_QUIET_ROWS` rows each after `FLEET_QUIET_GAP` without one (longer than the
//! relays' 1 s poll interval: every worker is waiting for a notification). A row's latency runs
//! from its INSERT being sent (its commit included) to the consumer's BRPOP returning it; per series p50, p90, p99,
//! max. Then SIGTERM (exit 0), exactly-once over the popped jobs, and a summary on stderr with
//! PASS/FAIL against the targets (Postgres ≤ 5 % of a core, steady p99 ≤ 50 ms): informational,
//! only exactly-once fails the benchmark. 24 idle relays hold about 4 connections each: mind
//! the server's `max_connections` (reported).
//!
//! Settings by environment: `FLEET_ROWS` (default 100000), `FLEET_PROCESSES` (6),
//! `FLEET_WORKERS` (4), `FLEET_ROUNDS` (3), `FLEET_TIMEOUT` (per drain, default `10m`),
//! `FLEET_KEEP_LOGS` (non-empty: keep the relays' logs and print where), `FLEET_IDLE_RELAYS`
//! (24; 0 skips the idle stage), `FLEET_IDLE_SECONDS` (10), `FLEET_LATENCY_ROWS` (200),
//! `FLEET_LATENCY_GAP` (`50ms`), `FLEET_VACUUMED` (non-empty: `VACUUM (ANALYZE)` after each
//! COPY, a labelled extra figure; by default the table is analysed while empty and the rows
//! land in one transaction, the state an outbox is in when an outage ends), `FLEET_QUIET_ROWS` (20; 0: no quiet series), `FLEET_QUIET_GAP`
//! (`2s`), `DATABASE_URL`
//! (default `postgres://postgres@127.0.0.1:5432/postgres`; the benchmark creates and drops its
//! own database `jobrelay_fleet_<random>` next to it), `REDIS_URL` (default
//! `redis://127.0.0.1:6379`; namespace `fleet<random>:`, deleted at the end), `JOBRELAY_BIN`
//! (the relay binary; default: `jobrelay` in the target directory this example was built in,
//! e.g. `target/release/jobrelay`, which `cargo run --example` does NOT build: run `cargo build
//! --release` first). Variables `JOBRELAY_*` other than `JOBRELAY_BIN` are not passed on to the
//! relays. The database, the keys, the logs and the relays are removed also on SIGINT or
//! SIGTERM.

#[path = "procfs.rs"]
mod procfs;
// Also loaded by the other benchmark example when both are compiled into the tests.
#[allow(clippy::duplicate_mod)]
#[path = "../support/sandbox.rs"]
mod sandbox;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use chrono::{DateTime, Utc};
use prost::Message;
use serde_json::{json, Value};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};
use tokio::process::{Child, Command};
use uuid::Uuid;

/// Any error, boxed.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// `eprintln!` that ignores a closed or broken stderr: a panic there would skip the cleanup.
macro_rules! note {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

const QUEUES: usize = 4;
const PAYLOAD_BYTES: usize = 200;
/// `application_name` of the relays' sessions: how their backends are found.
const RELAY_APP: &str = "jobrelay_fleet_relay";
/// `application_name` of the benchmark's own sessions.
const BENCH_APP: &str = "jobrelay_fleet_bench";
/// How long a relay may take to exit after SIGTERM (its `--shutdown-timeout` is 25 s).
const EXIT_DEADLINE: Duration = Duration::from_secs(40);

/// A configuration: processes x workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub processes: usize,
    pub workers: usize,
}

/// What the fleet is compared with: one process with the default two workers.
pub const BASELINE: Shape = Shape {
    processes: 1,
    workers: 2,
};

/// What to run, and how big.
#[derive(Debug, Clone)]
pub struct Args {
    pub database_url: String,
    pub redis_url: String,
    pub rows: usize,
    pub fleet: Shape,
    pub rounds: usize,
    /// The `jobrelay` binary the relays run.
    pub relay_bin: PathBuf,
    /// Longest a drain may take.
    pub timeout: Duration,
    /// Keep the relays' log files.
    pub keep_logs: bool,
    /// `FLEET_VACUUMED`: VACUUM (ANALYZE) the table after the COPY (a labelled extra figure:
    /// production tables are never in that state).
    pub vacuumed: bool,
    /// The idle-fleet stage after the rounds; `None` skips it (`FLEET_IDLE_RELAYS=0`).
    pub idle: Option<IdleArgs>,
}

/// The idle-fleet stage: what an idle fleet costs, and how soon it relays a single row.
#[derive(Debug, Clone, PartialEq)]
pub struct IdleArgs {
    /// Relay processes, each with the default workers.
    pub relays: usize,
    /// How long the idle fleet's CPU is measured.
    pub window: Duration,
    /// Rows of the "steady" latency series, and the time between their inserts.
    pub latency_rows: usize,
    pub latency_gap: Duration,
    /// Rows of the "quiet" series (0: none), each after this long without a row, longer than
    /// the relays' poll interval so that every worker is waiting for a notification.
    pub quiet_rows: usize,
    pub quiet_gap: Duration,
}

impl Args {
    /// Settings from the process's environment (see the module documentation).
    pub fn from_env() -> Result<Self, BoxError> {
        Args::from_lookup(&|k| std::env::var(k).ok())
    }

    /// Settings from `get` (an environment); empty values count as unset.
    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> Result<Self, BoxError> {
        let var = |k: &str| get(k).filter(|s| !s.is_empty());
        let positive = |k: &str, default: usize| -> Result<usize, BoxError> {
            match var(k) {
                None => Ok(default),
                Some(v) => match usize::from_str(&v) {
                    Ok(n) if n > 0 => Ok(n),
                    _ => Err(format!("{k}={v:?}: expected a positive integer").into()),
                },
            }
        };
        let relay_bin = match var("JOBRELAY_BIN") {
            Some(p) => PathBuf::from(p),
            None => sibling_relay_binary()?,
        };
        if !relay_bin.is_file() {
            return Err(format!(
                "no relay binary at {}: `cargo run --example fleet` builds the example and the \
                 library, not the `jobrelay` binary; run `cargo build --release` first (or set \
                 JOBRELAY_BIN to a jobrelay binary)",
                relay_bin.display()
            )
            .into());
        }
        let non_negative = |k: &str, default: usize| -> Result<usize, BoxError> {
            match var(k) {
                None => Ok(default),
                Some(v) => usize::from_str(&v)
                    .map_err(|_| format!("{k}={v:?}: expected a non-negative integer").into()),
            }
        };
        let duration = |k: &str, default: Duration| -> Result<Duration, BoxError> {
            match var(k) {
                None => Ok(default),
                Some(v) => {
                    Ok(humantime::parse_duration(&v).map_err(|e| format!("{k}={v:?}: {e}"))?)
                }
            }
        };
        let timeout = duration("FLEET_TIMEOUT", Duration::from_secs(600))?;
        let idle = match non_negative("FLEET_IDLE_RELAYS", 24)? {
            0 => None,
            relays => Some(IdleArgs {
                relays,
                window: match var("FLEET_IDLE_SECONDS") {
                    None => Duration::from_secs(10),
                    Some(v) => match f64::from_str(&v) {
                        Ok(s) if s > 0.0 && s.is_finite() => Duration::from_secs_f64(s),
                        _ => {
                            return Err(format!(
                                "FLEET_IDLE_SECONDS={v:?}: expected a positive number"
                            )
                            .into())
                        }
                    },
                },
                latency_rows: positive("FLEET_LATENCY_ROWS", 200)?,
                latency_gap: duration("FLEET_LATENCY_GAP", Duration::from_millis(50))?,
                quiet_rows: non_negative("FLEET_QUIET_ROWS", 20)?,
                quiet_gap: duration("FLEET_QUIET_GAP", Duration::from_secs(2))?,
            }),
        };
        Ok(Args {
            database_url: var("DATABASE_URL")
                .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/postgres".into()),
            redis_url: var("REDIS_URL").unwrap_or_else(|| "redis://127.0.0.1:6379".into()),
            rows: positive("FLEET_ROWS", 100_000)?,
            fleet: Shape {
                processes: positive("FLEET_PROCESSES", 6)?,
                workers: positive("FLEET_WORKERS", 4)?,
            },
            rounds: positive("FLEET_ROUNDS", 3)?,
            relay_bin,
            timeout,
            keep_logs: var("FLEET_KEEP_LOGS").is_some(),
            vacuumed: var("FLEET_VACUUMED").is_some(),
            idle,
        })
    }
}

/// `jobrelay` in the target directory of this executable (`target/<profile>/examples/fleet`
/// -> `target/<profile>/jobrelay`).
fn sibling_relay_binary() -> Result<PathBuf, BoxError> {
    let exe = std::env::current_exe()?;
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| format!("{}: no target directory above it", exe.display()))?;
    Ok(dir.join(format!("jobrelay{}", std::env::consts::EXE_SUFFIX)))
}

/// Warns when the relay binary is older than a file it is built from (`src/`, `migrations/`,
/// `proto/` of this crate): e.g. `cargo run --example fleet` after an edit, without `cargo
/// build --release` (the example's build does not rebuild the binary).
fn warn_if_stale(bin: &Path) {
    fn newest(dir: &Path) -> Option<SystemTime> {
        let mut latest = None;
        for entry in std::fs::read_dir(dir).ok()?.flatten() {
            let path = entry.path();
            let t = if path.is_dir() {
                newest(&path)
            } else {
                entry.metadata().and_then(|m| m.modified()).ok()
            };
            latest = latest.max(t);
        }
        latest
    }
    let Ok(built) = std::fs::metadata(bin).and_then(|m| m.modified()) else {
        return;
    };
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let source = ["src", "migrations", "proto"]
        .iter()
        .filter_map(|d| newest(&crate_dir.join(d)))
        .max();
    if source.is_some_and(|s| s > built) {
        note!(
            "fleet: warning: {} is older than the source in {}: run `cargo build --release` \
             (or point JOBRELAY_BIN at a current binary)",
            bin.display(),
            crate_dir.display()
        );
    }
}

/// The benchmark's database, namespace and log directory.
struct Sandbox {
    db_name: String,
    pool: PgPool,
    /// The URL the relays get: the sandbox database, `application_name` [`RELAY_APP`].
    relay_db_url: String,
    redis: redis::Client,
    namespace: String,
    log_dir: PathBuf,
    leftovers: Leftovers,
}

/// `url` pointing at database `db`, with `application_name` set to `app`.
fn url_for(url: &url::Url, db: &str, app: &str) -> String {
    let mut url = url.clone();
    url.set_path(&format!("/{db}"));
    let pairs: Vec<(String, String)> = url
        .query_pairs()
        .filter(|(k, _)| k != "application_name")
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    url.query_pairs_mut()
        .clear()
        .extend_pairs(pairs)
        .append_pair("application_name", app);
    url.to_string()
}

impl Sandbox {
    async fn create(args: &Args) -> Result<Self, BoxError> {
        let tag = Uuid::new_v4().simple().to_string()[..12].to_owned();
        let db_name = format!("jobrelay_fleet_{tag}");
        let log_dir = std::env::temp_dir().join(&db_name);
        let leftovers = Leftovers {
            scratch: sandbox::Scratch {
                admin_url: args.database_url.clone(),
                db_name: db_name.clone(),
                redis: redis::Client::open(args.redis_url.as_str())?,
                namespace: format!("fleet{tag}:"),
            },
            children: Arc::new(Mutex::new(HashSet::new())),
            log_dir: (!args.keep_logs).then(|| log_dir.clone()),
        };
        let mut admin = PgConnection::connect(&args.database_url).await?;
        sqlx::query(&format!("CREATE DATABASE {db_name}"))
            .execute(&mut admin)
            .await?;
        admin.close().await?;
        if let Err(e) = std::fs::create_dir_all(&log_dir) {
            leftovers.remove().await;
            return Err(e.into());
        }
        let base = url::Url::parse(&args.database_url)?;
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .connect_with(PgConnectOptions::from_str(&url_for(
                &base, &db_name, BENCH_APP,
            ))?)
            .await;
        let pool = match pool {
            Ok(p) => p,
            Err(e) => {
                leftovers.remove().await;
                return Err(e.into());
            }
        };
        if let Err(e) = jobrelay::db::migrate(&pool, &jobrelay::TableName::default()).await {
            pool.close().await;
            leftovers.remove().await;
            return Err(e.into());
        }
        Ok(Sandbox {
            relay_db_url: url_for(&base, &db_name, RELAY_APP),
            db_name,
            pool,
            redis: leftovers.scratch.redis.clone(),
            namespace: leftovers.scratch.namespace.clone(),
            log_dir,
            leftovers,
        })
    }

    async fn cleanup(self) {
        self.pool.close().await;
        self.leftovers.remove().await;
    }

    async fn redis_con(&self) -> Result<redis::aio::MultiplexedConnection, BoxError> {
        Ok(self.redis.get_multiplexed_async_connection().await?)
    }

    fn queue_key(&self, q: usize) -> String {
        format!("{}queue:fleet{q}", self.namespace)
    }

    /// Empties the table and its dead letters (a new, empty heap, as before the first run) and
    /// analyses it empty: the state autovacuum leaves an outbox in, nearly empty most of the
    /// time, when an outage ends or a bulk import commits.
    async fn reset_table(&self) -> Result<(), BoxError> {
        sqlx::raw_sql("TRUNCATE pending_jobs, pending_jobs_dead; ANALYZE pending_jobs")
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// COPYs `n` rows with fresh uuids (returned) in one transaction: 200-byte payloads,
    /// round-robin over the queues `fleet0..3`. Statistics stay those of the empty table
    /// ([`Sandbox::reset_table`]), unless `vacuumed` (`FLEET_VACUUMED`, a labelled extra).
    async fn copy_rows(&self, n: usize, vacuumed: bool) -> Result<Vec<Uuid>, BoxError> {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut uuids = Vec::with_capacity(n);
        let mut conn = self.pool.acquire().await?;
        let mut copy = conn
            .copy_in_raw("COPY pending_jobs (uuid, queue, job_type, payload) FROM STDIN")
            .await?;
        let mut buf = String::with_capacity(1 << 20);
        for i in 0..n {
            let uuid = Uuid::new_v4();
            uuids.push(uuid);
            buf.push_str(&format!("{uuid}\tfleet{}\tProcessThing\t\\\\x", i % QUEUES));
            for b in payload(i) {
                buf.push(HEX[(b >> 4) as usize] as char);
                buf.push(HEX[(b & 15) as usize] as char);
            }
            buf.push('\n');
            if buf.len() > (1 << 20) {
                copy.send(buf.as_bytes()).await?;
                buf.clear();
            }
        }
        copy.send(buf.as_bytes()).await?;
        copy.finish().await?;
        drop(conn);
        if vacuumed {
            sqlx::query("VACUUM (ANALYZE) pending_jobs")
                .execute(&self.pool)
                .await?;
        }
        Ok(uuids)
    }

    /// Inserts one row (queue `fleet<i % 4>`, the payload of row `i`) in a transaction of its
    /// own on `conn` (autocommit); returns its uuid and when the commit returned.
    async fn insert_row(
        &self,
        conn: &mut PgConnection,
        i: usize,
    ) -> Result<(Uuid, Instant), BoxError> {
        let uuid = Uuid::new_v4();
        // Timed from the INSERT being sent: the row is visible from its commit, which can be
        // before the reply reaches this program, so a clock started at the reply could see the
        // pop come first.
        let sent = Instant::now();
        sqlx::query(
            "INSERT INTO pending_jobs (uuid, queue, job_type, payload)
             VALUES ($1, $2, 'ProcessThing', $3)",
        )
        .bind(uuid)
        .bind(format!("fleet{}", i % QUEUES))
        .bind(payload(i))
        .execute(&mut *conn)
        .await?;
        Ok((uuid, sent))
    }

    /// The lengths of the queues, summed.
    async fn jobs_in_queues(
        &self,
        con: &mut redis::aio::MultiplexedConnection,
    ) -> Result<usize, BoxError> {
        let mut pipe = redis::pipe();
        for q in 0..QUEUES {
            pipe.cmd("LLEN").arg(self.queue_key(q));
        }
        let lens: Vec<usize> = pipe.query_async(con).await?;
        Ok(lens.iter().sum())
    }

    async fn table_empty(&self) -> Result<bool, BoxError> {
        let any: Option<i32> = sqlx::query_scalar("SELECT 1 FROM pending_jobs LIMIT 1")
            .fetch_optional(&self.pool)
            .await?;
        Ok(any.is_none())
    }

    /// The pids of the relays' Postgres backends (their pools and listeners).
    async fn relay_backends(&self) -> Result<Vec<u32>, BoxError> {
        let pids: Vec<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity
             WHERE datname = current_database() AND application_name = $1",
        )
        .bind(RELAY_APP)
        .fetch_all(&self.pool)
        .await?;
        Ok(pids.into_iter().map(|p| p as u32).collect())
    }

    /// Exactly-once: every COPYed uuid is in the queues once, no other job is, and nothing is
    /// left in the table or its dead letters.
    async fn check(&self, uuids: &[Uuid]) -> Result<Value, BoxError> {
        self.check_with(uuids, &[]).await
    }

    /// [`Sandbox::check`], where the jobs a consumer `popped` from the queues (their uuids;
    /// `None`: not a job) count as in the queues.
    async fn check_with(&self, uuids: &[Uuid], popped: &[Option<Uuid>]) -> Result<Value, BoxError> {
        const CHUNK: isize = 10_000;
        let expected: HashSet<Uuid> = uuids.iter().copied().collect();
        let mut seen: HashSet<Uuid> = HashSet::with_capacity(uuids.len());
        let (mut in_queues, mut duplicated, mut unexpected) = (0usize, 0usize, 0usize);
        for uuid in popped {
            in_queues += 1;
            match uuid {
                Some(uuid) if expected.contains(uuid) => {
                    if !seen.insert(*uuid) {
                        duplicated += 1;
                    }
                }
                _ => unexpected += 1,
            }
        }
        let mut con = self.redis_con().await?;
        for q in 0..QUEUES {
            let mut start = 0isize;
            loop {
                let items: Vec<Vec<u8>> = redis::cmd("LRANGE")
                    .arg(self.queue_key(q))
                    .arg(start)
                    .arg(start + CHUNK - 1)
                    .query_async(&mut con)
                    .await?;
                if items.is_empty() {
                    break;
                }
                start += items.len() as isize;
                for bytes in items {
                    in_queues += 1;
                    let job = jobrelay::proto::v1::Job::decode(bytes.as_slice())?;
                    let uuid: Uuid = job.uuid.parse()?;
                    if !expected.contains(&uuid) {
                        unexpected += 1;
                    } else if !seen.insert(uuid) {
                        duplicated += 1;
                    }
                }
            }
        }
        let missing = expected.len() - seen.len();
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM pending_jobs")
            .fetch_one(&self.pool)
            .await?;
        let dead: i64 = sqlx::query_scalar("SELECT count(*) FROM pending_jobs_dead")
            .fetch_one(&self.pool)
            .await?;
        let ok = in_queues == uuids.len()
            && missing == 0
            && duplicated == 0
            && unexpected == 0
            && left == 0
            && dead == 0;
        Ok(json!({
            "exactly_once": ok,
            "jobs_in_queues": in_queues,
            "popped": popped.len(),
            "missing": missing,
            "duplicated": duplicated,
            "unexpected": unexpected,
            "left_in_table": left,
            "dead_lettered": dead,
        }))
    }
}

/// The payload of row `i`: 200 bytes of JSON-ish text, `{"thing_id":<i>,"pad":"xxx...`.
fn payload(i: usize) -> Vec<u8> {
    format!("{{\"thing_id\":{i},\"pad\":\"")
        .bytes()
        .chain(std::iter::repeat(b'x'))
        .take(PAYLOAD_BYTES)
        .collect()
}

/// The benchmark's relays, database, Redis keys and logs, removed at the end of a run or on
/// SIGINT or SIGTERM.
#[derive(Clone)]
struct Leftovers {
    /// The database and the keys.
    scratch: sandbox::Scratch,
    /// Pids of relays started and not yet reaped.
    children: Arc<Mutex<HashSet<u32>>>,
    /// Removed at the end unless FLEET_KEEP_LOGS.
    log_dir: Option<PathBuf>,
}

impl Leftovers {
    /// Kills the relays still running, then removes the database and the keys, and the logs.
    async fn remove(&self) {
        let pids: Vec<u32> = self.children.lock().unwrap().iter().copied().collect();
        for pid in pids {
            // Not reaped yet, so the pid cannot belong to another process.
            let _ = std::process::Command::new("kill")
                .arg("-KILL")
                .arg(pid.to_string())
                .stderr(Stdio::null())
                .status();
        }
        self.scratch.remove().await;
        if let Some(dir) = &self.log_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// One relay process.
struct Relay {
    child: Child,
    pid: u32,
    log: PathBuf,
}

/// Time given to the relays' workers to start after their logs say they are connected.
const SETTLE: Duration = Duration::from_millis(300);

/// The relay processes of one run. Dropped without [`Fleet::stop`] (a failed run), it kills
/// them.
struct Fleet {
    relays: Vec<Relay>,
    registry: Arc<Mutex<HashSet<u32>>>,
}

impl Fleet {
    /// Starts `shape.processes` relays of `shape.workers` workers, logging to
    /// `<log_dir>/<name>-p<i>.log`.
    fn start(sb: &Sandbox, args: &Args, shape: Shape, name: &str) -> Result<Fleet, BoxError> {
        let mut fleet = Fleet {
            relays: Vec::with_capacity(shape.processes),
            registry: sb.leftovers.children.clone(),
        };
        for i in 0..shape.processes {
            let log = sb.log_dir.join(format!("{name}-p{i}.log"));
            let mut cmd = Command::new(&args.relay_bin);
            // The relays run with the defaults, whatever this shell exports.
            for (k, _) in std::env::vars_os() {
                if k.to_string_lossy().starts_with("JOBRELAY_") {
                    cmd.env_remove(k);
                }
            }
            cmd.args(["--http-addr", "off", "--log-format", "json", "--workers"])
                .arg(shape.workers.to_string())
                .arg("--namespace")
                .arg(&sb.namespace)
                .env("DATABASE_URL", &sb.relay_db_url)
                .env("REDIS_URL", &args.redis_url)
                .env("RUST_LOG", "info,jobrelay=debug")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::from(std::fs::File::create(&log)?))
                .kill_on_drop(true);
            let child = cmd
                .spawn()
                .map_err(|e| format!("starting {}: {e}", args.relay_bin.display()))?;
            let pid = child.id().ok_or("a relay exited at once")?;
            fleet.registry.lock().unwrap().insert(pid);
            fleet.relays.push(Relay { child, pid, log });
        }
        Ok(fleet)
    }

    /// Waits until every relay has reached Postgres and Redis (its log says both
    /// "connected"), then [`SETTLE`] for its workers to start.
    async fn wait_ready(&mut self) -> Result<(), BoxError> {
        let t0 = Instant::now();
        loop {
            self.check_alive()?;
            let ready = self.relays.iter().all(|r| {
                let text = std::fs::read_to_string(&r.log).unwrap_or_default();
                text.contains("\"postgres connected\"") && text.contains("\"redis connected\"")
            });
            if ready {
                tokio::time::sleep(SETTLE).await;
                return Ok(());
            }
            if t0.elapsed() > Duration::from_secs(60) {
                return Err("relays not connected after 60 s".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// An error if a relay exited (none should before SIGTERM).
    fn check_alive(&mut self) -> Result<(), BoxError> {
        for r in &mut self.relays {
            if let Some(status) = r.child.try_wait()? {
                self.registry.lock().unwrap().remove(&r.pid);
                return Err(format!(
                    "relay {} exited early ({status}); its log ends with:\n{}",
                    r.pid,
                    log_tail(&r.log)
                )
                .into());
            }
        }
        Ok(())
    }

    /// CPU seconds of the relay processes so far.
    fn cpu_seconds(&self) -> f64 {
        self.relays
            .iter()
            .filter_map(|r| procfs::process_cpu_seconds(r.pid))
            .sum()
    }

    /// CPU counters of each relay process now (for [`procfs::ProcessCpu::since`]).
    fn cpu(&self) -> Vec<procfs::ProcessCpu> {
        self.relays
            .iter()
            .map(|r| procfs::process_cpu(r.pid))
            .collect()
    }

    /// SIGTERM to every relay, then waits for each to exit 0.
    async fn stop(&mut self) -> Result<(), BoxError> {
        for r in &self.relays {
            let status = std::process::Command::new("kill")
                .arg("-TERM")
                .arg(r.pid.to_string())
                .status()?;
            if !status.success() {
                return Err(format!("kill -TERM {} failed", r.pid).into());
            }
        }
        for r in &mut self.relays {
            let status = tokio::time::timeout(EXIT_DEADLINE, r.child.wait())
                .await
                .map_err(|_| {
                    format!(
                        "relay {} still running {EXIT_DEADLINE:?} after SIGTERM",
                        r.pid
                    )
                })??;
            self.registry.lock().unwrap().remove(&r.pid);
            if status.code() != Some(0) {
                return Err(format!(
                    "relay {} exited with {status} after SIGTERM (expected 0); its log ends \
                     with:\n{}",
                    r.pid,
                    log_tail(&r.log)
                )
                .into());
            }
        }
        Ok(())
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        let mut registry = self.registry.lock().unwrap();
        for r in &mut self.relays {
            if registry.remove(&r.pid) {
                let _ = r.child.start_kill();
            }
        }
    }
}

/// The last lines of a log file.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(8)..].join("\n")
}

/// What the relays' logs say about one run.
#[derive(Default)]
struct Logs {
    /// `claim_ms` of every "batch committed" line.
    claim_ms: Vec<f64>,
    /// Batches whose line had no `claim_ms` (a relay binary older than the field).
    without_claim_ms: usize,
    claimed: u64,
    /// Claims that found every claim slot taken ("no claim slot free"): a transaction each.
    slot_misses: u64,
    duplicates: u64,
    first_commit: Option<DateTime<Utc>>,
    last_commit: Option<DateTime<Utc>>,
    warnings: usize,
    first_warning: Option<String>,
}

impl Logs {
    fn read(fleet: &Fleet) -> Result<Logs, BoxError> {
        let mut logs = Logs::default();
        for r in &fleet.relays {
            let text = std::fs::read_to_string(&r.log)?;
            for line in text.lines() {
                let Ok(v) = serde_json::from_str::<Value>(line) else {
                    continue;
                };
                let level = v["level"].as_str().unwrap_or("");
                if level == "WARN" || level == "ERROR" {
                    logs.warnings += 1;
                    logs.first_warning.get_or_insert_with(|| line.to_owned());
                }
                if v["message"] == "no claim slot free" {
                    logs.slot_misses += 1;
                }
                if v["message"] != "batch committed" {
                    continue;
                }
                match v["claim_ms"].as_f64() {
                    Some(ms) => logs.claim_ms.push(ms),
                    None => logs.without_claim_ms += 1,
                }
                logs.claimed += v["claimed"].as_u64().unwrap_or(0);
                logs.duplicates += v["duplicates"].as_u64().unwrap_or(0);
                if let Some(at) = v["timestamp"]
                    .as_str()
                    .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                {
                    let at = at.with_timezone(&Utc);
                    logs.first_commit = Some(logs.first_commit.map_or(at, |f| f.min(at)));
                    logs.last_commit = Some(logs.last_commit.map_or(at, |l| l.max(at)));
                }
            }
        }
        if logs.without_claim_ms > 0 {
            return Err(format!(
                "{} \"batch committed\" lines without claim_ms: the relay binary predates \
                 the field; run `cargo build --release` (or point JOBRELAY_BIN at a current \
                 binary)",
                logs.without_claim_ms
            )
            .into());
        }
        Ok(logs)
    }
}

/// CPU counters at one instant.
struct Snapshot {
    at: Instant,
    busy: f64,
    postgres: Option<HashMap<u32, f64>>,
    redis: Option<f64>,
}

impl Snapshot {
    async fn take(redis: &redis::Client) -> Snapshot {
        Snapshot {
            redis: procfs::redis_cpu_seconds(redis).await,
            at: Instant::now(),
            busy: procfs::machine_busy_seconds(),
            postgres: procfs::postgres_cpu_seconds(),
        }
    }

    /// CPU seconds of the Postgres processes `pids` (all of them when `None`) since `earlier`;
    /// a process that started meanwhile counts whole, one that exited is left out.
    fn postgres_since(&self, earlier: &Snapshot, pids: Option<&[u32]>) -> Option<f64> {
        let (now, then) = (self.postgres.as_ref()?, earlier.postgres.as_ref()?);
        let delta = |pid: &u32| {
            now.get(pid)
                .map(|cpu| cpu - then.get(pid).copied().unwrap_or(0.0))
        };
        Some(match pids {
            Some(pids) => pids.iter().filter_map(delta).sum(),
            None => now.keys().filter_map(delta).sum(),
        })
    }
}

/// The 1-minute load average of the host.
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// p50, p99 and max of claim durations.
fn claim_stats(ms: &[f64]) -> Value {
    let mut v = ms.to_vec();
    v.sort_by(f64::total_cmp);
    json!({
        "batches": v.len(),
        "p50": round(percentile(&v, 0.50), 3),
        "p99": round(percentile(&v, 0.99), 3),
        "max": round(v.last().copied().unwrap_or(0.0), 3),
    })
}

/// One drain by the relays of `shape`; the run's figures, and its claim durations.
/// How the table stood when the rows landed.
fn table_state(vacuumed: bool) -> &'static str {
    if vacuumed {
        "VACUUM (ANALYZE) after the COPY (FLEET_VACUUMED: not a production state)"
    } else {
        "analysed while empty, then COPYed in one transaction"
    }
}

async fn drain(
    sb: &Sandbox,
    args: &Args,
    round_no: usize,
    config: &str,
    shape: Shape,
) -> Result<(Value, Vec<f64>), BoxError> {
    sb.reset_table().await?;
    // The relays run before the rows arrive, as a fleet of sidecars does: the clock measures
    // draining a backlog that commits at once, not starting processes.
    let mut fleet = Fleet::start(sb, args, shape, &format!("round{round_no}-{config}"))?;
    fleet.wait_ready().await?;
    let mut con = sb.redis_con().await?;
    let load = load_average();
    let uuids = sb.copy_rows(args.rows, args.vacuumed).await?;
    let before = Snapshot::take(&sb.redis).await;
    let spawned_at: DateTime<Utc> = SystemTime::now().into();
    let t0 = Instant::now();
    loop {
        fleet.check_alive()?;
        if sb.jobs_in_queues(&mut con).await? >= args.rows && sb.table_empty().await? {
            break;
        }
        if t0.elapsed() > args.timeout {
            return Err(format!(
                "{config} (round {round_no}): not drained after {:?}",
                args.timeout
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let seconds = t0.elapsed().as_secs_f64();
    let backends = sb.relay_backends().await?;
    let after = Snapshot::take(&sb.redis).await;
    let relay_cpu = fleet.cpu_seconds();
    fleet.stop().await?;
    let logs = Logs::read(&fleet)?;
    drop(fleet);
    let check = sb.check(&uuids).await?;
    let mut con = sb.redis_con().await?;
    sandbox::unlink_keys(&mut con, &sb.namespace).await;

    let rows = args.rows as f64;
    let us_per_row = |s: f64| round(s * 1e6 / rows, 2);
    let wall = after.at.duration_since(before.at).as_secs_f64();
    let pg_relay = after.postgres_since(&before, Some(&backends));
    let pg_all = after.postgres_since(&before, None);
    let redis = after.redis.zip(before.redis).map(|(a, b)| a - b);
    let ms_after = |at: Option<DateTime<Utc>>| {
        at.map(|t| round((t - spawned_at).as_seconds_f64() * 1000.0, 1))
    };
    let run = json!({
        "round": round_no,
        "config": config,
        "table_state": table_state(args.vacuumed),
        "processes": shape.processes,
        "workers": shape.workers,
        "rows": args.rows,
        "seconds": round(seconds, 3),
        "rows_per_second": round(rows / seconds, 0),
        "claim_ms": claim_stats(&logs.claim_ms),
        "rows_per_batch": round(logs.claimed as f64 / logs.claim_ms.len().max(1) as f64, 1),
        "slot_misses": logs.slot_misses,
        "pg_us_per_row": pg_relay.map(us_per_row),
        "pg_all_us_per_row": pg_all.map(us_per_row),
        "relay_us_per_row": us_per_row(relay_cpu),
        "redis_us_per_row": redis.map(us_per_row),
        "busy_cores": round((after.busy - before.busy) / wall.max(1e-9), 2),
        "relay_backends": backends.len(),
        "first_commit_ms": ms_after(logs.first_commit),
        "last_commit_ms": ms_after(logs.last_commit),
        "duplicates_logged": logs.duplicates,
        "log_warnings": logs.warnings,
        "first_warning": logs.first_warning,
        "load_average_before": load,
        "check": check,
    });
    note!(
        "fleet: round {round_no} {config:<8} {}x{}: {} rows in {:.2} s = {:.0} rows/s; claim ms \
         p50/p99/max {}/{}/{} ({} batches, {} slot misses); PG µs/row {} (all of Postgres {}); \
         exactly once: {}",
        shape.processes,
        shape.workers,
        args.rows,
        seconds,
        rows / seconds,
        show(&run["claim_ms"]["p50"]),
        show(&run["claim_ms"]["p99"]),
        show(&run["claim_ms"]["max"]),
        run["claim_ms"]["batches"],
        logs.slot_misses,
        show(&run["pg_us_per_row"]),
        show(&run["pg_all_us_per_row"]),
        run["check"]["exactly_once"],
    );
    Ok((run, logs.claim_ms))
}

/// The idle-fleet targets of the issue: Postgres CPU (all of it) while the fleet idles, as a
/// percentage of one core, and a single row's latency p99.
const IDLE_PG_TARGET_PCT: f64 = 5.0;
const IDLE_P99_TARGET_MS: f64 = 50.0;
/// Quiet time after the idle fleet is ready and before its CPU is measured: 24 processes that
/// just started are still opening their pools on a small machine.
const IDLE_SETTLE: Duration = Duration::from_secs(2);
/// Longest wait for a series' last rows to be popped after its last insert.
const POP_DEADLINE: Duration = Duration::from_secs(30);

/// A job the consumer popped: its uuid (`None`: not a job) and when BRPOP returned it.
struct Popped {
    uuid: Option<Uuid>,
    at: Instant,
}

/// A thread that BRPOPs the queues on a blocking connection of its own and hands every job
/// over with the instant it arrived. Dropped, it stops within a second.
struct Consumer {
    stop: Arc<std::sync::atomic::AtomicBool>,
    incoming: std::sync::mpsc::Receiver<Popped>,
    /// What it popped so far (see [`Consumer::collect`]).
    popped: Vec<Popped>,
    thread: Option<std::thread::JoinHandle<Result<(), String>>>,
}

impl Consumer {
    fn start(sb: &Sandbox) -> Result<Consumer, BoxError> {
        let keys: Vec<String> = (0..QUEUES).map(|q| sb.queue_key(q)).collect();
        let mut con = sb.redis.get_connection()?;
        con.set_read_timeout(Some(Duration::from_secs(10)))?;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (tx, incoming) = std::sync::mpsc::channel();
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || -> Result<(), String> {
            while !stopped.load(std::sync::atomic::Ordering::SeqCst) {
                let item: Option<(String, Vec<u8>)> = redis::cmd("BRPOP")
                    .arg(&keys)
                    .arg(1)
                    .query(&mut con)
                    .map_err(|e| format!("BRPOP: {e}"))?;
                let at = Instant::now();
                if let Some((_, bytes)) = item {
                    let uuid = jobrelay::proto::v1::Job::decode(bytes.as_slice())
                        .ok()
                        .and_then(|job| job.uuid.parse().ok());
                    if tx.send(Popped { uuid, at }).is_err() {
                        break;
                    }
                }
            }
            Ok(())
        });
        Ok(Consumer {
            stop,
            incoming,
            popped: Vec::new(),
            thread: Some(thread),
        })
    }

    /// Takes in what the thread popped so far; an error if the thread ended early.
    fn collect(&mut self) -> Result<(), BoxError> {
        self.popped.extend(self.incoming.try_iter());
        if self.thread.as_ref().is_some_and(|t| t.is_finished()) {
            self.finish()?;
            return Err("the consumer stopped early".into());
        }
        Ok(())
    }

    /// Waits until every uuid of `want` was popped, or [`POP_DEADLINE`].
    async fn wait_for(&mut self, want: &[Uuid]) -> Result<(), BoxError> {
        let t0 = Instant::now();
        loop {
            self.collect()?;
            let seen: HashSet<Uuid> = self.popped.iter().filter_map(|p| p.uuid).collect();
            if want.iter().all(|u| seen.contains(u)) || t0.elapsed() > POP_DEADLINE {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Stops the thread, waits for it (at most a BRPOP's second), and takes in the rest of what
    /// it popped.
    fn finish(&mut self) -> Result<(), BoxError> {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let result = match self.thread.take() {
            Some(t) => t.join().map_err(|_| "the consumer panicked")?,
            None => Ok(()),
        };
        self.popped.extend(self.incoming.try_iter());
        Ok(result?)
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A signed duration `later - earlier` in milliseconds.
fn ms_between(earlier: Instant, later: Instant) -> f64 {
    match later.checked_duration_since(earlier) {
        Some(d) => d.as_secs_f64() * 1000.0,
        None => -(earlier.duration_since(later).as_secs_f64() * 1000.0),
    }
}

/// One latency series: `rows` rows inserted one by one, each in its own transaction, `gap`
/// apart (`quiet`: `gap` of silence before each row, so that each finds the fleet idle;
/// else on a fixed schedule, one every `gap`), then until all were popped. The rows' uuids
/// and commit instants, in order.
async fn latency_series(
    sb: &Sandbox,
    consumer: &mut Consumer,
    fleet: &mut Fleet,
    rows: usize,
    gap: Duration,
    quiet: bool,
    first: usize,
) -> Result<Vec<(Uuid, Instant)>, BoxError> {
    let mut conn = sb.pool.acquire().await?;
    let mut committed = Vec::with_capacity(rows);
    let start = tokio::time::Instant::now();
    for i in 0..rows {
        if quiet {
            tokio::time::sleep(gap).await;
        } else {
            tokio::time::sleep_until(start + gap * i as u32).await;
        }
        fleet.check_alive()?;
        consumer.collect()?;
        committed.push(sb.insert_row(&mut conn, first + i).await?);
    }
    drop(conn);
    let want: Vec<Uuid> = committed.iter().map(|(u, _)| *u).collect();
    consumer.wait_for(&want).await?;
    Ok(committed)
}

/// Latency figures of one series: from each commit to its pop.
fn latency_stats(
    name: &str,
    committed: &[(Uuid, Instant)],
    popped: &HashMap<Uuid, Instant>,
    gap: Duration,
) -> Value {
    let mut ms: Vec<f64> = committed
        .iter()
        .filter_map(|(u, at)| popped.get(u).map(|p| ms_between(*at, *p)))
        .collect();
    ms.sort_by(f64::total_cmp);
    let missing = committed.len() - ms.len();
    let p99 = percentile(&ms, 0.99);
    json!({
        "series": name,
        "rows": committed.len(),
        "gap_ms": round(gap.as_secs_f64() * 1000.0, 1),
        "popped": ms.len(),
        "missing": missing,
        "p50": round(percentile(&ms, 0.50), 2),
        "p90": round(percentile(&ms, 0.90), 2),
        "p99": round(p99, 2),
        "max": round(ms.last().copied().unwrap_or(0.0), 2),
        "mean": round(ms.iter().sum::<f64>() / ms.len().max(1) as f64, 2),
        "p99_ok": missing == 0 && !ms.is_empty() && p99 <= IDLE_P99_TARGET_MS,
    })
}

/// The idle-fleet stage (issue: "an idle fleet is cheap and still quick"): `relays` relays of
/// the default workers on an empty table; the CPU of all of Postgres, of the relays and of
/// Redis while they idle; then single rows' latency from commit to a consumer's BRPOP.
async fn idle_stage(sb: &Sandbox, args: &Args, idle: &IdleArgs) -> Result<Value, BoxError> {
    let shape = Shape {
        processes: idle.relays,
        workers: jobrelay::config::DEFAULT_WORKERS,
    };
    sb.reset_table().await?;
    let max_connections: String = sqlx::query_scalar("SHOW max_connections")
        .fetch_one(&sb.pool)
        .await?;
    let mut fleet = Fleet::start(sb, args, shape, "idle")?;
    fleet.wait_ready().await?;
    tokio::time::sleep(IDLE_SETTLE).await;
    fleet.check_alive()?;

    // Idle cost.
    let load = load_average();
    let before = Snapshot::take(&sb.redis).await;
    let relays_before = fleet.cpu();
    tokio::time::sleep(idle.window).await;
    let relays_after = fleet.cpu();
    let after = Snapshot::take(&sb.redis).await;
    fleet.check_alive()?;
    let backends = sb.relay_backends().await?;
    let wall = after.at.duration_since(before.at).as_secs_f64();
    let pct = |cpu: f64| round(cpu / wall * 100.0, 3);
    let pg_all = after.postgres_since(&before, None).map(pct);
    let pg_relay = after.postgres_since(&before, Some(&backends)).map(pct);
    let relays: Option<f64> = relays_after
        .iter()
        .zip(&relays_before)
        .map(|(a, b)| a.since(b))
        .sum();
    let redis = after.redis.zip(before.redis).map(|(a, b)| pct(a - b));

    // Latency: a consumer BRPOPs while single rows commit.
    let mut consumer = Consumer::start(sb)?;
    let steady = latency_series(
        sb,
        &mut consumer,
        &mut fleet,
        idle.latency_rows,
        idle.latency_gap,
        false,
        0,
    )
    .await?;
    let quiet = latency_series(
        sb,
        &mut consumer,
        &mut fleet,
        idle.quiet_rows,
        idle.quiet_gap,
        true,
        idle.latency_rows,
    )
    .await?;
    consumer.finish()?;
    let popped = std::mem::take(&mut consumer.popped);
    drop(consumer);
    fleet.stop().await?;
    let logs = Logs::read(&fleet)?;
    drop(fleet);
    let uuids: Vec<Uuid> = steady.iter().chain(&quiet).map(|(u, _)| *u).collect();
    let popped_uuids: Vec<Option<Uuid>> = popped.iter().map(|p| p.uuid).collect();
    let check = sb.check_with(&uuids, &popped_uuids).await?;
    let mut con = sb.redis_con().await?;
    sandbox::unlink_keys(&mut con, &sb.namespace).await;

    let mut first_pop: HashMap<Uuid, Instant> = HashMap::new();
    for p in &popped {
        if let Some(u) = p.uuid {
            first_pop.entry(u).or_insert(p.at);
        }
    }
    let steady = latency_stats("steady", &steady, &first_pop, idle.latency_gap);
    let quiet =
        (idle.quiet_rows > 0).then(|| latency_stats("quiet", &quiet, &first_pop, idle.quiet_gap));
    let pg_ok = pg_all.is_some_and(|p| p <= IDLE_PG_TARGET_PCT);
    let report = json!({
        "relays": shape.processes,
        "workers": shape.workers,
        "relay_backends": backends.len(),
        "max_connections": max_connections.parse::<u64>().ok(),
        "seconds": round(wall, 3),
        "pg_pct_of_core": pg_all,
        "pg_relay_backends_pct_of_core": pg_relay,
        "relays_pct_of_core": relays.map(pct),
        "redis_pct_of_core": redis,
        "busy_cores": round((after.busy - before.busy) / wall.max(1e-9), 3),
        "load_average_before": load,
        "latency_ms": { "steady": steady, "quiet": quiet },
        "targets": {
            "pg_pct_of_core": IDLE_PG_TARGET_PCT,
            "p99_ms": IDLE_P99_TARGET_MS,
            "pg_ok": pg_ok,
            "p99_ok": steady["p99_ok"],
        },
        "batches": logs.claim_ms.len(),
        "claimed": logs.claimed,
        "log_warnings": logs.warnings,
        "first_warning": logs.first_warning,
        "check": check,
    });
    let verdict = |ok: bool| if ok { "PASS" } else { "FAIL" };
    let pct_text = |v: &Value| {
        v.as_f64()
            .map_or_else(|| "n/a".to_owned(), |x| format!("{x:.2} %"))
    };
    note!(
        "fleet: idle {}x{}: Postgres {} of a core over {:.1} s (relays' {} backends {}) [target \
         ≤ {IDLE_PG_TARGET_PCT} %: {}]; relays {}, Redis {}",
        shape.processes,
        shape.workers,
        pct_text(&report["pg_pct_of_core"]),
        wall,
        backends.len(),
        pct_text(&report["pg_relay_backends_pct_of_core"]),
        verdict(pg_ok),
        pct_text(&report["relays_pct_of_core"]),
        pct_text(&report["redis_pct_of_core"]),
    );
    let series = |s: &Value| {
        format!(
            "{} ms gap: commit -> BRPOP ms p50/p99/max {}/{}/{} ({} rows{}) [p99 ≤ \
             {IDLE_P99_TARGET_MS} ms: {}]",
            show(&s["gap_ms"]),
            show(&s["p50"]),
            show(&s["p99"]),
            show(&s["max"]),
            s["rows"],
            match s["missing"].as_u64() {
                Some(0) | None => String::new(),
                Some(n) => format!(", {n} NOT popped"),
            },
            verdict(s["p99_ok"] == true),
        )
    };
    note!(
        "fleet: idle {}x{}: {}",
        shape.processes,
        shape.workers,
        series(&report["latency_ms"]["steady"])
    );
    if !report["latency_ms"]["quiet"].is_null() {
        note!(
            "fleet: idle {}x{}: {}",
            shape.processes,
            shape.workers,
            series(&report["latency_ms"]["quiet"])
        );
    }
    note!(
        "fleet: idle {}x{}: exactly once: {}; {} log warnings{}",
        shape.processes,
        shape.workers,
        report["check"]["exactly_once"],
        logs.warnings,
        report["first_warning"]
            .as_str()
            .map_or_else(String::new, |w| format!(", first: {w}")),
    );
    Ok(report)
}

/// A JSON number as `{}` prints an f64 (80000, 0.853), anything else as JSON.
fn show(v: &Value) -> String {
    v.as_f64().map_or_else(|| v.to_string(), |x| x.to_string())
}

/// Medians over the runs of one configuration.
fn summarize(shape: Shape, runs: &[&Value], all_claims: &[f64]) -> Value {
    let med = |f: &dyn Fn(&Value) -> Option<f64>| {
        let v: Vec<f64> = runs.iter().filter_map(|r| f(r)).collect();
        (!v.is_empty()).then(|| round(median(&v), 3))
    };
    json!({
        "processes": shape.processes,
        "workers": shape.workers,
        "runs": runs.len(),
        "rows_per_second": med(&|r| r["rows_per_second"].as_f64()),
        "rows_per_second_each_run": runs.iter().map(|r| r["rows_per_second"].clone()).collect::<Vec<_>>(),
        "claim_ms": {
            "p50": med(&|r| r["claim_ms"]["p50"].as_f64()),
            "p99": med(&|r| r["claim_ms"]["p99"].as_f64()),
            "max": med(&|r| r["claim_ms"]["max"].as_f64()),
        },
        "claim_ms_all_batches": claim_stats(all_claims),
        "pg_us_per_row": med(&|r| r["pg_us_per_row"].as_f64()),
        "pg_all_us_per_row": med(&|r| r["pg_all_us_per_row"].as_f64()),
        "relay_us_per_row": med(&|r| r["relay_us_per_row"].as_f64()),
        "redis_us_per_row": med(&|r| r["redis_us_per_row"].as_f64()),
        "busy_cores": med(&|r| r["busy_cores"].as_f64()),
    })
}

async fn run(args: &Args, sb: &Sandbox) -> Result<Value, BoxError> {
    let mut runs = Vec::new();
    let mut claims: HashMap<&str, Vec<f64>> = HashMap::new();
    let mut ratios = Vec::new();
    for round_no in 1..=args.rounds {
        let mut rates = [0.0; 2];
        for (i, (config, shape)) in [("baseline", BASELINE), ("fleet", args.fleet)]
            .into_iter()
            .enumerate()
        {
            let (r, c) = drain(sb, args, round_no, config, shape).await?;
            rates[i] = r["rows_per_second"].as_f64().unwrap_or(0.0);
            claims.entry(config).or_default().extend(c);
            runs.push(r);
        }
        ratios.push(round(rates[1] / rates[0], 3));
    }
    let of =
        |config: &str| -> Vec<&Value> { runs.iter().filter(|r| r["config"] == config).collect() };
    let baseline = summarize(BASELINE, &of("baseline"), &claims["baseline"]);
    let fleet = summarize(args.fleet, &of("fleet"), &claims["fleet"]);
    let rounds_exactly_once = runs.iter().all(|r| r["check"]["exactly_once"] == true);
    let of_medians = fleet["rows_per_second"].as_f64().unwrap_or(0.0)
        / baseline["rows_per_second"]
            .as_f64()
            .unwrap_or(f64::INFINITY);
    let ratio = json!({
        "per_round": ratios,
        "median": round(median(&ratios), 3),
        "of_medians": round(of_medians, 3),
    });
    let row = |what: &str, b: String, f: String| note!("  {what:<30} {b:>18} {f:>18}");
    let claims = |c: &Value| {
        format!(
            "{}/{}/{}",
            show(&c["p50"]),
            show(&c["p99"]),
            show(&c["max"])
        )
    };
    note!(
        "fleet: medians of {} rounds {:>24} {:>18}",
        args.rounds,
        "baseline 1x2",
        format!("fleet {}x{}", args.fleet.processes, args.fleet.workers)
    );
    row(
        "rows/s",
        show(&baseline["rows_per_second"]),
        show(&fleet["rows_per_second"]),
    );
    row(
        "claim ms p50/p99/max",
        claims(&baseline["claim_ms"]),
        claims(&fleet["claim_ms"]),
    );
    row(
        "PG µs/row (relays' backends)",
        show(&baseline["pg_us_per_row"]),
        show(&fleet["pg_us_per_row"]),
    );
    row(
        "PG µs/row (all of Postgres)",
        show(&baseline["pg_all_us_per_row"]),
        show(&fleet["pg_all_us_per_row"]),
    );
    note!(
        "  ratio fleet/baseline: median {} (rounds: {}); exactly once: {rounds_exactly_once}",
        show(&ratio["median"]),
        ratios
            .iter()
            .map(|r| r.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let idle = match &args.idle {
        Some(idle) => idle_stage(sb, args, idle).await?,
        None => Value::Null,
    };
    let exactly_once =
        rounds_exactly_once && (idle.is_null() || idle["check"]["exactly_once"] == true);
    Ok(json!({
        "settings": {
            "rows": args.rows,
            "rounds": args.rounds,
            "baseline": { "processes": BASELINE.processes, "workers": BASELINE.workers },
            "fleet": { "processes": args.fleet.processes, "workers": args.fleet.workers },
            "batch_size": jobrelay::config::DEFAULT_BATCH_SIZE,
            "queues": QUEUES,
            "payload_bytes": PAYLOAD_BYTES,
            "relay_bin": args.relay_bin.display().to_string(),
            "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            "idle": args.idle.as_ref().map(|i| json!({
                "relays": i.relays,
                "seconds": i.window.as_secs_f64(),
                "latency_rows": i.latency_rows,
                "latency_gap_ms": i.latency_gap.as_secs_f64() * 1000.0,
                "quiet_rows": i.quiet_rows,
                "quiet_gap_ms": i.quiet_gap.as_secs_f64() * 1000.0,
            })),
        },
        "runs": runs,
        "baseline": baseline,
        "fleet": fleet,
        "ratio": ratio,
        "idle": idle,
        "exactly_once": exactly_once,
    }))
}

/// Runs the whole benchmark in a database, namespace and log directory of its own, removed
/// afterwards even when a run fails; returns the JSON report.
pub async fn fleet(args: &Args) -> Result<Value, BoxError> {
    fleet_in_sandbox(args, false).await
}

/// [`fleet`]; with `on_signal`, SIGINT or SIGTERM kills the relays, removes the database, keys
/// and logs, and exits 130 (only for the program: a test must not take over its process's
/// signals).
async fn fleet_in_sandbox(args: &Args, on_signal: bool) -> Result<Value, BoxError> {
    warn_if_stale(&args.relay_bin);
    let sb = Sandbox::create(args).await?;
    let sandbox = json!({
        "database": sb.db_name.clone(),
        "namespace": sb.namespace.clone(),
        "logs": args.keep_logs.then(|| sb.log_dir.display().to_string()),
    });
    let on_signal = on_signal.then(|| {
        let leftovers = sb.leftovers.clone();
        tokio::spawn(async move {
            let what = leftovers.scratch.db_name.clone();
            sandbox::remove_on_signal("fleet", what, leftovers.remove()).await
        })
    });
    let result = run(args, &sb).await;
    if sandbox::interrupted() {
        // The run failed because its database is being dropped: let the handler finish.
        std::future::pending::<()>().await;
    }
    if let Some(task) = on_signal {
        task.abort();
    }
    sb.cleanup().await;
    let mut report = result?;
    report["sandbox"] = sandbox;
    Ok(report)
}

#[tokio::main]
async fn main() {
    let report = match Args::from_env() {
        Ok(args) => fleet_in_sandbox(&args, true).await,
        Err(e) => Err(e),
    };
    match report {
        Ok(report) => {
            println!(
                "{}",
                serde_json::to_string_pretty(&report).expect("a JSON value")
            );
            if report["exactly_once"] != true {
                note!(
                    "fleet: exactly-once did NOT hold (see each run's \"check\" and the idle \
                     stage's)"
                );
                std::process::exit(1);
            }
        }
        Err(e) => {
            note!("fleet: {e}");
            std::process::exit(1);
        }
    }
}
