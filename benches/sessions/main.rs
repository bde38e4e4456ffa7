//! The relay's own Postgres sessions (issue 34), measured on a private Postgres and a private
//! Redis: the wake-up lock through a large drain and a steady stream, the xmin horizon the
//! relay's sessions hold, and a fleet of relays refused by a server short of connections.
//!
//! ```text
//! cargo bench --bench sessions
//! SESSIONS_PHASES=fleet SESSIONS_RELAY_BIN=/tmp/jobrelay-before cargo bench --bench sessions
//! ```
//!
//! Starts its own Postgres (the newest under `/usr/lib/postgresql`, `initdb` in a temporary
//! directory run as the `postgres` OS user, `max_connections` `SESSIONS_MAX_CONNECTIONS`
//! (100), `track_functions = all` so that the notify trigger's function calls are counted) and
//! its own `redis-server`, then runs the relay binary (`SESSIONS_RELAY_BIN`, default the one
//! cargo built; another build gives the figures "before") with its defaults. Phases
//! (`SESSIONS_PHASES`, default `drain,stream,fleet`):
//!
//! - **drain**: `SESSIONS_DRAIN_ROWS` (1,000,000) rows inserted in one transaction, while a
//!   producer commits `SESSIONS_DRAIN_PRODUCER` (1; 0: none) rows every 10 ms; until the
//!   outbox is empty.
//! - **stream**: `SESSIONS_STREAM_RATE` rows/s (1,000; 10 rows every 10 ms) for
//!   `SESSIONS_STREAM_SECS` (600).
//!
//!   For both, every second: whether a relay session holds the wake-up lock, the oldest
//!   `backend_xmin` among the relay's sessions (how long the same session kept the same one,
//!   which bounds how long it held a snapshot from below), the relay's
//!   `jobrelay_xmin_horizon_age_seconds` (from the 10th second on: before, it may still show
//!   the backlog's own insert); at the end the outbox's `n_dead_tup`, the notify
//!   function's calls (`pg_stat_user_functions`: a producer notifies only while no relay holds
//!   the lock) against the producer's commits, and the server log's `idle-in-transaction`
//!   terminations.
//! - **fleet**: a role of its own (not a superuser: the reserved slots are not its), every
//!   slot it could have held by idle sessions, then `SESSIONS_FLEET` (30) relays started for
//!   `SESSIONS_FLEET_SECS` (60). The server log's refusals (`FATAL` with SQLSTATE 53300; the
//!   server logs `%e`) per second, per relay, and the postmaster's CPU with its reaped children
//!   (`/proc/<pid>/stat` utime + stime + cutime + cstime: each refused attempt is a backend
//!   forked and reaped) in percent of a core.
//!
//! Prints one JSON object on stdout; lines on stderr as it goes.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sqlx::{Connection, PgConnection, Row};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(default)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn pg_bin() -> PathBuf {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("/usr/lib/postgresql")
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let v = e.file_name().to_string_lossy().parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions.pop().expect("an initdb").1
}

fn run_tool(cmd: &mut Command) {
    let out = cmd.stdin(Stdio::null()).output().expect("starts");
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A private Postgres, stopped on drop.
struct Pg {
    dir: tempfile::TempDir,
    port: u16,
}

impl Pg {
    fn start(max_connections: u32) -> Pg {
        let dir = tempfile::Builder::new()
            .prefix("jobrelay-sessions-")
            .tempdir()
            .unwrap();
        run_tool(
            Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path()),
        );
        let data = dir.path().join("data");
        run_tool(
            Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(pg_bin().join("initdb"))
                .arg("-D")
                .arg(&data)
                .args(["-U", "postgres", "--auth=trust", "--no-sync"]),
        );
        let port = free_port();
        let opts = format!(
            "-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off \
             -c max_connections={max_connections} -c track_functions=all \
             -c log_line_prefix='%m [%p] %e ' -c shared_buffers=256MB",
            sock = dir.path().display()
        );
        run_tool(
            Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(pg_bin().join("pg_ctl"))
                .arg("-D")
                .arg(&data)
                .arg("-l")
                .arg(dir.path().join("postgres.log"))
                .args(["-w", "-t", "60", "-o", &opts, "start"])
                .stdout(Stdio::null()),
        );
        Pg { dir, port }
    }

    fn url(&self, user: &str) -> String {
        format!("postgres://{user}@127.0.0.1:{}/postgres", self.port)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default()
    }

    fn postmaster_pid(&self) -> u32 {
        std::fs::read_to_string(self.dir.path().join("data/postmaster.pid"))
            .unwrap()
            .lines()
            .next()
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }
}

