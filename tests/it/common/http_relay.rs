//! A relay daemon child with HTTP on a free port (`/readyz`, `/metrics`) and its logs in a
//! file of its own, for tests that read its counters and warnings.

use std::path::PathBuf;
use std::time::Duration;

use sqlx::PgPool;

use super::child::RelayChild;
use super::http::{http_get, status_of};
use super::{database_url_of, eventually_every, free_port};

/// The relay; killed on drop, its log directory removed.
pub struct HttpRelay {
    _child: RelayChild,
    port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl HttpRelay {
    /// Starts `jobrelay args` against the test's database, `redis_url` and the key prefix
    /// `namespace` (without waiting for it to be ready).
    pub async fn spawn(pool: &PgPool, redis_url: &str, namespace: &str, args: &[&str]) -> Self {
        let db = database_url_of(pool).await;
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("relay.log");
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let mut all = vec!["--http-addr", &addr];
        all.extend_from_slice(args);
        let child = RelayChild::start_logged(&db, redis_url, namespace, &all, &log, "info");
        HttpRelay {
            _child: child,
            port,
            log,
            _dir: dir,
        }
    }

    /// Starts one and waits until it answers /readyz.
    pub async fn start(pool: &PgPool, redis_url: &str, namespace: &str, args: &[&str]) -> Self {
        let r = HttpRelay::spawn(pool, redis_url, namespace, args).await;
        r.ready().await;
        r
    }

    /// Waits (30 s at most) until it answers /readyz with 200.
    pub async fn ready(&self) {
        let ready = || async { status_of(self.port, "/readyz").await == 200 };
        let ready = eventually_every(Duration::from_secs(30), Duration::from_millis(50), ready);
        assert!(
            ready.await,
            "relay not ready after 30 s; logs:\n{}",
            self.logs()
        );
    }

    /// Its HTTP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its log so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Jobs counted with `outcome` (the largest of the `jobrelay_jobs*{outcome=..}` counters,
    /// whatever the counter's name; 0 when none has the label).
    pub async fn count(&self, outcome: &str) -> f64 {
        let (status, body) = http_get(self.port, "/metrics").await.expect("GET /metrics");
        assert_eq!(status, 200, "{body}");
        let label = format!("{{outcome=\"{outcome}\"}}");
        let mut per_name: std::collections::HashMap<&str, f64> = Default::default();
        for line in body.lines().filter(|l| l.starts_with("jobrelay_jobs")) {
            if let Some((series, value)) = line.rsplit_once(' ') {
                if let Some(name) = series.strip_suffix(label.as_str()) {
                    *per_name.entry(name).or_default() += value.parse::<f64>().unwrap();
                }
            }
        }
        per_name.into_values().fold(0.0, f64::max)
    }

    /// WARN log lines whose message contains `word`.
    pub fn warnings(&self, word: &str) -> Vec<String> {
        self.logs()
            .lines()
            .filter(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap_or_default();
                v["level"]
                    .as_str()
                    .is_some_and(|s| s.eq_ignore_ascii_case("warn"))
                    && v["message"].as_str().is_some_and(|m| m.contains(word))
            })
            .map(str::to_owned)
            .collect()
    }
}
