//! Operations acceptance: `/metrics`, `/healthz`, `/readyz`, logs, secrets, TLS to Postgres and
//! Redis, Redis ACL users, `jobrelay check`, the least-privilege role, the deploy manifests.
//!
//! The daemon runs as a child process with its HTTP listener on a free port and its JSON logs
//! in a file. Fault and TLS tests start their own servers and stop only those.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::http::{http_get, status_of};
use common::pg_server::PgServer;
use common::redis_server::RedisServer;
use common::*;
use sqlx::PgPool;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

// ------------------------------------------------------------------------------------------
// Helpers

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
        let start = Instant::now();
        while status_of(self.port, "/readyz").await != 200 {
            assert!(
                start.elapsed() < deadline,
                "daemon not ready after {deadline:?}; logs:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
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

// ------------------------------------------------------------------------------------------
// 1. /metrics after every outcome, per-job and permanent failures; logs per state change.

#[sqlx::test]
async fn metrics_count_every_outcome_and_logs_only_state_changes(pool: PgPool) {
    let ns = Namespace::new();
    let mut con = ns.con().await;
    // A per-job failure: the poison queue's key is a string, so the job's LPUSH is WRONGTYPE.
    let _: () = redis::cmd("SET")
        .arg(ns.key("queue:poison"))
        .arg("not a list")
        .query_async(&mut con)
        .await
        .unwrap();
    // A duplicate: its dedup marker is already there.
    let dup = uuid::Uuid::new_v4();
    let _: () = redis::cmd("SET")
        .arg(ns.key(&format!("jobs:{dup}")))
        .arg("relayed before")
        .query_async(&mut con)
        .await
        .unwrap();
    // A permanent failure: an invalid queue name, in a table whose CHECK constraint is gone.
    sqlx::query("ALTER TABLE pending_jobs DROP CONSTRAINT pending_jobs_queue_check")
        .execute(&pool)
        .await
        .unwrap();
    let mut uuids: Vec<uuid::Uuid> = Vec::new();
    for (sql, n) in [
        ("INSERT INTO pending_jobs (queue, job_type) VALUES ('default', 'Q')", 5),
        (
            "INSERT INTO pending_jobs (queue, job_type, run_at) VALUES ('later', 'S', now() + interval '1 hour')",
            4,
        ),
        (
            "INSERT INTO pending_jobs (queue, job_type, parent_uuid) VALUES ('kids', 'C', gen_random_uuid())",
            3,
        ),
        (
            "INSERT INTO pending_jobs (queue, job_type, predecessor_uuid) VALUES ('next', 'P', gen_random_uuid())",
            2,
        ),
        ("INSERT INTO pending_jobs (queue, job_type) VALUES ('poison', 'W')", 1),
        ("INSERT INTO pending_jobs (queue, job_type) VALUES ('bad queue!', 'X')", 1),
    ] {
        for _ in 0..n {
            let u: uuid::Uuid = sqlx::query_scalar(&format!("{sql} RETURNING uuid"))
                .fetch_one(&pool)
                .await
                .unwrap();
            uuids.push(u);
        }
    }
    sqlx::query("INSERT INTO pending_jobs (uuid, queue, job_type) VALUES ($1, 'default', 'D')")
        .bind(dup)
        .execute(&pool)
        .await
        .unwrap();
    uuids.push(dup);
    // A parked row the relay may not claim yet: it holds the backlog gauges up.
    sqlx::query(
        "INSERT INTO pending_jobs (queue, job_type, created_at, available_at)
         VALUES ('default', 'Parked', now() - interval '1 hour', now() + interval '1 hour')",
    )
    .execute(&pool)
    .await
    .unwrap();

    let db = database_url_of(&pool).await;
    let mut d = Daemon::start(
        &["--max-attempts", "2", "--poll-interval", "200ms"],
        &[
            ("DATABASE_URL", &db),
            ("REDIS_URL", &ns.url),
            ("JOBRELAY_NAMESPACE", &ns.prefix),
        ],
    );
    let dead = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM pending_jobs_dead")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    wait_until(
        "every row relayed or dead-lettered",
        Duration::from_secs(30),
        || async { pending_count(&pool).await == 1 && dead().await == 2 },
    )
    .await;
    // The backlog gauges are sampled every 5 s.
    let start = Instant::now();
    let m = loop {
        let m = d.metrics().await;
        if m.try_get("jobrelay_dead_jobs") == Some(2.0)
            && m.try_get("jobrelay_pending_jobs") == Some(1.0)
        {
            break m;
        }
        assert!(
            start.elapsed() < Duration::from_secs(12),
            "gauges never caught up:\n{}",
            m.text
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    for (name, ty) in [
        ("jobrelay_jobs_relayed_total", "counter"),
        ("jobrelay_job_failures_total", "counter"),
        ("jobrelay_jobs_dead_lettered_total", "counter"),
        ("jobrelay_batch_duration_seconds", "histogram"),
        ("jobrelay_relay_lag_seconds", "histogram"),
        ("jobrelay_pending_jobs", "gauge"),
        ("jobrelay_oldest_pending_age_seconds", "gauge"),
        ("jobrelay_up", "gauge"),
    ] {
        assert_eq!(
            m.types.get(name).map(String::as_str),
            Some(ty),
            "TYPE of {name}"
        );
    }
    for (outcome, n) in [
        ("queued", 5.0),
        ("scheduled", 4.0),
        ("children", 3.0),
        ("on_complete", 2.0),
        ("duplicate", 1.0),
    ] {
        assert_eq!(
            m.get(&format!(
                "jobrelay_jobs_relayed_total{{outcome=\"{outcome}\"}}"
            )),
            n,
            "{outcome}"
        );
    }
    // The poison job failed twice (max attempts 2), then was dead-lettered with the invalid row.
    assert_eq!(m.get("jobrelay_job_failures_total{kind=\"per_job\"}"), 2.0);
    assert_eq!(
        m.get("jobrelay_job_failures_total{kind=\"permanent\"}"),
        1.0
    );
    assert_eq!(
        m.get("jobrelay_job_failures_total{kind=\"transient\"}"),
        0.0
    );
    assert_eq!(m.get("jobrelay_jobs_dead_lettered_total"), 2.0);
    assert_eq!(m.get("jobrelay_relay_lag_seconds_count"), 15.0);
    assert_eq!(
        m.get("jobrelay_relay_lag_seconds_bucket{le=\"+Inf\"}"),
        15.0
    );
    assert!(m.get("jobrelay_relay_lag_seconds_sum") > 0.0);
    let batches = m.get("jobrelay_batch_duration_seconds_count");
    assert!((2.0..=17.0).contains(&batches), "batches: {batches}");
    assert_eq!(
        m.get("jobrelay_batch_duration_seconds_bucket{le=\"+Inf\"}"),
        batches
    );
    assert_eq!(m.get("jobrelay_pending_jobs"), 1.0);
    let age = m.get("jobrelay_oldest_pending_age_seconds");
    assert!((3600.0..3700.0).contains(&age), "oldest pending age {age}");
    assert_eq!(m.get("jobrelay_up{dependency=\"postgres\"}"), 1.0);
    assert_eq!(m.get("jobrelay_up{dependency=\"redis\"}"), 1.0);
    // What Redis holds agrees with the counters.
    assert_eq!(ns.llen("queue:default").await, 5);
    assert_eq!(ns.scheduled().await.len(), 4);

    assert_eq!(d.terminate(Duration::from_secs(30)).await, Some(0));
    // Logs: JSON, one event per state change, nothing per job at info level.
    let events = d.events();
    let allowed: HashSet<&str> = [
        "jobrelay starting",
        "postgres connected",
        "redis connected",
        "shutting down: finishing the batches in hand",
        "shutdown complete",
    ]
    .into();
    for e in &events {
        let line = e.to_string();
        if e["level"] == "INFO" {
            let msg = e["message"].as_str().unwrap();
            assert!(allowed.contains(msg), "unexpected info event: {line}");
            for u in &uuids {
                assert!(!line.contains(&u.to_string()), "per-job info line: {line}");
            }
        }
    }
    assert_eq!(d.events_with("postgres connected").len(), 1);
    assert_eq!(d.events_with("redis connected").len(), 1);
    let dead_events = d.events_with("rows moved to the dead-letter table");
    let rows: u64 = dead_events
        .iter()
        .map(|e| e["rows"].as_u64().unwrap())
        .sum();
    assert_eq!(rows, 2, "dead-letter events: {dead_events:?}");
    assert!(dead_events.iter().all(|e| e["level"] == "WARN"));
    let done = d.events_with("shutdown complete");
    assert_eq!(done.len(), 1, "{}", d.logs());
    assert_eq!(done[0]["relayed"], 15);
    assert_eq!(done[0]["failed_per_job"], 2);
    assert_eq!(done[0]["failed_permanent"], 1);
    assert_eq!(done[0]["dead_lettered"], 2);
}

/// Every series is there from the first scrape, before any job; /metrics has the exposition
/// content type; /healthz and /readyz answer.
#[sqlx::test]
async fn every_series_is_present_from_the_first_scrape(pool: PgPool) {
    let ns = Namespace::new();
    let db = database_url_of(&pool).await;
    let mut d = Daemon::start(
        &[],
        &[
            ("DATABASE_URL", &db),
            ("REDIS_URL", &ns.url),
            ("JOBRELAY_NAMESPACE", &ns.prefix),
        ],
    );
    d.wait_ready(Duration::from_secs(15)).await;
    let raw = {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", d.port))
            .await
            .unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut raw = String::new();
        s.read_to_string(&mut raw).await.unwrap();
        raw
    };
    assert!(
        raw.to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4; charset=utf-8"),
        "{raw}"
    );
    let m = d.metrics().await;
    for series in [
        "jobrelay_jobs_relayed_total{outcome=\"queued\"}",
        "jobrelay_jobs_relayed_total{outcome=\"scheduled\"}",
        "jobrelay_jobs_relayed_total{outcome=\"children\"}",
        "jobrelay_jobs_relayed_total{outcome=\"on_complete\"}",
        "jobrelay_jobs_relayed_total{outcome=\"duplicate\"}",
        "jobrelay_job_failures_total{kind=\"transient\"}",
        "jobrelay_job_failures_total{kind=\"per_job\"}",
        "jobrelay_job_failures_total{kind=\"permanent\"}",
        "jobrelay_jobs_dead_lettered_total",
        "jobrelay_batch_duration_seconds_count",
        "jobrelay_relay_lag_seconds_count",
    ] {
        assert_eq!(m.get(series), 0.0, "{series}");
    }
    assert_eq!(m.get("jobrelay_up{dependency=\"postgres\"}"), 1.0);
    assert_eq!(m.get("jobrelay_up{dependency=\"redis\"}"), 1.0);
    wait_until(
        "backlog gauges sampled",
        Duration::from_secs(10),
        || async {
            let m = d.metrics().await;
            m.try_get("jobrelay_pending_jobs") == Some(0.0)
                && m.try_get("jobrelay_oldest_pending_age_seconds") == Some(0.0)
        },
    )
    .await;
    assert_eq!(d.get("/healthz").await.0, 200);
    assert_eq!(d.terminate(Duration::from_secs(30)).await, Some(0));
}

// ------------------------------------------------------------------------------------------
// 2. /readyz follows a Redis outage within 5 s; /healthz stays 200.

#[sqlx::test]
async fn readyz_follows_a_redis_outage_and_healthz_stays_up(pool: PgPool) {
    let mut redis = RedisServer::start();
    let ns = Namespace::on(&redis.url());
    let db = database_url_of(&pool).await;
    let mut d = Daemon::start(
        &[],
        &[
            ("DATABASE_URL", &db),
            ("REDIS_URL", &redis.url()),
            ("JOBRELAY_NAMESPACE", &ns.prefix),
        ],
    );
    d.wait_ready(Duration::from_secs(15)).await;
    let port = d.port;
    let healthz_ok = || async move {
        let s = status_of(port, "/healthz").await;
        assert_eq!(s, 200, "/healthz during the outage test");
    };

    redis.kill();
    wait_until(
        "/readyz 503 after redis went down",
        Duration::from_secs(5),
        || async {
            healthz_ok().await;
            status_of(port, "/readyz").await == 503
        },
    )
    .await;
    let (status, body) = d.get("/readyz").await;
    assert_eq!(status, 503);
    assert!(body.contains("redis"), "{body}");
    let m = d.metrics().await;
    assert_eq!(m.get("jobrelay_up{dependency=\"redis\"}"), 0.0);
    assert_eq!(m.get("jobrelay_up{dependency=\"postgres\"}"), 1.0);
    // Not synchronisation: the outage lasts a few probe periods (the scenario), with /healthz
    // checked all along.
    let outage = Instant::now();
    while outage.elapsed() < Duration::from_secs(3) {
        healthz_ok().await;
        assert_eq!(status_of(port, "/readyz").await, 503);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    redis.restart();
    wait_until(
        "/readyz 200 after redis came back",
        Duration::from_secs(5),
        || async {
            healthz_ok().await;
            status_of(port, "/readyz").await == 200
        },
    )
    .await;
    assert_eq!(
        d.metrics().await.get("jobrelay_up{dependency=\"redis\"}"),
        1.0
    );
    // It relays again.
    insert_rows(&pool, 2, "after").await;
    wait_until(
        "rows relayed after the outage",
        Duration::from_secs(10),
        || async { ns.llen("queue:after").await == 2 },
    )
    .await;
    assert_eq!(d.terminate(Duration::from_secs(30)).await, Some(0));
    // One outage event and one recovery event, however many probes failed in between.
    let redis_events: Vec<String> = d
        .events()
        .into_iter()
        .filter(|e| e["dependency"] == "redis")
        .map(|e| e["message"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        redis_events[..3],
        [
            "redis connected",
            "redis unavailable; retrying with backoff",
            "redis recovered"
        ],
        "{}",
        d.logs()
    );
    eprintln!("redis events: {redis_events:?}");
    let recovered = &d.events_with("redis recovered")[0];
    assert!(
        recovered["failed_tries"].as_u64().unwrap() >= 2,
        "{recovered}"
    );
    assert!(
        recovered["outage_seconds"].as_f64().unwrap() >= 3.0,
        "{recovered}"
    );
    assert_eq!(d.events_with("postgres connected").len(), 1);
    // A worker whose connection went stale during the outage may fail its first push after the
    // recovery (and retry at once); that shows as at most one more short outage.
    let tail = &redis_events[3..];
    assert!(
        tail.is_empty()
            || tail
                == [
                    "redis unavailable; retrying with backoff",
                    "redis recovered"
                ],
        "{}",
        d.logs()
    );
}

// ------------------------------------------------------------------------------------------
// 3. TLS: Postgres with sslmode=verify-full (+ sslrootcert) or require; rediss:// with
//    --redis-ca-file; URLs read from files.

#[tokio::test]
async fn tls_to_postgres_and_redis_with_urls_from_files() {
    let pg_password = format!("Tls-Pg-{}", rand_hex());
    let pg = PgServer::start_tls(&pg_password);
    let certs = &pg.certs;
    let tls_port = free_port().to_string();
    let redis = RedisServer::start_with(&[
        "--tls-port",
        &tls_port,
        "--tls-cert-file",
        certs.cert.to_str().unwrap(),
        "--tls-key-file",
        certs.key.to_str().unwrap(),
        "--tls-ca-cert-file",
        certs.ca.to_str().unwrap(),
        "--tls-auth-clients",
        "no",
    ]);
    // Inspect the TLS Redis through its plain port.
    let ns = Namespace::on(&redis.url());
    let dir = tempfile::tempdir().unwrap();
    let db_url = pg.url("postgres", &pg_password, "postgres", &pg.verify_full());
    let redis_tls = format!("rediss://127.0.0.1:{tls_port}");
    let db_file = write_file(dir.path(), "database-url", &format!("{db_url}\n"));
    let redis_file = write_file(dir.path(), "redis-url", &redis_tls);
    let ca = certs.ca.display().to_string();
    let files: Vec<(&str, &str)> = vec![
        ("DATABASE_URL_FILE", &db_file),
        ("REDIS_URL_FILE", &redis_file),
        ("JOBRELAY_REDIS_CA_FILE", &ca),
        ("JOBRELAY_NAMESPACE", &ns.prefix),
    ];

    let (code, out, err) = run_relay(&["migrate"], &files).await;
    assert_eq!(code, 0, "migrate over TLS\n{out}\n{err}");
    let (code, out, err) = run_relay(&["check"], &files).await;
    assert_eq!(code, 0, "check over TLS\n{out}\n{err}");
    let latest = jobrelay::db::latest_known_version();
    assert!(
        out.contains(&format!("postgres: ok, schema version {latest}")),
        "{out}"
    );
    assert!(out.contains("redis: ok"), "{out}");
    assert_no_secret(&pg_password, "check over TLS", &[&out, &err]);

    // The test's own connection goes through TLS too (plain TCP is rejected by pg_hba).
    let pool = sqlx::PgPool::connect(&db_url).await.unwrap();
    let ssl: bool = sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(ssl);
    insert_rows(&pool, 3, "tls").await;
    let (code, out, err) = run_relay(&["--sweep", "--older-than", "0s"], &files).await;
    assert_eq!(code, 0, "sweep over TLS\n{out}\n{err}");
    assert_eq!(ns.llen("queue:tls").await, 3);

    // The daemon, with the same settings as flags, and sslmode=require (encrypted, unverified).
    let require_url = pg.url("postgres", &pg_password, "postgres", "sslmode=require");
    let require_file = write_file(dir.path(), "database-url-require", &require_url);
    let mut d = Daemon::start(
        &[
            "--database-url-file",
            &require_file,
            "--redis-url-file",
            &redis_file,
            "--redis-ca-file",
            &ca,
            "--namespace",
            &ns.prefix,
        ],
        &[],
    );
    d.wait_ready(Duration::from_secs(15)).await;
    insert_rows(&pool, 2, "tls").await;
    wait_until(
        "daemon relays over TLS",
        Duration::from_secs(10),
        || async { ns.llen("queue:tls").await == 5 },
    )
    .await;
    assert_eq!(d.terminate(Duration::from_secs(30)).await, Some(0));
    assert_no_secret(&pg_password, "daemon over TLS", &[&d.logs(), &d.stdout()]);
    let conns: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
         WHERE a.application_name = 'jobrelay' AND NOT s.ssl",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(conns, 0);

    // What must fail: plain TCP to Postgres; verify-full without the test CA (the native roots
    // do not know it); plain Redis on the TLS port; rediss:// without the CA file.
    for (what, db, redis_url, ca_file, expect) in [
        (
            "sslmode=disable",
            pg.url("postgres", &pg_password, "postgres", "sslmode=disable"),
            redis_tls.clone(),
            Some(ca.as_str()),
            "postgres: ",
        ),
        (
            "verify-full without sslrootcert",
            pg.url("postgres", &pg_password, "postgres", "sslmode=verify-full"),
            redis_tls.clone(),
            Some(ca.as_str()),
            "postgres: ",
        ),
        (
            "rediss:// without --redis-ca-file",
            db_url.clone(),
            redis_tls.clone(),
            None,
            "redis: ",
        ),
        (
            "redis:// to the TLS port",
            db_url.clone(),
            format!("redis://127.0.0.1:{tls_port}"),
            None,
            "redis: ",
        ),
    ] {
        let mut env = vec![
            ("DATABASE_URL", db.as_str()),
            ("REDIS_URL", redis_url.as_str()),
        ];
        if let Some(ca) = ca_file {
            env.push(("JOBRELAY_REDIS_CA_FILE", ca));
        }
        let (code, out, err) = run_relay(&["check", "--push-timeout", "2s"], &env).await;
        assert_eq!(code, 1, "{what} must fail\n{out}\n{err}");
        let line = out
            .lines()
            .find(|l| l.starts_with(expect))
            .unwrap_or_default();
        assert!(!line.contains(": ok"), "{what}: {out}");
        assert_no_secret(&pg_password, what, &[&out, &err]);
    }
    assert!(pg.log().contains("no pg_hba.conf entry") || pg.log().contains("rejects connection"));
}

// ------------------------------------------------------------------------------------------
// Redis ACL user and password (redis://user:pass@).

#[sqlx::test]
async fn redis_acl_user_and_password(pool: PgPool) {
    let password = format!("Acl-{}", rand_hex());
    let redis = acl_redis(&password);
    let url = acl_url(&redis, &password);
    let ns = Namespace::on(&url);
    let db = database_url_of(&pool).await;
    insert_rows(&pool, 4, "acl").await;
    let env = |redis_url: &str| {
        vec![
            ("DATABASE_URL".to_owned(), db.clone()),
            ("REDIS_URL".to_owned(), redis_url.to_owned()),
            ("JOBRELAY_NAMESPACE".to_owned(), ns.prefix.clone()),
        ]
    };
    let run = |args: &'static [&'static str], env: Vec<(String, String)>| async move {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        run_relay(args, &env).await
    };

    // Without credentials the server refuses (the default user is off).
    let anonymous = format!("redis://127.0.0.1:{}", redis.port);
    let (code, out, err) = run(&["check"], env(&anonymous)).await;
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(
        out.contains("redis: ") && !out.contains("redis: ok"),
        "{out}"
    );
    // A wrong password is refused, and the message says so without the password.
    let wrong_password = format!("Wrong-{}", rand_hex());
    let (code, out, err) = run(&["check"], env(&acl_url(&redis, &wrong_password))).await;
    assert_eq!(code, 1, "{out}\n{err}");
    let said = out.to_lowercase();
    assert!(
        said.contains("wrongpass")
            || said.contains("authentication failed")
            || said.contains("invalid username-password"),
        "{out}"
    );
    assert_no_secret(
        &wrong_password,
        "check with a wrong Redis password",
        &[&out, &err],
    );

    let (code, out, err) = run(&["check"], env(&url)).await;
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("redis: ok"), "{out}");
    let (code, out, err) = run(&["--sweep", "--older-than", "0s"], env(&url)).await;
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(ns.llen("queue:acl").await, 4);
    assert_no_secret(&password, "sweep as an ACL user", &[&out, &err]);
}

// ------------------------------------------------------------------------------------------
// 4. No password in any output: wrong passwords, unreachable hosts, invalid configuration.

#[tokio::test]
async fn passwords_never_reach_the_output() {
    // '#' must be percent-encoded in a URL: both forms must stay hidden.
    let pg_password = format!("Pg#Pw-{}", rand_hex());
    let pg_encoded: String = url::form_urlencoded::byte_serialize(pg_password.as_bytes()).collect();
    let pg = PgServer::start_tls(&pg_password);
    let redis_password = format!("Rd-Pw-{}", rand_hex());
    let redis = acl_redis(&redis_password);
    let dir = tempfile::tempdir().unwrap();

    let wrong_pg = format!("Wrong#Pg-{}", rand_hex());
    let wrong_pg_encoded: String =
        url::form_urlencoded::byte_serialize(wrong_pg.as_bytes()).collect();
    let wrong_redis = format!("Wrong-Rd-{}", rand_hex());
    let good_db = pg.url("postgres", &pg_encoded, "postgres", &pg.verify_full());
    let bad_db = pg.url("postgres", &wrong_pg_encoded, "postgres", &pg.verify_full());
    let good_redis = acl_url(&redis, &redis_password);
    let bad_redis = acl_url(&redis, &wrong_redis);
    let gone = free_port();
    let gone_db = format!("postgres://app:{wrong_pg_encoded}@127.0.0.1:{gone}/x");
    let gone_redis = format!("redis://relay:{wrong_redis}@127.0.0.1:{gone}");
    let secrets = [
        pg_password.as_str(),
        wrong_pg.as_str(),
        redis_password.as_str(),
        wrong_redis.as_str(),
    ];
    let check_clean = |what: &str, out: &str, err: &str| {
        for s in secrets {
            assert_no_secret(s, what, &[out, err]);
        }
    };

    // The right passwords, from files, work (so the wrong ones fail for the right reason).
    let good_db_file = write_file(dir.path(), "db", &good_db);
    let good_redis_file = write_file(dir.path(), "redis", &good_redis);
    let (code, out, err) = run_relay(
        &["migrate"],
        &[
            ("DATABASE_URL_FILE", &good_db_file),
            ("REDIS_URL_FILE", &good_redis_file),
        ],
    )
    .await;
    assert_eq!(code, 0, "{out}\n{err}");
    let (code, out, err) = run_relay(
        &["check"],
        &[
            ("DATABASE_URL_FILE", &good_db_file),
            ("REDIS_URL_FILE", &good_redis_file),
        ],
    )
    .await;
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("postgres://postgres:***@127.0.0.1"), "{out}");
    check_clean("check with the right passwords", &out, &err);

    // Wrong passwords and unreachable hosts, for every command that connects.
    let pg_refused = "password authentication failed";
    for (what, args, db, redis_url, expect) in [
        (
            "check, wrong pg",
            vec!["check"],
            &bad_db,
            &good_redis,
            pg_refused,
        ),
        (
            "check, wrong redis",
            vec!["check"],
            &good_db,
            &bad_redis,
            "redis: ",
        ),
        (
            "status, wrong pg",
            vec!["status"],
            &bad_db,
            &good_redis,
            pg_refused,
        ),
        (
            "status --json, wrong pg",
            vec!["status", "--json"],
            &bad_db,
            &good_redis,
            pg_refused,
        ),
        (
            "sweep, wrong pg",
            vec!["--sweep"],
            &bad_db,
            &good_redis,
            pg_refused,
        ),
        (
            "sweep, wrong redis",
            vec!["--sweep"],
            &good_db,
            &bad_redis,
            "redis",
        ),
        (
            "dead-letter list, wrong pg",
            vec!["dead-letter", "list"],
            &bad_db,
            &good_redis,
            pg_refused,
        ),
        (
            "check, unreachable",
            vec!["check"],
            &gone_db,
            &gone_redis,
            "postgres: ",
        ),
        (
            "status, unreachable",
            vec!["status"],
            &gone_db,
            &gone_redis,
            "jobrelay: ",
        ),
        (
            "sweep, unreachable redis",
            vec!["--sweep"],
            &good_db,
            &gone_redis,
            "redis",
        ),
        (
            "migrate, wrong pg",
            vec!["migrate"],
            &bad_db,
            &good_redis,
            pg_refused,
        ),
    ] {
        let started = Instant::now();
        let (code, out, err) = run_relay(
            &args,
            &[
                ("DATABASE_URL", db.as_str()),
                ("REDIS_URL", redis_url.as_str()),
            ],
        )
        .await;
        eprintln!("{what}: exit {code} after {:?}", started.elapsed());
        assert_eq!(code, 1, "{what}\n{out}\n{err}");
        assert!(
            out.contains(expect) || err.contains(expect),
            "{what}: not informative\n{out}\n{err}"
        );
        check_clean(what, &out, &err);
    }

    // The daemon, briefly, with a wrong Postgres password, then a wrong Redis password, then
    // neither server reachable; debug logs included.
    for (what, db, redis_url, outage) in [
        ("daemon, wrong pg", &bad_db, &good_redis, "postgres"),
        ("daemon, wrong redis", &good_db, &bad_redis, "redis"),
        ("daemon, unreachable redis", &gone_db, &gone_redis, "redis"),
    ] {
        let mut d = Daemon::start(
            &[],
            &[
                ("DATABASE_URL", db),
                ("REDIS_URL", redis_url),
                ("RUST_LOG", "debug"),
            ],
        );
        let message = format!("{outage} not reachable yet; retrying with backoff");
        let start = Instant::now();
        while d.events_with(&message).is_empty() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "{what}: no outage event\n{}",
                d.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(d.get("/readyz").await.0, 503);
        let (_, metrics) = d.get("/metrics").await;
        assert_eq!(
            d.terminate(Duration::from_secs(30)).await,
            Some(0),
            "{what}"
        );
        let event = &d.events_with(&message)[0];
        assert!(
            !event["error"].as_str().unwrap_or_default().is_empty(),
            "{event}"
        );
        check_clean(what, &d.stdout(), &d.logs());
        check_clean(what, &metrics, "");
    }

    // Invalid configuration: exit 2, one line naming the culprit, no password.
    let ca = pg.certs.ca.display().to_string();
    let not_a_cert = write_file(dir.path(), "not-a-cert.pem", "hello\n");
    let bare_secret_file = write_file(dir.path(), "bare", &format!("{pg_password}\n"));
    let bad_toml = write_file(
        dir.path(),
        "bad.toml",
        &format!(
            "batch_size = 10\ndatabase_url = \"postgres://app:{wrong_pg}@db/x\nredis_url = 1\n"
        ),
    );
    let unknown_key_toml = write_file(
        dir.path(),
        "unknown.toml",
        &format!("database_url = \"postgres://app:{wrong_pg_encoded}@db/x\"\npasword = \"{wrong_redis}\"\n"),
    );
    let rediss_bad = format!("rediss://relay:{wrong_redis}@127.0.0.1:1");
    let mysql = format!("mysql://app:{wrong_pg_encoded}@db/x");
    let bad_port = format!("postgres://app:{wrong_pg_encoded}@db:notaport/x");
    let bad_redis_port = format!("redis://relay:{wrong_redis}@127.0.0.1:notaport");
    for (what, args, culprit) in [
        (
            "not postgres",
            vec!["check", "--database-url", &mysql],
            "--database-url",
        ),
        (
            "bad port",
            vec!["check", "--database-url", &bad_port],
            "--database-url",
        ),
        (
            "bad redis port",
            vec!["--sweep", "--redis-url", &bad_redis_port],
            "--redis-url",
        ),
        (
            "bad batch size",
            vec![
                "--database-url",
                &good_db,
                "--redis-url",
                &good_redis,
                "--batch-size",
                "ten",
            ],
            "--batch-size",
        ),
        (
            "bare secret in a URL file",
            vec!["check", "--database-url-file", &bare_secret_file],
            "--database-url-file",
        ),
        (
            "URL and file",
            vec![
                "check",
                "--redis-url",
                &good_redis,
                "--redis-url-file",
                &good_redis_file,
            ],
            "--redis-url-file",
        ),
        (
            "broken TOML",
            vec!["check", "--config", &bad_toml],
            "--config",
        ),
        (
            "unknown TOML key",
            vec!["check", "--config", &unknown_key_toml],
            "pasword",
        ),
        (
            "CA file that is no certificate",
            vec![
                "check",
                "--redis-url",
                &rediss_bad,
                "--redis-ca-file",
                &not_a_cert,
            ],
            "--redis-ca-file",
        ),
        (
            "CA file with redis://",
            vec!["check", "--redis-url", &good_redis, "--redis-ca-file", &ca],
            "--redis-ca-file",
        ),
        (
            "missing CA file",
            vec![
                "check",
                "--redis-url",
                &rediss_bad,
                "--redis-ca-file",
                "/nonexistent/ca.pem",
            ],
            "--redis-ca-file",
        ),
        (
            "clap: --older-than without --sweep",
            vec!["--database-url", &good_db, "--older-than", "5s"],
            "--sweep",
        ),
    ] {
        let (code, out, err) = run_relay(&args, &[]).await;
        assert_eq!(code, 2, "{what}\n{out}\n{err}");
        assert!(err.contains(culprit), "{what}: {culprit} not named\n{err}");
        check_clean(what, &out, &err);
    }
}

/// `Debug` of the configuration shows no password, whatever source the URL came from.
#[test]
fn config_debug_hides_passwords() {
    use clap::Parser;
    use jobrelay::config::cli::Cli;
    use jobrelay::config::Config;
    let dir = tempfile::tempdir().unwrap();
    let file = write_file(dir.path(), "db", "postgres://app:F1le-Secret@db/x\n");
    for (args, env) in [
        (
            vec![
                "jobrelay",
                "--database-url",
                "postgres://app:Fl4g-Secret@db/x",
                "--redis-url",
                "redis://u:Fl4g-Secret2@r:6379",
            ],
            vec![],
        ),
        (
            vec!["jobrelay"],
            vec![
                (
                    "DATABASE_URL",
                    "postgres://app:Env-Secret@db/x?password=Env-Secret3",
                ),
                ("REDIS_URL", "rediss://:Env-Secret2@r:6380"),
            ],
        ),
        (vec!["jobrelay", "--database-url-file", &file], vec![]),
    ] {
        let cli = Cli::try_parse_from(&args).unwrap();
        let env: BTreeMap<&str, &str> = env.into_iter().collect();
        let config = Config::resolve(&cli.flags, &|k| env.get(k).map(|v| v.to_string())).unwrap();
        let debug = format!("{config:?} {config:#?}");
        let display = format!("{} {}", config.database_url, config.redis_url);
        for secret in ["Fl4g-Secret", "Env-Secret", "F1le-Secret"] {
            assert!(!debug.contains(secret), "{debug}");
            assert!(!display.contains(secret), "{display}");
        }
        assert!(debug.contains("***"), "{debug}");
        assert!(config.database_url.expose().contains("Secret"));
    }
}

// ------------------------------------------------------------------------------------------
// `jobrelay check`.

#[sqlx::test]
async fn check_reports_the_schema_version_and_each_service(pool: PgPool) {
    let db = database_url_of(&pool).await;
    let redis = redis_url();
    let (code, out, err) =
        run_relay(&["check"], &[("DATABASE_URL", &db), ("REDIS_URL", &redis)]).await;
    assert_eq!(code, 0, "{out}\n{err}");
    let latest = jobrelay::db::latest_known_version();
    assert!(out.starts_with("config: ok ("), "{out}");
    assert!(
        out.contains(&format!("postgres: ok, schema version {latest}\n")),
        "{out}"
    );
    assert!(out.contains("redis: ok"), "{out}");

    let gone = format!("redis://127.0.0.1:{}", free_port());
    let (code, out, _) =
        run_relay(&["check"], &[("DATABASE_URL", &db), ("REDIS_URL", &gone)]).await;
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!("postgres: ok, schema version {latest}")),
        "{out}"
    );
    assert!(
        out.contains("redis: ") && !out.contains("redis: ok"),
        "{out}"
    );

    // A renamed outbox table is reported missing, by name.
    let (code, out, _) = run_relay(
        &["check", "--table", "no_such_outbox"],
        &[("DATABASE_URL", &db), ("REDIS_URL", &redis)],
    )
    .await;
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("table missing: no_such_outbox does not exist (run `jobrelay migrate`)"),
        "{out}"
    );
}