impl Drop for Pg {
    fn drop(&mut self) {
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(pg_bin().join("pg_ctl"))
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-w", "-m", "immediate", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// A private Redis, killed on drop.
struct Redis {
    child: std::process::Child,
    port: u16,
}

impl Redis {
    fn start() -> Redis {
        let port = free_port();
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server");
        std::thread::sleep(Duration::from_millis(300));
        Redis { child, port }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// CPU seconds of `pid` and its reaped children (`/proc/<pid>/stat` fields 14-17).
fn cpu_with_children(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, a)| a);
    let f: Vec<f64> = after
        .split_whitespace()
        .skip(11)
        .take(4)
        .filter_map(|x| x.parse().ok())
        .collect();
    f.iter().sum::<f64>() / 100.0
}

/// A gauge of the relay's `/metrics`.
async fn gauge(port: u16, name: &str) -> Option<f64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .await
        .ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).await.ok()?;
    body.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// A relay process, killed on drop unless [`stop`]ped.
struct Running(Option<std::process::Child>);

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn relay(bin: &Path, url: &str, redis: u16, http: Option<u16>, log: &Path) -> Running {
    let mut cmd = Command::new(bin);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("JOBRELAY_") {
            cmd.env_remove(k);
        }
    }
    let addr = http.map_or("off".to_owned(), |p| format!("127.0.0.1:{p}"));
    cmd.args(["--http-addr", &addr, "--log-format", "json"])
        .env("DATABASE_URL", url)
        .env("REDIS_URL", format!("redis://127.0.0.1:{redis}"))
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(log).unwrap()))
        .spawn()
        .map(|c| Running(Some(c)))
        .expect("the relay binary")
}

fn stop(mut running: Running) {
    let Some(mut child) = running.0.take() else {
        return;
    };
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(40) {
        if child.try_wait().ok().flatten().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Calls of the notify trigger's function so far (`track_functions = all`).
async fn notify_calls(admin: &mut PgConnection) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT COALESCE((SELECT calls FROM pg_stat_user_functions
                          WHERE funcname = 'jobrelay_notify'), 0)",
    )
    .fetch_one(admin)
    .await
}

fn count(log: &str, needle: &str) -> usize {
    log.lines().filter(|l| l.contains(needle)).count()
}

