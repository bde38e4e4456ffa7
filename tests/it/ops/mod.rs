//! Operations: `/metrics`, `/healthz`, `/readyz`, logs, secrets, TLS to Postgres and Redis, Redis
//! ACL users, `jobrelay check`, `jobrelay peek`, what the binary says (the guarantee, help,
//! a missing table), the least-privilege role, the deploy manifests, the alert rules (promtool)
//! and the Grafana dashboard against a live `/metrics`, the HTTP
//! listener's limits, Postgres connections (PgBouncer in both pool modes, the footprint, too
//! many connections, a primary gone silent); what the relay asks of Redis (no eviction,
//! replicas) and the Redis endpoint failures it never blames on a job.
//!
//! The daemon runs as a child process with its HTTP listener on a free port and its JSON logs
//! in a file. Fault and TLS tests start their own servers and stop only those.

mod alerts;
mod backlog;
mod check;
mod connections;
mod dashboard;
mod deploy;
mod http;
mod messages;
mod metrics;
mod peek;
mod pg_sessions;
mod pgbouncer;
mod postgres_states;
mod probes;
mod promql;
mod queries;
mod redis_refusals;
mod redis_safety;
mod roles;
mod secrets;
mod tls;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::http::{http_get, status_of};
use crate::common::layouts::{per_layout, TestLayout};
use crate::common::pg_server::PgServer;
use crate::common::redis_server::RedisServer;
use crate::common::*;
use sqlx::PgPool;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Whether a relay holds the wake-up lock of `pending_jobs` in this test's database.
pub(super) async fn wakeup_lock_held(pool: &PgPool) -> bool {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_locks
                        WHERE locktype = 'advisory' AND granted AND classid = 27250
                          AND database = (SELECT oid FROM pg_database
                                          WHERE datname = current_database()))",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Waits until the relay is idle: its wake-up lock released. Then only a notification wakes it
/// before its next poll.
pub(super) async fn released(pool: &PgPool) {
    wait_until(
        "the wake-up lock is released",
        Duration::from_secs(10),
        || async { !wakeup_lock_held(pool).await },
    )
    .await;
}
/// Runs `scenario(pool, role)` with a new role that may not connect at all (`CONNECTION LIMIT
/// 0`: Postgres refuses it with SQLSTATE 53300, as it refuses everyone once `max_connections`
/// is reached), named `<prefix>_<random>`; then drops the role whatever happened (roles are
/// cluster-wide) and passes the scenario's panic on.
pub(super) async fn with_a_refused_role<F, Fut>(pool: &PgPool, prefix: &str, scenario: F)
where
    F: FnOnce(PgPool, String) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let role = format!("{prefix}_{}", rand_hex());
    sqlx::raw_sql(&format!("CREATE ROLE {role} LOGIN CONNECTION LIMIT 0"))
        .execute(pool)
        .await
        .unwrap();
    let result = tokio::spawn(scenario(pool.clone(), role.clone())).await;
    let _ = sqlx::raw_sql(&format!("DROP ROLE {role}"))
        .execute(pool)
        .await;
    if let Err(e) = result {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// The daemon as a child process: HTTP on a free port, JSON logs to a file, stdout to a file.
struct Daemon {
    child: tokio::process::Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Daemon {
    /// Starts `jobrelay args` with exactly `env` for its jobrelay variables.
    fn start(args: &[&str], env: &[(&str, &str)]) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let stdout = std::fs::File::create(dir.path().join("stdout")).unwrap();
        let stderr = std::fs::File::create(dir.path().join("stderr")).unwrap();
        let mut cmd = tokio::process::Command::new(relay_bin());
        cmd.args(["--http-addr", &addr])
            .args(args)
            .env_remove("DATABASE_URL")
            .env_remove("REDIS_URL")
            .env_remove("RUST_LOG")
            .env("JOBRELAY_LOG_FORMAT", "json")
            .stdin(Stdio::null())
            .stdout(Stdio::from(stdout))
            .stderr(Stdio::from(stderr))
            .kill_on_drop(true);
        for (k, v) in env {
            cmd.env(k, v);
        }
        Daemon {
            child: cmd.spawn().expect("relay binary starts"),
            port,
            dir,
        }
    }

    /// Everything the daemon wrote to stderr so far.
    fn logs(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr")).unwrap_or_default()
    }

    /// Everything the daemon wrote to stdout so far.
    fn stdout(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stdout")).unwrap_or_default()
    }

    /// The log lines as JSON objects (panics on a line that is not one).
    fn events(&self) -> Vec<serde_json::Value> {
        self.logs()
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l)
                    .unwrap_or_else(|e| panic!("log line is not JSON ({e}): {l}"));
                assert!(
                    v.get("level").is_some() && v.get("message").is_some(),
                    "{l}"
                );
                v
            })
            .collect()
    }

    /// Log events whose message is `message`.
    fn events_with(&self, message: &str) -> Vec<serde_json::Value> {
        self.events()
            .into_iter()
            .filter(|e| e["message"] == message)
            .collect()
    }

    async fn get(&self, path: &str) -> (u16, String) {
        http_get(self.port, path)
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}\nlogs:\n{}", self.logs()))
    }

    /// Parsed `/metrics`.
    async fn metrics(&self) -> Metrics {
        let (status, body) = self.get("/metrics").await;
        assert_eq!(status, 200, "{body}");
        Metrics::parse(&body)
    }

    async fn wait_ready(&self, deadline: Duration) {
        let ready = || async { status_of(self.port, "/readyz").await == 200 };
        let ready = eventually_every(deadline, Duration::from_millis(50), ready).await;
        assert!(
            ready,
            "daemon not ready after {deadline:?}; logs:\n{}",
            self.logs()
        );
    }

    /// SIGTERM, then the exit code within `deadline`.
    async fn terminate(&mut self, deadline: Duration) -> Option<i32> {
        let pid = self.child.id().expect("running");
        let ok = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -TERM {pid}");
        tokio::time::timeout(deadline, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("daemon did not exit within {deadline:?}"))
            .unwrap()
            .code()
    }
}

