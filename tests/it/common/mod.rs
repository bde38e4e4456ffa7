//! Shared test support: a random Redis namespace per test, protobuf decoding, row insertion,
//! the relay as an in-process task or as a child process, and deadline-bounded waiting.
//!
//! Every test gets a fresh database from `#[sqlx::test]` (with our migrations) and a random
//! Redis namespace that is deleted (by SCAN + DEL of its own keys, never FLUSH) when dropped.

pub mod batch;
pub mod bullmq;
pub mod celery;
pub mod child;
pub mod cluster;
pub mod consumer;
pub mod conveyor;
pub mod exactly_once;
pub mod http;
pub mod http_relay;
pub mod layouts;
pub mod marks;
pub mod pg_server;
pub mod pgbouncer;
pub mod proxy;
pub mod random_json;
pub mod redis_server;
pub mod redis_side;
pub mod rq;
pub mod scripts;
pub mod sentinel;
pub mod sidekiq;
pub mod worker;

use std::future::Future;
use std::process::Stdio;
use std::time::{Duration, Instant};

use jobrelay::proto::v1;
use prost::Message;
use redis::aio::MultiplexedConnection;
use sqlx::PgPool;

/// The shared Redis (REDIS_URL or the local default).
pub fn redis_url() -> String {
    std::env::var("REDIS_URL")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "redis://127.0.0.1:6379".into())
}

/// A client for `url`, trusting the CA `tls_ca` (PEM) if given (a `rediss://` URL).
pub fn redis_client(url: &str, tls_ca: Option<&[u8]>) -> redis::RedisResult<redis::Client> {
    match tls_ca {
        None => redis::Client::open(url),
        Some(pem) => redis::Client::build_with_tls(
            url,
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem.to_vec()),
            },
        ),
    }
}

/// A random key namespace on a Redis; its keys are deleted on drop.
pub struct Namespace {
    pub prefix: String,
    pub url: String,
    /// The CA (PEM) to trust, for a Redis that speaks only TLS.
    pub tls_ca: Option<Vec<u8>>,
}

impl Namespace {
    /// A fresh namespace on the shared Redis.
    pub fn new() -> Self {
        Namespace::on(&redis_url())
    }

    /// A fresh namespace on the Redis at `url`.
    pub fn on(url: &str) -> Self {
        Namespace {
            prefix: format!("t{}:", uuid::Uuid::new_v4().simple()),
            url: url.to_owned(),
            tls_ca: None,
        }
    }

    /// A fresh namespace on a private server (over TLS, trusting its CA, if it speaks only
    /// TLS).
    pub fn on_server(server: &redis_server::RedisServer) -> Self {
        let mut ns = Namespace::on(&server.url());
        ns.tls_ca = server.tls_ca().map(<[u8]>::to_vec);
        ns
    }

    /// This namespace's server with another namespace's `prefix`: e.g. the keys a relay wrote
    /// under that prefix, read on the server a failover made the primary.
    pub fn with_prefix(mut self, prefix: &str) -> Self {
        self.prefix = prefix.to_owned();
        self
    }

    /// `prefix + key`.
    pub fn key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    fn client(&self) -> redis::RedisResult<redis::Client> {
        redis_client(&self.url, self.tls_ca.as_deref())
    }

    /// A new multiplexed connection.
    pub async fn con(&self) -> MultiplexedConnection {
        self.client()
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .expect("redis reachable")
    }

    /// A connection manager (what the relay's sink uses).
    pub async fn manager(&self) -> redis::aio::ConnectionManager {
        redis::aio::ConnectionManager::new(self.client().unwrap())
            .await
            .expect("redis reachable")
    }

    /// Every key of this namespace, without the prefix, sorted.
    pub async fn keys(&self) -> Vec<String> {
        let mut con = self.con().await;
        let mut keys: Vec<String> = scan(&mut con, &format!("{}*", self.prefix)).await;
        for k in &mut keys {
            *k = k[self.prefix.len()..].to_owned();
        }
        keys.sort();
        keys
    }

    /// The jobs in a list key, decoded, oldest push first (the order BRPOP pops them).
    pub async fn list_jobs(&self, key: &str) -> Vec<v1::Job> {
        let raw: Vec<Vec<u8>> = self.lrange(key).await;
        raw.iter().rev().map(|b| decode(b)).collect()
    }

