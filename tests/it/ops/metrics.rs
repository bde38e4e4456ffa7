//! `/metrics`: every outcome counted, every series present from the first scrape, and logs that
//! record only state changes.

use super::*;
use jobrelay::error::{ErrorClass, Reason};
use jobrelay::telemetry::metrics::failure_reasons;

#[sqlx::test]
async fn metrics_count_every_outcome_and_logs_only_state_changes(pool: PgPool) {
    let ns = Namespace::new();
    let uuids = insert_one_row_per_outcome(&pool, &ns).await;

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
    let m = scrape_once_gauges_caught_up(&d).await;
    assert_every_outcome_counted(&m);
    // A direct connection: the listener proved it a session, and claims are named.
    assert_eq!(m.get("jobrelay_named_claims"), 1.0);
    // What Redis holds agrees with the counters.
    assert_eq!(ns.llen("queue:default").await, 5);
    assert_eq!(ns.scheduled().await.len(), 4);

    assert_eq!(d.terminate(Duration::from_secs(30)).await, Some(0));
    assert_logs_only_state_changes(&d, &uuids);
}

/// Rows for every outcome (5 queued, 4 scheduled, 3 children, 2 on_complete, 1 duplicate), a
/// per-job failure, a permanent failure, and a parked row; the uuids of all but the parked one.
pub(super) async fn insert_one_row_per_outcome(pool: &PgPool, ns: &Namespace) -> Vec<uuid::Uuid> {
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
        .execute(pool)
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
                .fetch_one(pool)
                .await
                .unwrap();
            uuids.push(u);
        }
    }
    sqlx::query("INSERT INTO pending_jobs (uuid, queue, job_type) VALUES ($1, 'default', 'D')")
        .bind(dup)
        .execute(pool)
        .await
        .unwrap();
    uuids.push(dup);
    // A parked row the relay may not claim yet: it holds the backlog gauges up.
    sqlx::query(
        "INSERT INTO pending_jobs (queue, job_type, created_at, available_at)
         VALUES ('default', 'Parked', now() - interval '1 hour', now() + interval '1 hour')",
    )
    .execute(pool)
    .await
    .unwrap();
    uuids
}

/// The INFO line of a relay whose claims become named statements.
pub(crate) const CLAIMS_NAMED: &str = "claims named: the relay's connections are sessions of \
     their own, and each claim is planned once per connection (--prepared-statements=auto)";

/// The metrics once the backlog gauges (sampled every 5 s) show 2 dead and 1 pending.
pub(super) async fn scrape_once_gauges_caught_up(d: &Daemon) -> Metrics {
    let caught_up = || async {
        let m = d.metrics().await;
        (m.try_get("jobrelay_dead_jobs") == Some(2.0)
            && m.try_get("jobrelay_pending_jobs") == Some(1.0))
        .then_some(m)
    };
    match poll(
        Duration::from_secs(12),
        Duration::from_millis(200),
        caught_up,
    )
    .await
    {
        Some(m) => m,
        None => panic!("gauges never caught up:\n{}", d.metrics().await.text),
    }
}