/// One busy phase (drain or stream) with the relay running; returns its figures.
async fn busy_phase(
    pg: &Pg,
    bin: &Path,
    redis: &Redis,
    name: &str,
    drain_rows: i64,
    rate: u32,
    secs: u64,
) -> Result<Value, BoxError> {
    let url = pg.url("postgres");
    let mut admin = PgConnection::connect(&url).await?;
    sqlx::query("TRUNCATE pending_jobs")
        .execute(&mut admin)
        .await?;
    sqlx::query("SELECT pg_stat_reset()")
        .execute(&mut admin)
        .await?;
    let http = free_port();
    let log = std::env::temp_dir().join(format!("jobrelay-sessions-{name}-{http}.log"));
    let child = relay(bin, &url, redis.port, Some(http), &log);
    let t0 = Instant::now();
    while gauge(http, "jobrelay_up").await.is_none() && t0.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log_before = pg.log().len();
    // The producer: `per_tick` rows every 10 ms, each tick a transaction of its own.
    // While a backlog drains, one row every 10 ms (`SESSIONS_DRAIN_PRODUCER` rows; 0: none,
    // the issue's reproduction: nothing but the backlog).
    let per_tick = if drain_rows > 0 {
        env_or("SESSIONS_DRAIN_PRODUCER", 1u32)
    } else {
        (rate / 100).max(1)
    };
    let stop_producer = tokio_util::sync::CancellationToken::new();
    let commits = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let producer = {
        let (url, stop, counted) = (url.clone(), stop_producer.clone(), commits.clone());
        tokio::spawn(async move {
            let mut con = PgConnection::connect(&url).await.unwrap();
            let mut commits = 0u64;
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            while !stop.is_cancelled() {
                tick.tick().await;
                if per_tick == 0 {
                    continue;
                }
                sqlx::query(
                    "INSERT INTO pending_jobs (queue, job_type)
                     SELECT 'stream', 'Bench' FROM generate_series(1, $1)",
                )
                .bind(per_tick as i32)
                .execute(&mut con)
                .await
                .unwrap();
                commits += 1;
                counted.store(commits, std::sync::atomic::Ordering::Relaxed);
            }
            commits
        })
    };
    let started = Instant::now();
    if drain_rows > 0 {
        sqlx::query(
            "INSERT INTO pending_jobs (queue, job_type)
             SELECT 'drain', 'Bench' FROM generate_series(1, $1)",
        )
        .bind(drain_rows)
        .execute(&mut admin)
        .await?;
        eprintln!(
            "{name}: {drain_rows} rows committed in {:?}",
            started.elapsed()
        );
    }
    // Counted from here: the busy part (before it, an idle relay's producers notify).
    sqlx::query("SELECT pg_stat_clear_snapshot()")
        .execute(&mut admin)
        .await?;
    let notifies_before = notify_calls(&mut admin).await?;
    let commits_before = commits.load(std::sync::atomic::Ordering::Relaxed);
    let busy_from = Instant::now();
    let (mut samples, mut held) = (0u64, 0u64);
    let mut horizon_max = 0f64;
    // (pid, backend_xmin) of relay sessions, and when each was first seen.
    let mut seen: std::collections::HashMap<(i32, String), Instant> = Default::default();
    let mut xmin_held_max = 0f64;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        samples += 1;
        let lock: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted
                            AND mode = 'ExclusiveLock' AND classid = 27250)",
        )
        .fetch_one(&mut admin)
        .await?;
        held += u64::from(lock);
        let rows = sqlx::query(
            "SELECT pid, backend_xmin::text FROM pg_stat_activity
             WHERE application_name = 'jobrelay' AND backend_xmin IS NOT NULL",
        )
        .fetch_all(&mut admin)
        .await?;
        let now = Instant::now();
        let current: std::collections::HashSet<(i32, String)> =
            rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        seen.retain(|k, _| current.contains(k));
        for k in current {
            let first = *seen.entry(k).or_insert(now);
            xmin_held_max = xmin_held_max.max(now.duration_since(first).as_secs_f64());
        }
        // After the first 10 s: until then the gauge may still show the backlog's own
        // insert (a transaction of tens of seconds, a holder of the horizon while it ran).
        if busy_from.elapsed() >= Duration::from_secs(10) {
            if let Some(h) = gauge(http, "jobrelay_xmin_horizon_age_seconds").await {
                horizon_max = horizon_max.max(h);
            }
        }
        let pending: i64 = sqlx::query_scalar("SELECT count(*) FROM pending_jobs")
            .fetch_one(&mut admin)
            .await?;
        let done = if drain_rows > 0 {
            pending == 0 || busy_from.elapsed() > Duration::from_secs(1800)
        } else {
            busy_from.elapsed() >= Duration::from_secs(secs)
        };
        if samples % 30 == 0 {
            eprintln!(
                "{name}: {:.0}s, {pending} pending, lock held {held}/{samples}, horizon max \
                 {horizon_max:.0}s, relay xmin kept at most {xmin_held_max:.0}s",
                busy_from.elapsed().as_secs_f64()
            );
        }
        if done {
            break;
        }
    }
    let busy = busy_from.elapsed().as_secs_f64();
    stop_producer.cancel();
    let commits = producer.await? - commits_before;
    // The statistics of functions reach the views within a second (PG 15: shared memory,
    // flushed at most every second by each backend); the relay is still running meanwhile.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    sqlx::query("SELECT pg_stat_clear_snapshot()")
        .execute(&mut admin)
        .await?;
    let notifies = notify_calls(&mut admin).await? - notifies_before;
    let dead: i64 = sqlx::query_scalar(
        "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'pending_jobs'",
    )
    .fetch_one(&mut admin)
    .await?;
    stop(child);
    let server_log = pg.log()[log_before..].to_owned();
    let relay_log = std::fs::read_to_string(&log).unwrap_or_default();
    let report = json!({
        "seconds": (busy * 10.0).round() / 10.0,
        "drain_rows": drain_rows,
        "rows_per_second_streamed": per_tick * 100,
        "lock_held_samples": held,
        "samples": samples,
        "idle_in_transaction_terminations":
            count(&server_log, "idle-in-transaction timeout"),
        "producer_commits_while_busy": commits,
        "notify_calls_while_busy": notifies,
        "horizon_gauge_max_seconds": horizon_max,
        "relay_backend_xmin_kept_max_seconds": xmin_held_max,
        "n_dead_tup_at_end": dead,
        "relay_log_lock_lost": count(&relay_log, "wake-up lock lost"),
        "relay_log_horizon_warnings": count(&relay_log, "holds the xmin horizon"),
    });
    eprintln!("{name}: {report}");
    Ok(report)
}