/// A `/metrics` scrape: series (name plus labels, as rendered) to value, and `# TYPE`s.
struct Metrics {
    samples: BTreeMap<String, f64>,
    types: BTreeMap<String, String>,
    text: String,
}

impl Metrics {
    fn parse(text: &str) -> Metrics {
        let mut samples = BTreeMap::new();
        let mut types = BTreeMap::new();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, ty) = rest.split_once(' ').expect("# TYPE name type");
                types.insert(name.to_owned(), ty.to_owned());
            } else if !line.starts_with('#') {
                let (series, value) = line.rsplit_once(' ').expect("series value");
                samples.insert(series.to_owned(), value.parse().expect("a number"));
            }
        }
        Metrics {
            samples,
            types,
            text: text.to_owned(),
        }
    }

    /// The value of one series, e.g. `jobrelay_up{dependency="redis"}`.
    fn get(&self, series: &str) -> f64 {
        *self
            .samples
            .get(series)
            .unwrap_or_else(|| panic!("no series {series} in:\n{}", self.text))
    }

    fn try_get(&self, series: &str) -> Option<f64> {
        self.samples.get(series).copied()
    }
}

/// A random suffix for secrets and names.
fn rand_hex() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..12].to_owned()
}

/// Writes `text` to `dir/name`, returning the path as a string.
fn write_file(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

/// Starts a private Redis whose only user is `relay` with `password` (the default user is off).
fn acl_redis(password: &str) -> RedisServer {
    let pw = format!(">{password}");
    let redis = RedisServer::start_with(&["--user", "relay", "on", &pw, "~*", "&*", "+@all"]);
    let mut con = redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("default")
        .arg("off")
        .query(&mut con)
        .unwrap();
    redis
}

/// `redis://relay:<password>@127.0.0.1:<port>`.
fn acl_url(redis: &RedisServer, password: &str) -> String {
    format!("redis://relay:{password}@127.0.0.1:{}", redis.port)
}

/// Panics if `secret` (or its percent-encoded form) shows anywhere in `texts`.
fn assert_no_secret(secret: &str, what: &str, texts: &[&str]) {
    let encoded: String = url::form_urlencoded::byte_serialize(secret.as_bytes()).collect();
    for t in texts {
        for s in [secret, encoded.as_str()] {
            assert!(!t.contains(s), "{what}: the password {s:?} leaked:\n{t}");
        }
    }
}

/// `(pending rows, highest attempts among them, dead letters)`.
async fn rows_state(pool: &PgPool) -> (i64, i32, i64) {
    sqlx::query_as(
        "SELECT (SELECT count(*) FROM pending_jobs),
                (SELECT COALESCE(max(attempts), 0) FROM pending_jobs),
                (SELECT count(*) FROM pending_jobs_dead)",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The daemon's Redis episode events: (message, reason).
fn redis_episodes(d: &Daemon) -> Vec<(String, String)> {
    d.events()
        .into_iter()
        .filter(|e| e["dependency"] == "redis" && e["message"] != "redis connected")
        .map(|e| {
            (
                e["message"].as_str().unwrap_or_default().to_owned(),
                e["reason"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}