/// `check` runs the probe of `/readyz`: a Redis that answers PING but refuses writes fails it,
/// with the reason named (a read-only replica, a Redis at maxmemory).
#[sqlx::test]
async fn check_names_why_redis_refuses_writes(pool: PgPool) {
    let db = database_url_of(&pool).await;
    let redis = RedisServer::start();
    let env = [("DATABASE_URL", db.as_str()), ("REDIS_URL", &redis.url())];
    let set = |args: &'static [&'static str]| {
        let url = redis.url();
        async move {
            let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
            let mut cmd = redis::cmd(args[0]);
            cmd.arg(&args[1..]);
            let _: redis::Value = cmd.query(&mut con).unwrap();
        }
    };
    let (code, out, _) = run_relay(&["check"], &env).await;
    assert_eq!(code, 0, "{out}");

    let dead_master = free_port().to_string();
    let mut con = redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(&dead_master)
        .query(&mut con)
        .unwrap();
    let (code, out, _) = run_relay(&["check"], &env).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("redis: read-only replica: "), "{out}");

    set(&["REPLICAOF", "NO", "ONE"]).await;
    set(&["CONFIG", "SET", "maxmemory", "1"]).await;
    let (code, out, _) = run_relay(&["check"], &env).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("redis: out of memory: "), "{out}");
    assert!(out.contains("postgres: ok"), "{out}");
}