    /// Members and scores of the `scheduled` sorted set, decoded.
    pub async fn scheduled(&self) -> Vec<(v1::Job, f64)> {
        let raw: Vec<(Vec<u8>, f64)> = self.zrange("scheduled").await;
        raw.iter().map(|(b, s)| (decode(b), *s)).collect()
    }

    /// The items of the list `key`, from the left.
    pub async fn lrange<T: redis::FromRedisValue>(&self, key: &str) -> Vec<T> {
        let mut con = self.con().await;
        redis::cmd("LRANGE")
            .arg(self.key(key))
            .arg(0)
            .arg(-1)
            .query_async(&mut con)
            .await
            .unwrap()
    }

    /// The members of the sorted set `key` with their scores, lowest first.
    pub async fn zrange<T: redis::FromRedisValue>(&self, key: &str) -> Vec<(T, f64)> {
        let mut con = self.con().await;
        redis::cmd("ZRANGE")
            .arg(self.key(key))
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(&mut con)
            .await
            .unwrap()
    }

    /// The string at `key` and its time to live in milliseconds (e.g. a dedup marker's).
    pub async fn get_and_pttl(&self, key: &str) -> (String, i64) {
        let mut con = self.con().await;
        let key = self.key(key);
        redis::pipe()
            .get(&key)
            .pttl(&key)
            .query_async(&mut con)
            .await
            .unwrap()
    }

    /// Number of dedup markers `jobs:<uuid>` in this namespace.
    pub async fn marker_count(&self) -> usize {
        self.keys()
            .await
            .iter()
            .filter(|k| k.starts_with("jobs:") && k.matches(':').count() == 1)
            .count()
    }

    /// Length of a list key.
    pub async fn llen(&self, key: &str) -> usize {
        let mut con = self.con().await;
        redis::cmd("LLEN")
            .arg(self.key(key))
            .query_async(&mut con)
            .await
            .unwrap()
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        // Best effort, on a thread of its own (drop may run inside a runtime).
        let client = self.client();
        let prefix = self.prefix.clone();
        let _ = std::thread::spawn(move || {
            if let Ok(client) = client {
                if let Ok(mut con) = client.get_connection() {
                    let mut cursor: u64 = 0;
                    while let Ok((next, keys)) = redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(format!("{prefix}*"))
                        .arg("COUNT")
                        .arg(1000)
                        .query::<(u64, Vec<String>)>(&mut con)
                    {
                        if !keys.is_empty() {
                            let _: Result<(), _> = redis::cmd("DEL").arg(&keys).query(&mut con);
                        }
                        if next == 0 {
                            break;
                        }
                        cursor = next;
                    }
                }
            }
        })
        .join();
    }
}

async fn scan(con: &mut MultiplexedConnection, pattern: &str) -> Vec<String> {
    let mut cursor: u64 = 0;
    let mut out = Vec::new();
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(con)
            .await
            .unwrap();
        out.extend(keys);
        if next == 0 {
            return out;
        }
        cursor = next;
    }
}

/// Decodes a marshalled job.
pub fn decode(bytes: &[u8]) -> v1::Job {
    v1::Job::decode(bytes).expect("a jobrelay.v1.Job")
}

/// Inserts `n` plain rows into `queue` with one statement; payload `[<i>]` (a JSON array: the
/// arguments of a job in every layout).
pub async fn insert_rows(pool: &PgPool, n: i64, queue: &str) {
    sqlx::query(
        "INSERT INTO pending_jobs (queue, job_type, payload)
         SELECT $1, 'Bulk', convert_to('[' || i || ']', 'UTF8') FROM generate_series(1, $2) AS i",
    )
    .bind(queue)
    .bind(n)
    .execute(pool)
    .await
    .unwrap();
}

