//! The Redis side as an operator meets it (docs/redis-side.md#where-it-shows), for any layout:
//! rows relayed by a daemon writing under a namespace no worker reads are told by the metrics,
//! the log line (once, naming the workers' namespace), `status` and `check` (and `check
//! --strict`'s exit code). Each runner's `consumers` tests call [`wrong_namespace_is_told`]
//! with its real worker running under `right`.

use std::time::Duration;

use serde_json::Value;
use sqlx::PgPool;

use super::exactly_once::relayed;
use super::http::http_get;
use super::http_relay::HttpRelay;
use super::{database_url_of, run_relay, wait_until};

/// The value of the series `series` (e.g. `jobrelay_queue_depth{queue="billing"}`) on the
/// relay's /metrics, if it is there.
pub async fn metric(port: u16, series: &str) -> Option<f64> {
    let (_, body) = http_get(port, "/metrics").await.ok()?;
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// `jobrelay <args>` against the test's database and `redis`, in `layout` under `namespace`:
/// its exit code and its output (stdout, then stderr).
pub async fn cli(
    pool: &PgPool,
    redis: &str,
    layout: &str,
    namespace: &str,
    args: &[&str],
) -> (i32, String) {
    let db = database_url_of(pool).await;
    let env = [
        ("DATABASE_URL", db.as_str()),
        ("REDIS_URL", redis),
        ("JOBRELAY_NAMESPACE", namespace),
        ("JOBRELAY_LAYOUT", layout),
    ];
    let (code, out, err) = run_relay(args, &env).await;
    (code, format!("{out}{err}"))
}

/// Inserts `rows` (job type, payload) into `queue`, relays them with a daemon in `layout`
/// writing under `wrong` while the runner's worker reads `queue` under `right`, and checks
/// what the operator is told: the queue's gauges (depth, 0 consumers), one warning naming
/// `right` as the fix, `status --json`'s Redis side and `check`'s warning (exit 0; 1 with
/// `--strict`).
pub async fn wrong_namespace_is_told(
    pool: &PgPool,
    redis: &str,
    layout: &str,
    (wrong, right): (&str, &str),
    queue: &str,
    rows: &[(&str, &str)],
) {
    for (job_type, payload) in rows {
        sqlx::query(
            "INSERT INTO pending_jobs (queue, job_type, payload)
             VALUES ($1, $2, convert_to($3, 'UTF8'))",
        )
        .bind(queue)
        .bind(job_type)
        .bind(payload)
        .execute(pool)
        .await
        .unwrap();
    }
    let relay = HttpRelay::start(pool, redis, wrong, &["--layout", layout]).await;
    relayed(pool, "every row relayed").await;
    let port = relay.port();
    let (depth, consumers) = (
        format!("jobrelay_queue_depth{{queue=\"{queue}\"}}"),
        format!("jobrelay_queue_consumers{{queue=\"{queue}\"}}"),
    );
    let n = rows.len() as f64;
    let gauges = || async {
        metric(port, &depth).await == Some(n) && metric(port, &consumers).await == Some(0.0)
    };
    wait_until("the queue's gauges", Duration::from_secs(30), gauges).await;
    let fix = format!(
        "no consumer of the {layout} layout seen under namespace {wrong:?}; consumers of {queue} \
         are seen under namespace {right:?} (pass --namespace {right:?})"
    );
    let warned = || async { !relay.warnings(&fix).is_empty() };
    wait_until(
        &format!("the warning: {fix}"),
        Duration::from_secs(30),
        warned,
    )
    .await;
    let lines = relay.warnings("no consumer of the");
    assert_eq!(lines.len(), 1, "once: {lines:?}");
    let message: Value = serde_json::from_str(&lines[0]).unwrap();
    let waiting = format!("queue {queue}: {} job", rows.len());
    assert!(
        message["message"].as_str().unwrap().starts_with(&waiting),
        "{message}"
    );
    drop(relay);

    let (code, text) = cli(pool, redis, layout, wrong, &["status", "--json"]).await;
    assert_eq!(code, 0, "{text}");
    let v: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    let side = v["redis"]["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == queue)
        .unwrap_or_else(|| panic!("{queue} in status: {text}"))
        .clone();
    assert_eq!(side["depth"], rows.len(), "{text}");
    assert_eq!(side["consumers"], 0, "{text}");
    assert_eq!(
        v["redis"]["consumers_elsewhere"][queue],
        serde_json::json!([right])
    );
    let (code, text) = cli(pool, redis, layout, wrong, &["check"]).await;
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains(&format!("redis: warning: {waiting}")),
        "{text}"
    );
    assert!(text.contains(&fix), "{text}");
    let (code, text) = cli(pool, redis, layout, wrong, &["check", "--strict"]).await;
    assert_eq!(code, 1, "{text}");
}