/// A daemon pointed at a table that does not exist says so once, naming the table and
/// `jobrelay migrate`; /readyz is 503 with that reason; it re-checks quietly, and relays as
/// soon as the table appears.
#[sqlx::test]
async fn a_missing_table_is_one_line_and_a_named_readiness_reason(pool: PgPool) {
    let db = database_url_of(&pool).await;
    let ns = Namespace::new();
    let env = [
        ("DATABASE_URL", db.as_str()),
        ("REDIS_URL", &ns.url),
        ("JOBRELAY_NAMESPACE", &ns.prefix),
        ("JOBRELAY_TABLE", "late_outbox"),
    ];
    let mut d = Daemon::start(&[], &env);
    let port = d.port;
    wait_until(
        "/readyz names the missing table",
        Duration::from_secs(15),
        || async move {
            matches!(http_get(port, "/readyz").await,
            Ok((503, body)) if body.contains("late_outbox") && body.contains("jobrelay migrate"))
        },
    )
    .await;
    // Not synchronisation: the episode lasts a few probe periods and worker backoffs.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let missing =
        "outbox table late_outbox does not exist: run `jobrelay migrate` (checking again quietly)";
    assert_eq!(d.events_with(missing).len(), 1, "{}", d.logs());
    assert_eq!(d.events_with(missing)[0]["table"], "late_outbox");
    assert_eq!(d.events_with(missing)[0]["level"], "ERROR");
    for flapping in [
        "postgres unavailable; retrying with backoff",
        "postgres recovered",
    ] {
        assert!(
            d.events_with(flapping).is_empty(),
            "{flapping}:\n{}",
            d.logs()
        );
    }
    assert!(
        d.logs().lines().count() < 10,
        "a quiet re-check:\n{}",
        d.logs()
    );

    let (code, out, err) = run_relay(&["migrate"], &env).await;
    assert_eq!(code, 0, "{out}{err}");
    sqlx::query("INSERT INTO late_outbox (queue, job_type) VALUES ('late', 'T')")
        .execute(&pool)
        .await
        .unwrap();
    d.wait_ready(Duration::from_secs(15)).await;
    let ns = &ns;
    wait_until("the row relayed", Duration::from_secs(40), || async move {
        ns.llen("queue:late").await == 1
    })
    .await;
    assert_eq!(d.events_with("outbox table late_outbox present").len(), 1);
    assert_eq!(d.terminate(Duration::from_secs(30)).await, Some(0));
}