/// Rows left in `pending_jobs`.
pub async fn pending_count(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM pending_jobs")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A URL for the database `pool` is connected to (for child processes).
pub async fn database_url_of(pool: &PgPool) -> String {
    let db: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(pool)
        .await
        .unwrap();
    let base = std::env::var("DATABASE_URL").expect("DATABASE_URL is set for sqlx::test");
    let mut url = url::Url::parse(&base).expect("DATABASE_URL parses");
    url.set_path(&format!("/{db}"));
    url.to_string()
}

/// Applies the migrations of `migrations/` whose file names sort before `version` (e.g.
/// `"20261129000009"`): the schema an older jobrelay left, for a test of the next migration
/// on tables in use.
pub async fn migrate_before(pool: &PgPool, version: &str) {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir("migrations").unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        if name.as_str() < version {
            std::fs::copy(&path, dir.path().join(name)).unwrap();
        }
    }
    let older = sqlx::migrate::Migrator::new(dir.path()).await.unwrap();
    older.run(pool).await.unwrap();
}

/// Calls `check` every `every` until it gives `Some`, at most `deadline` (at least once);
/// `None` if it never did. The one place the tests' waits on a condition sleep.
pub async fn poll<T, F, Fut>(deadline: Duration, every: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return Some(v);
        }
        if start.elapsed() > deadline {
            return None;
        }
        tokio::time::sleep(every).await;
    }
}

/// [`poll`] for code that cannot await (a server's start in a constructor, a script's run):
/// blocks the thread between looks.
pub fn poll_blocking<T>(
    deadline: Duration,
    every: Duration,
    mut check: impl FnMut() -> Option<T>,
) -> Option<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = check() {
            return Some(v);
        }
        if start.elapsed() > deadline {
            return None;
        }
        std::thread::sleep(every);
    }
}

/// Polls `cond` (every 20 ms) until it holds, at most `deadline`: whether it did.
pub async fn eventually<F, Fut>(deadline: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    eventually_every(deadline, Duration::from_millis(20), &mut cond).await
}

/// [`eventually`], looking every `every`.
pub async fn eventually_every<F, Fut>(deadline: Duration, every: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let check = || {
        let holds = cond();
        async move { holds.await.then_some(()) }
    };
    poll(deadline, every, check).await.is_some()
}

/// Polls `cond` until it holds or `deadline` passes; panics with `what` on timeout.
pub async fn wait_until<F, Fut>(what: &str, deadline: Duration, cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    if !eventually(deadline, cond).await {
        panic!("timed out after {deadline:?} waiting for: {what}");
    }
}

/// Lets `d` pass where the passing time *is* the test, not a wait for something to happen:
/// a window in which nothing may change, a process held stopped, the pace of a steady stream.
/// `why` says which (printed when JOBRELAY_TEST_LOGS is set).
pub async fn hold_for(d: Duration, why: &str) {
    if std::env::var_os("JOBRELAY_TEST_LOGS").is_some() {
        eprintln!("holding {d:?}: {why}");
    }
    tokio::time::sleep(d).await;
}

/// The last `n` lines of `text` (a child's log, for a failure message).
pub fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The whole lines of a file another process appends to (a real worker's record of what it
/// ran): a last line still being written, without its newline, is left out; a missing file has
/// none.
pub fn whole_lines(path: &std::path::Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let whole = text.rfind('\n').map_or("", |end| &text[..end]);
    whole
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Reads `records` until it returns at least `n`, at most `deadline`; then returns them. On
/// the deadline, panics naming `what` with `context()` (e.g. the worker's log).
pub async fn wait_for_records<T>(
    what: &str,
    n: usize,
    deadline: Duration,
    records: impl Fn() -> Vec<T>,
    context: impl Fn() -> String,
) -> Vec<T> {
    let got = poll(deadline, Duration::from_millis(50), || {
        let got = records();
        async move { (got.len() >= n).then_some(got) }
    })
    .await;
    got.unwrap_or_else(|| {
        panic!(
            "{} {what} of {n} within {deadline:?}; worker output:\n{}",
            records().len(),
            context()
        )
    })
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The relay binary built for these tests.
pub fn relay_bin() -> &'static str {
    env!("CARGO_BIN_EXE_jobrelay")
}

/// Runs the relay binary to completion with `args` and `env` (plus a clean environment of
/// jobrelay variables), returning (exit code, stdout, stderr).
pub async fn run_relay(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = tokio::process::Command::new(relay_bin());
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env_remove("DATABASE_URL")
        .env_remove("REDIS_URL")
        .env("JOBRELAY_HTTP_ADDR", "off")
        .env("JOBRELAY_LOG_FORMAT", "json");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .expect("relay finished within 120 s")
        .expect("relay binary runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