/// TYPE lines, a counter per outcome and failure kind, the histograms and the gauges.
fn assert_every_outcome_counted(m: &Metrics) {
    for (name, ty) in [
        ("jobrelay_jobs_relayed_total", "counter"),
        ("jobrelay_job_failures_total", "counter"),
        ("jobrelay_jobs_dead_lettered_total", "counter"),
        ("jobrelay_batch_duration_seconds", "histogram"),
        ("jobrelay_relay_lag_seconds", "histogram"),
        ("jobrelay_pending_jobs", "gauge"),
        ("jobrelay_oldest_pending_age_seconds", "gauge"),
        ("jobrelay_oldest_claimable_age_seconds", "gauge"),
        ("jobrelay_up", "gauge"),
        ("jobrelay_named_claims", "gauge"),
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
    // The poison job failed twice (max attempts 2), then was dead-lettered with the invalid row;
    // both failures are about the job (reason `error`), and no dependency failed.
    assert_eq!(
        m.get("jobrelay_job_failures_total{kind=\"per_job\",reason=\"error\"}"),
        2.0
    );
    assert_eq!(
        m.get("jobrelay_job_failures_total{kind=\"permanent\",reason=\"error\"}"),
        1.0
    );
    // Nor did a configuration error.
    for kind in ["transient", "config"] {
        let prefix = format!("jobrelay_job_failures_total{{kind=\"{kind}\"");
        let kept: Vec<(&String, &f64)> = m
            .samples
            .iter()
            .filter(|(s, _)| s.starts_with(&prefix))
            .collect();
        assert!(!kept.is_empty(), "{kind}");
        assert!(kept.iter().all(|(_, v)| **v == 0.0), "{kept:?}");
    }
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
    // The parked row waits for its retry: nothing the relay could claim is waiting.
    assert_eq!(m.get("jobrelay_oldest_claimable_age_seconds"), 0.0);
    assert_eq!(m.get("jobrelay_up{dependency=\"postgres\"}"), 1.0);
    assert_eq!(m.get("jobrelay_up{dependency=\"redis\"}"), 1.0);
}

/// Logs: JSON, one event per state change, nothing per job at info level.
fn assert_logs_only_state_changes(d: &Daemon, uuids: &[uuid::Uuid]) {
    let events = d.events();
    let allowed: HashSet<&str> = [
        "jobrelay starting",
        "postgres connected",
        "redis connected",
        CLAIMS_NAMED,
        "shutting down: finishing the batches in hand",
        "shutdown complete",
    ]
    .into();
    for e in &events {
        let line = e.to_string();
        if e["level"] == "INFO" {
            let msg = e["message"].as_str().unwrap();
            assert!(allowed.contains(msg), "unexpected info event: {line}");
            for u in uuids {
                assert!(!line.contains(&u.to_string()), "per-job info line: {line}");
            }
        }
    }
    assert_eq!(d.events_with("postgres connected").len(), 1);
    assert_eq!(d.events_with("redis connected").len(), 1);
    assert_eq!(d.events_with(CLAIMS_NAMED).len(), 1);
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
        "jobrelay_jobs_dead_lettered_total",
        "jobrelay_batch_duration_seconds_count",
        "jobrelay_relay_lag_seconds_count",
    ] {
        assert_eq!(m.get(series), 0.0, "{series}");
    }
    // Each kind with every reason it can have is a series from the start: a transient
    // failure any reason but a configuration error's, a config one Redis's eviction policy,
    // a per-job or permanent one `error`.
    let mut failures = 0;
    for kind in ErrorClass::ALL {
        for r in failure_reasons(kind) {
            let series = format!(
                "jobrelay_job_failures_total{{kind=\"{}\",reason=\"{}\"}}",
                kind.as_str(),
                r.as_str()
            );
            assert_eq!(m.get(&series), 0.0, "{series}");
            failures += 1;
        }
    }
    let all = m
        .samples
        .keys()
        .filter(|s| s.starts_with("jobrelay_job_failures_total{"))
        .count();
    assert_eq!((failures, all), (21, 21), "docs/metrics.md: 21 series");
    assert_eq!(
        failure_reasons(ErrorClass::Config).len() + failure_reasons(ErrorClass::Transient).len(),
        Reason::ALL.len()
    );
    assert_eq!(m.get("jobrelay_up{dependency=\"postgres\"}"), 1.0);
    assert_eq!(m.get("jobrelay_up{dependency=\"redis\"}"), 1.0);
    // 0 until the listener proved its session, then 1.
    assert!(m.try_get("jobrelay_named_claims").is_some(), "{}", m.text);
    wait_until(
        "backlog gauges sampled",
        Duration::from_secs(10),
        || async {
            let m = d.metrics().await;
            m.try_get("jobrelay_pending_jobs") == Some(0.0)
                && m.try_get("jobrelay_oldest_pending_age_seconds") == Some(0.0)
                && m.try_get("jobrelay_oldest_claimable_age_seconds") == Some(0.0)
        },
    )
    .await;
    assert_eq!(d.get("/healthz").await.0, 200);
    assert_eq!(d.terminate(Duration::from_secs(30)).await, Some(0));
}

/// The reasons of docs/metrics.md's table are the closed set the code gives the `reason` label
/// of `jobrelay_job_failures_total` (and the logs, `/readyz`, `jobrelay check`).
#[test]
fn every_failure_reason_is_documented() {
    let doc = super::deploy::repo_file("docs/metrics.md");
    let section = doc
        .split("\n## Failure reasons\n")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("a Failure reasons section");
    let documented: Vec<&str> = section
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .map(|l| &l[..l.find('`').unwrap()])
        .collect();
    let code: Vec<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
    assert_eq!(documented, code);
}