/// /readyz says why Redis is down: at maxmemory it answers PING but refuses writes, and that
/// is one episode (one line when it begins, one when it ends), not a flapping outage.
#[sqlx::test]
async fn readyz_names_out_of_memory_and_logs_it_once(pool: PgPool) {
    let db = database_url_of(&pool).await;
    let redis = RedisServer::start();
    let ns = Namespace::on(&redis.url());
    let mut con = redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "maxmemory", "1"])
        .query(&mut con)
        .unwrap();
    insert_rows(&pool, 50, "oom").await;
    let env = [
        ("DATABASE_URL", db.as_str()),
        ("REDIS_URL", &redis.url()),
        ("JOBRELAY_NAMESPACE", &ns.prefix),
    ];
    let mut d = Daemon::start(&[], &env);
    let port = d.port;
    wait_until(
        "/readyz says out of memory",
        Duration::from_secs(15),
        || async move {
            matches!(http_get(port, "/readyz").await,
            Ok((503, body)) if body.starts_with("redis: out of memory"))
        },
    )
    .await;
    // Not synchronisation: the outage lasts several probe periods and worker retries.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(pending_count(&pool).await, 50);
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "maxmemory", "0"])
        .query(&mut con)
        .unwrap();
    d.wait_ready(Duration::from_secs(15)).await;
    let ns = &ns;
    wait_until("the rows relayed", Duration::from_secs(40), || async move {
        ns.llen("queue:oom").await == 50
    })
    .await;
    let began = d.events_with("redis not reachable yet; retrying with backoff");
    assert_eq!(began.len(), 1, "{}", d.logs());
    assert_eq!(began[0]["reason"], "out of memory");
    assert!(d
        .events_with("redis unavailable; retrying with backoff")
        .is_empty());
    assert_eq!(d.events_with("redis recovered").len(), 1, "{}", d.logs());
    assert_eq!(d.terminate(Duration::from_secs(30)).await, Some(0));
}