async fn fleet_phase(
    pg: &Pg,
    bin: &Path,
    redis: &Redis,
    relays: usize,
    secs: u64,
) -> Result<Value, BoxError> {
    let admin_url = pg.url("postgres");
    let mut admin = PgConnection::connect(&admin_url).await?;
    sqlx::query(
        "DO $$ BEGIN CREATE ROLE fleet LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$",
    )
    .execute(&mut admin)
    .await?;
    sqlx::query("GRANT ALL ON ALL TABLES IN SCHEMA public TO fleet; GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO fleet")
        .execute(&mut admin)
        .await
        .ok();
    // Every slot a non-superuser may take, held by idle sessions.
    let mut holders = Vec::new();
    while let Ok(c) = PgConnection::connect(&pg.url("fleet")).await {
        holders.push(c);
    }
    eprintln!(
        "fleet: {} idle sessions hold the non-reserved slots",
        holders.len()
    );
    let pm = pg.postmaster_pid();
    let log_before = pg.log().len();
    let cpu0 = cpu_with_children(pm);
    let t0 = Instant::now();
    let children: Vec<_> = (0..relays)
        .map(|i| {
            let log =
                std::env::temp_dir().join(format!("jobrelay-sessions-fleet-{i}-{}.log", pg.port));
            relay(bin, &pg.url("fleet"), redis.port, None, &log)
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let took = t0.elapsed().as_secs_f64();
    let cpu = cpu_with_children(pm) - cpu0;
    let server_log = pg.log()[log_before..].to_owned();
    for c in children {
        stop(c);
    }
    drop(holders);
    let refused = server_log
        .lines()
        .filter(|l| l.contains(" 53300 ") && l.contains("FATAL"))
        .count();
    let report = json!({
        "relays": relays,
        "seconds": (took * 10.0).round() / 10.0,
        "refused": refused,
        "refused_per_second": (refused as f64 / took * 10.0).round() / 10.0,
        "refused_per_relay_per_second": (refused as f64 / took / relays as f64 * 100.0).round() / 100.0,
        "postgres_cpu_percent_of_a_core": (cpu / took * 1000.0).round() / 10.0,
    });
    eprintln!("fleet: {report}");
    Ok(report)
}

/// What a run does: the relay binary, the phases and their sizes.
pub struct Opts {
    pub relay_bin: PathBuf,
    pub phases: Vec<String>,
    pub max_connections: u32,
    pub drain_rows: i64,
    pub stream_rate: u32,
    pub stream_secs: u64,
    pub fleet: usize,
    pub fleet_secs: u64,
}

impl Opts {
    /// From the `SESSIONS_*` variables (see the top of this file).
    pub fn from_env() -> Opts {
        Opts {
            relay_bin: std::env::var("SESSIONS_RELAY_BIN")
                .map(PathBuf::from)
                .unwrap_or_else(|_| PathBuf::from(env!("CARGO_BIN_EXE_jobrelay"))),
            phases: std::env::var("SESSIONS_PHASES")
                .unwrap_or_else(|_| "drain,stream,fleet".into())
                .split(',')
                .map(str::to_owned)
                .collect(),
            max_connections: env_or("SESSIONS_MAX_CONNECTIONS", 100),
            drain_rows: env_or("SESSIONS_DRAIN_ROWS", 1_000_000),
            stream_rate: env_or("SESSIONS_STREAM_RATE", 1000),
            stream_secs: env_or("SESSIONS_STREAM_SECS", 600),
            fleet: env_or("SESSIONS_FLEET", 30),
            fleet_secs: env_or("SESSIONS_FLEET_SECS", 60),
        }
    }
}

/// Runs the phases on a private Postgres and Redis (both gone afterwards); the report.
pub async fn run(opts: &Opts) -> Result<Value, BoxError> {
    let bin = &opts.relay_bin;
    let pg = Pg::start(opts.max_connections);
    let redis = Redis::start();
    let status = Command::new(bin)
        .arg("migrate")
        .env("DATABASE_URL", pg.url("postgres"))
        .env("REDIS_URL", format!("redis://127.0.0.1:{}", redis.port))
        .stdout(Stdio::null())
        .status()?;
    assert!(status.success(), "jobrelay migrate");
    let mut report = json!({ "relay_bin": bin.display().to_string() });
    for phase in &opts.phases {
        let figures = match phase.as_str() {
            "drain" => busy_phase(&pg, bin, &redis, "drain", opts.drain_rows, 0, 0).await?,
            "stream" => {
                busy_phase(
                    &pg,
                    bin,
                    &redis,
                    "stream",
                    0,
                    opts.stream_rate,
                    opts.stream_secs,
                )
                .await?
            }
            "fleet" => fleet_phase(&pg, bin, &redis, opts.fleet, opts.fleet_secs).await?,
            other => return Err(format!("unknown phase {other}").into()),
        };
        report[phase.as_str()] = figures;
    }
    Ok(report)
}

#[allow(dead_code)] // a test includes this file and calls `run`
#[tokio::main]
async fn main() -> Result<(), BoxError> {
    if !std::env::args().skip(1).any(|a| a == "--bench") {
        eprintln!(
            "sessions: not started by `cargo bench`: nothing run; `cargo bench --bench \
             sessions` runs it"
        );
        return Ok(());
    }
    let report = run(&Opts::from_env()).await?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