#[sqlx::test(migrations = false)]
async fn check_says_when_the_schema_is_missing(pool: PgPool) {
    let db = database_url_of(&pool).await;
    let (code, out, err) = run_relay(
        &["check"],
        &[("DATABASE_URL", &db), ("REDIS_URL", &redis_url())],
    )
    .await;
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(out.contains("no schema: run `jobrelay migrate`"), "{out}");
    assert!(out.contains("redis: ok"), "{out}");
}

// ------------------------------------------------------------------------------------------
// The least-privilege role (sql/relay_role.sql).

/// sql/relay_role.sql with its role names made unique to this test (roles are cluster-wide).
fn role_sql(migrator: &str, relay: &str, producer: &str) -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/sql/relay_role.sql");
    std::fs::read_to_string(path)
        .unwrap()
        .replace("jobrelay_migrator", migrator)
        .replace("jobrelay_producer", producer)
        .replace("jobrelay_relay", relay)
}

fn url_as(base: &str, user: &str) -> String {
    let mut u = url::Url::parse(base).unwrap();
    u.set_username(user).unwrap();
    u.set_password(None).unwrap();
    u.to_string()
}

#[sqlx::test(migrations = false)]
async fn least_privilege_role_relays_but_cannot_alter_the_schema(pool: PgPool) {
    let suffix = rand_hex();
    let (migrator, relay, producer, app) = (
        format!("jr_mig_{suffix}"),
        format!("jr_relay_{suffix}"),
        format!("jr_prod_{suffix}"),
        format!("jr_app_{suffix}"),
    );
    let sql = role_sql(&migrator, &relay, &producer);
    assert!(!sql.contains("jobrelay_relay") && sql.contains(&relay));
    let db = database_url_of(&pool).await;
    let result = {
        let (pool, migrator, relay, producer, app) = (
            pool.clone(),
            migrator.clone(),
            relay.clone(),
            producer.clone(),
            app.clone(),
        );
        tokio::spawn(async move {
            least_privilege_scenario(&pool, &db, &sql, &migrator, &relay, &producer, &app).await
        })
        .await
    };
    // Roles are cluster-wide: drop them whatever happened.
    for r in [&app, &relay, &producer, &migrator] {
        let _ = sqlx::raw_sql(&format!(
            "REASSIGN OWNED BY {r} TO postgres; DROP OWNED BY {r}; DROP ROLE {r}"
        ))
        .execute(&pool)
        .await;
    }
    if let Err(e) = result {
        std::panic::resume_unwind(e.into_panic());
    }
}

async fn least_privilege_scenario(
    pool: &PgPool,
    db: &str,
    sql: &str,
    migrator: &str,
    relay: &str,
    producer: &str,
    app: &str,
) {
    // Pass 1 (as a superuser): roles and schema privileges. Then the migration role migrates.
    sqlx::raw_sql(sql).execute(pool).await.unwrap();
    let (code, out, err) =
        run_relay(&["migrate"], &[("DATABASE_URL", &url_as(db, migrator))]).await;
    assert_eq!(code, 0, "migrate as {migrator}\n{out}\n{err}");
    // Pass 2: table privileges, now that the tables exist.
    sqlx::raw_sql(sql).execute(pool).await.unwrap();
    let owner: String = sqlx::query_scalar(
        "SELECT tableowner::text FROM pg_tables WHERE tablename = 'pending_jobs'",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(owner, migrator);
    let relay_owns: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner WHERE r.rolname = $1",
    )
    .bind(relay)
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(relay_owns, 0);

    // The application's role, a member of the producer role, writes rows (the relay role sweeps
    // them), including one Redis refuses: the retry and dead-letter paths run as the relay too.
    sqlx::raw_sql(&format!("CREATE ROLE {app} LOGIN IN ROLE {producer}"))
        .execute(pool)
        .await
        .unwrap();
    let app_pool = PgPool::connect(&url_as(db, app)).await.unwrap();
    insert_rows(&app_pool, 3, "least").await;
    let ns = Namespace::new();
    let mut con = ns.con().await;
    let _: () = redis::cmd("SET")
        .arg(ns.key("queue:poison"))
        .arg("x")
        .query_async(&mut con)
        .await
        .unwrap();
    sqlx::query("INSERT INTO pending_jobs (queue, job_type) VALUES ('poison', 'W')")
        .execute(&app_pool)
        .await
        .unwrap();
    let relay_url = url_as(db, relay);
    let env = [
        ("DATABASE_URL", relay_url.as_str()),
        ("REDIS_URL", ns.url.as_str()),
        ("JOBRELAY_NAMESPACE", ns.prefix.as_str()),
    ];
    let (code, out, err) = run_relay(&["--sweep", "--older-than", "0s"], &env).await;
    assert_eq!(code, 1, "the poison row is not delivered\n{out}\n{err}");
    assert!(
        out.contains("queued=3") && out.contains("failed=1"),
        "{out}"
    );
    assert_eq!(ns.llen("queue:least").await, 3);
    let attempts: i32 =
        sqlx::query_scalar("SELECT attempts FROM pending_jobs WHERE queue = 'poison'")
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(attempts, 1);
    // Skip the backoff; the second refusal reaches --max-attempts and dead-letters the row.
    sqlx::query("UPDATE pending_jobs SET available_at = now()")
        .execute(pool)
        .await
        .unwrap();
    let (code, out, err) = run_relay(
        &["--sweep", "--older-than", "0s", "--max-attempts", "2"],
        &env,
    )
    .await;
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(out.contains("dead_lettered=1"), "{out}");
    let dead: i64 = sqlx::query_scalar("SELECT count(*) FROM pending_jobs_dead")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(dead, 1);
    assert_eq!(pending_count(pool).await, 0);
    let (code, out, err) = run_relay(&["check"], &env).await;
    assert_eq!(code, 0, "check as the relay role\n{out}\n{err}");
    let (code, out, err) = run_relay(&["status", "--json"], &env).await;
    assert_eq!(code, 0, "status as the relay role\n{out}\n{err}");
    assert!(out.contains("\"dead\":1"), "{out}");

    // The relay role may not change the schema, the migration history, the dead letters, or
    // the content of pending rows.
    insert_rows(&app_pool, 1, "kept").await;
    let relay_pool = PgPool::connect(&relay_url).await.unwrap();
    for stmt in [
        "DROP TABLE pending_jobs",
        "TRUNCATE pending_jobs",
        "ALTER TABLE pending_jobs DROP CONSTRAINT pending_jobs_queue_check",
        "CREATE INDEX sneaky_idx ON pending_jobs (queue)",
        "UPDATE pending_jobs SET payload = 'evil'",
        "UPDATE pending_jobs SET queue = 'elsewhere'",
        "DELETE FROM pending_jobs_dead",
        "UPDATE pending_jobs_dead SET attempts = 0",
        "DELETE FROM _sqlx_migrations",
        "CREATE TABLE public.sneaky (x int)",
        "DROP FUNCTION jobrelay_notify() CASCADE",
    ] {
        let e = sqlx::raw_sql(stmt)
            .execute(&relay_pool)
            .await
            .expect_err(&format!("{relay} must not run: {stmt}"));
        let code = e
            .as_database_error()
            .and_then(|d| d.code())
            .unwrap_or_default()
            .into_owned();
        assert_eq!(code, "42501", "{stmt}: {e}");
    }
    assert_eq!(pending_count(pool).await, 1);
    // Nor may it migrate (create another outbox).
    let (code, out, err) = run_relay(&["migrate", "--table", "other_jobs"], &env).await;
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(err.contains("permission denied"), "{err}");
    relay_pool.close().await;
    app_pool.close().await;
}

// ------------------------------------------------------------------------------------------
// 5. The deploy manifests, the Dockerfile and the binary agree.

fn repo_file(path: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Every YAML document of a manifest file.
fn manifests(path: &str) -> Vec<serde_json::Value> {
    let text = repo_file(path);
    let mut docs = Vec::new();
    for doc in serde_norway::Deserializer::from_str(&text) {
        let v: serde_json::Value =
            serde::Deserialize::deserialize(doc).unwrap_or_else(|e| panic!("{path}: {e}"));
        if !v.is_null() {
            docs.push(v);
        }
    }
    assert!(!docs.is_empty(), "{path} holds no document");
    docs
}

fn of_kind<'a>(docs: &'a [serde_json::Value], kind: &str) -> Vec<&'a serde_json::Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

/// The jobrelay containers of a pod spec (image name contains "jobrelay").
fn relay_containers(pod: &serde_json::Value) -> Vec<&serde_json::Value> {
    let mut out = Vec::new();
    for list in ["initContainers", "containers"] {
        if let Some(cs) = pod[list].as_array() {
            out.extend(
                cs.iter()
                    .filter(|c| c["image"].as_str().unwrap_or("").contains("jobrelay")),
            );
        }
    }
    out
}

fn args_of(c: &serde_json::Value) -> Vec<String> {
    c["args"]
        .as_array()
        .map(|a| a.iter().map(|s| s.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default()
}

fn env_of(c: &serde_json::Value) -> BTreeMap<String, serde_json::Value> {
    c["env"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|e| (e["name"].as_str().unwrap().to_owned(), e.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// A relay container: runs the image's entrypoint (no `command`), non-root, read-only root
/// filesystem, no privilege escalation, resources set, URLs from a mounted Secret.
fn check_container(file: &str, pod: &serde_json::Value, c: &serde_json::Value) {
    let name = format!("{file}: container {}", c["name"]);
    assert!(
        c.get("command").is_none(),
        "{name}: the image's ENTRYPOINT is jobrelay; use args"
    );
    let sc = &c["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"], true, "{name}");
    assert_eq!(sc["allowPrivilegeEscalation"], false, "{name}");
    let non_root = sc["runAsNonRoot"] == true || pod["securityContext"]["runAsNonRoot"] == true;
    assert!(non_root, "{name}: runAsNonRoot");
    assert!(
        c["resources"]["requests"]["memory"].is_string(),
        "{name}: resources"
    );
    assert!(
        c["resources"]["limits"]["memory"].is_string(),
        "{name}: resources"
    );
    let env = env_of(c);
    for var in ["DATABASE_URL", "REDIS_URL"] {
        assert!(
            !env.contains_key(var),
            "{name}: {var} in plain env; use {var}_FILE"
        );
        let path = env
            .get(&format!("{var}_FILE"))
            .and_then(|e| e["value"].as_str())
            .unwrap_or_else(|| panic!("{name}: no {var}_FILE"));
        let mount = c["volumeMounts"]
            .as_array()
            .and_then(|ms| {
                ms.iter()
                    .find(|m| path.starts_with(m["mountPath"].as_str().unwrap_or("\u{0}")))
            })
            .unwrap_or_else(|| panic!("{name}: {path} is not under a volume mount"));
        assert_eq!(mount["readOnly"], true, "{name}");
        let volume = pod["volumes"]
            .as_array()
            .and_then(|vs| vs.iter().find(|v| v["name"] == mount["name"]))
            .unwrap_or_else(|| panic!("{name}: no volume {}", mount["name"]));
        assert!(
            volume["secret"]["secretName"].is_string(),
            "{name}: {var} not from a Secret"
        );
    }
}

/// Liveness on /healthz, and readiness on /readyz when `gate_readiness`, on port 9898.
fn check_probes(file: &str, c: &serde_json::Value, gate_readiness: bool) {
    let port = jobrelay::config::DEFAULT_HTTP_ADDR
        .rsplit(':')
        .next()
        .unwrap();
    assert_eq!(port, "9898");
    let ports = c["ports"]
        .as_array()
        .unwrap_or_else(|| panic!("{file}: no ports"));
    assert!(
        ports.iter().any(|p| p["containerPort"] == 9898),
        "{file}: containerPort 9898"
    );
    let mut probes = vec![("livenessProbe", "/healthz")];
    if gate_readiness {
        probes.push(("readinessProbe", "/readyz"));
    } else {
        // A sidecar's readiness is its application Pod's: a Redis outage must not take the
        // application out of its Service (the outbox exists so that it keeps writing).
        assert!(
            c.get("readinessProbe").is_none(),
            "{file}: no readiness gate on a sidecar"
        );
    }
    for (probe, path) in probes {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["path"], path, "{file}: {probe}");
        let p = &get["port"];
        let named = p.as_str().is_some_and(|n| {
            ports
                .iter()
                .any(|x| x["name"] == n && x["containerPort"] == 9898)
        });
        assert!(*p == 9898 || named, "{file}: {probe} port {p}");
    }
    // The liveness probe must not kill a relay that rides out a 30 s backoff.
    let live = &c["livenessProbe"];
    let budget = live["periodSeconds"].as_u64().unwrap_or(10)
        * live["failureThreshold"].as_u64().unwrap_or(3);
    assert!(budget >= 30, "{file}: liveness gives up after {budget} s");
}

fn grace_period(pod: &serde_json::Value) -> u64 {
    pod["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("terminationGracePeriodSeconds")
}

#[test]
fn deploy_manifests_match_the_binary() {
    let shutdown = jobrelay::config::DEFAULT_SHUTDOWN_TIMEOUT.as_secs();

    // The sidecar: next to an application container, in the same Pod.
    let docs = manifests("deploy/sidecar.yaml");
    let deployments = of_kind(&docs, "Deployment");
    assert_eq!(deployments.len(), 1);
    let pod = &deployments[0]["spec"]["template"]["spec"];
    let relays: Vec<_> = pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["image"].as_str().unwrap().contains("jobrelay"))
        .collect();
    assert_eq!(relays.len(), 1, "one relay sidecar");
    assert!(
        pod["containers"].as_array().unwrap().len() >= 2,
        "an application container too"
    );
    check_container("sidecar.yaml", pod, relays[0]);
    check_probes("sidecar.yaml", relays[0], false);
    assert!(
        grace_period(pod) > shutdown,
        "sidecar: grace period vs --shutdown-timeout {shutdown}s"
    );

    // The standalone Deployment, several replicas, and a Service for scraping.
    let docs = manifests("deploy/deployment.yaml");
    let dep = of_kind(&docs, "Deployment")[0];
    assert!(dep["spec"]["replicas"].as_u64().unwrap() >= 2);
    let pod = &dep["spec"]["template"]["spec"];
    let c = relay_containers(pod);
    assert_eq!(c.len(), 1);
    check_container("deployment.yaml", pod, c[0]);
    check_probes("deployment.yaml", c[0], true);
    assert!(grace_period(pod) > shutdown);
    let args = args_of(c[0]);
    if let Some(i) = args.iter().position(|a| a == "--shutdown-timeout") {
        let t = jobrelay::config::parse_duration(&args[i + 1])
            .unwrap()
            .as_secs();
        assert!(grace_period(pod) > t);
    }
    let labels = &dep["spec"]["template"]["metadata"]["labels"];
    assert_eq!(
        dep["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"],
        labels["app.kubernetes.io/name"]
    );
    let svc = of_kind(&docs, "Service");
    assert_eq!(svc.len(), 1);
    let svc = svc[0];
    for (k, v) in svc["spec"]["selector"].as_object().unwrap() {
        assert_eq!(&labels[k], v, "Service selector {k} matches the pods");
    }
    let ports = svc["spec"]["ports"].as_array().unwrap();
    assert!(ports
        .iter()
        .any(|p| p["port"] == 9898 && p["name"] == "metrics"));
    let disruption = of_kind(&docs, "PodDisruptionBudget");
    assert_eq!(disruption.len(), 1);

    // The sweep CronJob: --sweep, never two at once, no HTTP listener needed.
    let docs = manifests("deploy/sweep-cronjob.yaml");
    let cron = of_kind(&docs, "CronJob")[0];
    assert_eq!(cron["spec"]["concurrencyPolicy"], "Forbid");
    let pod = &cron["spec"]["jobTemplate"]["spec"]["template"]["spec"];
    assert!(["Never", "OnFailure"].contains(&pod["restartPolicy"].as_str().unwrap()));
    let c = relay_containers(pod);
    assert_eq!(c.len(), 1);
    check_container("sweep-cronjob.yaml", pod, c[0]);
    let args = args_of(c[0]);
    assert!(args.contains(&"--sweep".to_owned()), "{args:?}");
    let parsed = <jobrelay::config::cli::Cli as clap::Parser>::try_parse_from(
        std::iter::once("jobrelay".to_owned()).chain(args.iter().cloned()),
    )
    .unwrap_or_else(|e| panic!("CronJob args {args:?}: {e}"));
    assert!(parsed.flags.sweep && parsed.command.is_none());

    // The migration Job runs `jobrelay migrate` with the migration role's URL.
    let docs = manifests("deploy/migrate-job.yaml");
    let job = of_kind(&docs, "Job")[0];
    let pod = &job["spec"]["template"]["spec"];
    let c = relay_containers(pod);
    assert_eq!(c.len(), 1);
    let args = args_of(c[0]);
    assert_eq!(
        args.first().map(String::as_str),
        Some("migrate"),
        "{args:?}"
    );
    let parsed = <jobrelay::config::cli::Cli as clap::Parser>::try_parse_from(
        std::iter::once("jobrelay".to_owned()).chain(args.iter().cloned()),
    )
    .unwrap();
    assert!(matches!(
        parsed.command,
        Some(jobrelay::config::cli::Command::Migrate)
    ));
    assert!(env_of(c[0]).contains_key("DATABASE_URL_FILE"));

    // Alert rules on the metrics the binary exports.
    let docs = manifests("deploy/prometheus-rules.yaml");
    let rules = of_kind(&docs, "PrometheusRule")[0];
    let exprs: Vec<String> = rules["spec"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().iter())
        .map(|r| {
            assert!(
                r["alert"].is_string() && r["labels"]["severity"].is_string(),
                "{r}"
            );
            r["expr"].as_str().unwrap().to_owned()
        })
        .collect();
    for needle in [
        jobrelay::telemetry::metrics::OLDEST_PENDING_AGE,
        jobrelay::telemetry::metrics::JOBS_DEAD_LETTERED,
        jobrelay::telemetry::metrics::UP,
    ] {
        assert!(
            exprs.iter().any(|e| e.contains(needle)),
            "no alert on {needle}: {exprs:?}"
        );
    }
    assert!(exprs
        .iter()
        .any(|e| e.contains("jobrelay_up") && e.contains("== 0")));
}

#[test]
fn dockerfile_builds_a_small_non_root_image() {
    let text = repo_file("Dockerfile");
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let froms: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.starts_with("FROM "))
        .collect();
    assert!(froms.len() >= 2, "multi-stage: {froms:?}");
    assert!(
        froms[0].contains("rust:1") && froms[0].contains("bookworm"),
        "{froms:?}"
    );
    let last = froms.last().unwrap();
    assert!(
        last.contains("debian:bookworm-slim") || last.contains("distroless/cc"),
        "{last}"
    );
    let final_stage: Vec<&str> = lines.iter().copied().skip_while(|l| l != last).collect();
    assert!(
        final_stage.contains(&"ENTRYPOINT [\"jobrelay\"]"),
        "{final_stage:?}"
    );
    assert!(final_stage.contains(&"EXPOSE 9898"), "{final_stage:?}");
    let user = final_stage
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("a USER in the final stage");
    assert!(!["root", "0", "0:0"].contains(&user.trim()), "USER {user}");
    assert!(final_stage
        .iter()
        .any(|l| l.contains("ca-certificates") || l.contains("distroless")));
    // Dependency caching: the manifests are copied and built before the sources.
    let pos = |needle: &str| {
        lines
            .iter()
            .position(|l| l.contains(needle))
            .unwrap_or(usize::MAX)
    };
    let sources = pos("COPY src").min(pos("COPY . ."));
    assert!(sources < usize::MAX, "the sources are copied");
    assert!(
        pos("COPY Cargo.toml") < sources,
        "Cargo.toml before the sources"
    );
    assert!(
        pos("cargo build") < sources,
        "dependencies built before the sources are copied"
    );
    // What the build needs is not excluded by .dockerignore; the target dir is.
    let ignore = repo_file(".dockerignore");
    let ignored: HashSet<&str> = ignore.lines().map(str::trim).collect();
    assert!(ignored.contains("target") || ignored.contains("/target"));
    for needed in [
        "src",
        "migrations",
        "proto",
        "build.rs",
        "Cargo.toml",
        "Cargo.lock",
    ] {
        assert!(!ignored.contains(needed), ".dockerignore excludes {needed}");
    }
    // The manifests run the image's entrypoint with the port the image exposes.
    let port = jobrelay::config::DEFAULT_HTTP_ADDR
        .rsplit(':')
        .next()
        .unwrap();
    assert!(final_stage.iter().any(|l| *l == format!("EXPOSE {port}")));
}

/// A Postgres that answers but refuses writes (here: sessions read-only by default, as on a
/// hot standby): `check` fails naming it, /readyz says so, and the daemon logs one episode
/// (the probe's SELECT succeeds while every claim fails: it must not end the episode).
#[sqlx::test]
async fn a_read_only_postgres_is_named_and_logged_once(pool: PgPool) {
    let db = database_url_of(&pool).await;
    let name: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&pool)
        .await
        .unwrap();
    insert_rows(&pool, 20, "ro").await;
    let admin = std::env::var("DATABASE_URL").unwrap();
    let alter = |setting: &'static str| {
        let (admin, name) = (admin.clone(), name.clone());
        async move {
            use sqlx::Connection;
            let mut con = sqlx::PgConnection::connect(&admin).await.unwrap();
            let sql = format!("ALTER DATABASE \"{name}\" {setting}");
            sqlx::query(&sql).execute(&mut con).await.unwrap();
        }
    };
    alter("SET default_transaction_read_only = on").await;
    let ns = Namespace::new();
    let env = [
        ("DATABASE_URL", db.as_str()),
        ("REDIS_URL", &ns.url),
        ("JOBRELAY_NAMESPACE", &ns.prefix),
    ];
    let (code, out, _) = run_relay(&["check"], &env).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("postgres: read-only replica: "), "{out}");
    let mut d = Daemon::start(&[], &env);
    let port = d.port;
    wait_until(
        "/readyz says read-only",
        Duration::from_secs(15),
        || async move {
            matches!(http_get(port, "/readyz").await,
            Ok((503, body)) if body.starts_with("postgres: read-only replica"))
        },
    )
    .await;
    // Not synchronisation: the episode lasts several probe periods and worker retries.
    tokio::time::sleep(Duration::from_secs(4)).await;
    alter("RESET default_transaction_read_only").await;
    let ns = &ns;
    wait_until("the rows relayed", Duration::from_secs(60), || async move {
        ns.llen("queue:ro").await == 20
    })
    .await;
    let began = d.events_with("postgres not reachable yet; retrying with backoff");
    assert_eq!(began.len(), 1, "{}", d.logs());
    assert_eq!(began[0]["reason"], "read-only replica");
    assert!(
        d.events_with("postgres unavailable; retrying with backoff")
            .is_empty(),
        "{}",
        d.logs()
    );
    assert_eq!(d.events_with("postgres recovered").len(), 1, "{}", d.logs());
    assert_eq!(d.terminate(Duration::from_secs(30)).await, Some(0));
}
