//! Held keys, as operators see them: a dead head with rows of its key behind it shows in
//! `status` (text and `--json`), in `check` (a warning: exit 0, 1 with `--strict`), in a
//! running daemon's gauges and log (a WARN once, an INFO once released); a requeue releases
//! the key and every one of them says so. On an outbox with no keyed dead row, the read costs
//! one probe of an empty index and reads nothing of the outbox.

use super::*;
use crate::common::batch::*;
use crate::common::child::RelayChild;
use crate::common::http::http_get;
use jobrelay::admin::held_keys;
use jobrelay::relay::queries;
use jobrelay::TableName;
use serde_json::Value;
use sqlx::Connection as _;

/// A row of key `a`; `unfit` gives it an option the jobrelay layout refuses (dead-lettered at
/// once). Returns `(uuid, id)`.
async fn row_of_a(pool: &PgPool, unfit: bool) -> (Uuid, i64) {
    sqlx::query_as(
        "INSERT INTO pending_jobs (queue, job_type, payload, ordering_key, options)
         VALUES ('q', 'Ordered', '[]', 'a', $1::jsonb) RETURNING uuid, id",
    )
    .bind(if unfit { r#"{"nope": 1}"# } else { "{}" })
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Mends the dead head (its refused option gone) and requeues it with the CLI.
async fn mend_and_requeue(pool: &PgPool, db: &str, id: i64) {
    sqlx::query("UPDATE pending_jobs_dead SET options = '{}' WHERE id = $1")
        .bind(id)
        .execute(pool)
        .await
        .unwrap();
    let (code, out, err) = run_relay(
        &["dead-letter", "requeue", "--id", &id.to_string()],
        &[("DATABASE_URL", db)],
    )
    .await;
    assert_eq!((code, out.trim()), (0, "requeued 1 rows"), "{err}");
}

/// `status --json`'s `held_keys`.
async fn held_json(env: &[(&str, &str)]) -> Value {
    let (code, out, err) = run_relay(&["status", "--json"], env).await;
    assert_eq!(code, 0, "{out}{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    v["held_keys"].clone()
}

#[sqlx::test]
async fn a_held_key_shows_in_status_and_check_until_requeued(pool: PgPool) {
    let ns = Namespace::new();
    let db = database_url_of(&pool).await;
    let env = [
        ("DATABASE_URL", db.as_str()),
        ("REDIS_URL", ns.url.as_str()),
        ("JOBRELAY_NAMESPACE", ns.prefix.as_str()),
    ];
    let head = row_of_a(&pool, true).await;
    row_of_a(&pool, false).await;
    row_of_a(&pool, false).await;
    // The claim of runs: the two rows behind the head come in its batch, which holds them.
    let b = batcher(&pool, &ns, TTL, 10)
        .await
        .starting_with(jobrelay::relay::claim_kind::ClaimKind::Runs);
    let report = drain(&b).await;
    assert_eq!((report.dead_lettered, report.held), (1, 2), "{report}");
    let error: String = sqlx::query_scalar("SELECT last_error FROM pending_jobs_dead")
        .fetch_one(&pool)
        .await
        .unwrap();

    // status: the summary, the key with its dead head and error, the fix.
    let (code, text, err) = run_relay(&["status"], &env).await;
    assert_eq!(code, 0, "{text}{err}");
    assert!(text.contains("held keys 1  rows held 2  oldest "), "{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("a "))
        .unwrap_or_else(|| panic!("no line for key a:\n{text}"));
    for part in [
        &head.1.to_string(),
        " 2 ",
        &head.0.to_string(),
        error.as_str(),
    ] {
        assert!(line.contains(part), "{part:?} not in {line:?}");
    }
    assert!(
        text.contains("`jobrelay dead-letter requeue --id N`"),
        "{text}"
    );
    assert!(
        text.contains("`jobrelay dead-letter purge --id N`"),
        "{text}"
    );

    // status --json: the same.
    let held = held_json(&env).await;
    assert_eq!(
        (&held["keys"], &held["rows"]),
        (&1.into(), &2.into()),
        "{held}"
    );
    assert!(held["oldest_age_seconds"].as_f64().is_some(), "{held}");
    let first = &held["first"][0];
    assert_eq!(first["ordering_key"], "a", "{held}");
    assert_eq!(first["dead_id"], head.1, "{held}");
    assert_eq!(first["dead_uuid"], head.0.to_string(), "{held}");
    assert_eq!(first["last_error"], error.as_str(), "{held}");
    assert_eq!(first["waiting"], 2, "{held}");
    assert_eq!(held["first"].as_array().unwrap().len(), 1, "{held}");

    // check: a warning naming the key, its dead head and the fix; --strict fails on it.
    let (code, out, err) = run_relay(&["check"], &env).await;
    assert_eq!(code, 0, "{out}{err}");
    let warning = out
        .lines()
        .find(|l| l.starts_with("postgres: warning: "))
        .unwrap_or_else(|| panic!("no warning:\n{out}"));
    for part in [
        "1 ordering key held by a dead-lettered row (2 rows waiting",
        "key \"a\", 2 rows behind dead row",
        &format!("`jobrelay dead-letter requeue --id {}`", head.1),
        &format!("`jobrelay dead-letter purge --id {}`", head.1),
        error.as_str(),
    ] {
        assert!(warning.contains(part), "{part:?} not in {warning:?}");
    }
    let (code, out, err) = run_relay(&["check", "--strict"], &env).await;
    assert_eq!(code, 1, "{out}{err}");

    // Requeued (mended) and relayed: nothing held, no warning.
    mend_and_requeue(&pool, &db, head.1).await;
    // A fresh batcher: its first claim starts from the lowest id (the requeued row's own).
    drain(&batcher(&pool, &ns, TTL, 10).await).await;
    assert_eq!(pending_count(&pool).await, 0);
    let (_, text, _) = run_relay(&["status"], &env).await;
    assert!(!text.contains("held keys"), "{text}");
    assert_eq!(
        held_json(&env).await,
        serde_json::json!({"keys": 0, "rows": 0, "oldest_age_seconds": null, "first": []})
    );
    let (code, out, err) = run_relay(&["check", "--strict"], &env).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(!out.contains("warning"), "{out}");
}

/// The log lines of a daemon's JSON log file.
fn log_events(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The value of `name` (a series without labels) in a `/metrics` scrape.
async fn gauge(port: u16, name: &str) -> Option<f64> {
    let (_, body) = http_get(port, "/metrics").await.ok()?;
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

#[sqlx::test]
async fn a_daemon_gauges_and_logs_a_held_key_once_until_released(pool: PgPool) {
    let ns = Namespace::new();
    let db = database_url_of(&pool).await;
    let head = row_of_a(&pool, true).await;
    row_of_a(&pool, false).await;
    row_of_a(&pool, false).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut d = RelayChild::start_logged(
        &db,
        &ns.url,
        &ns.prefix,
        &["--http-addr", &addr, "--poll-interval", "200ms"],
        &log,
        "info",
    );
    wait_until("the key held, gauged", Duration::from_secs(30), || async {
        gauge(port, "jobrelay_held_keys").await == Some(1.0)
            && gauge(port, "jobrelay_held_key_oldest_age_seconds")
                .await
                .is_some_and(|a| a >= 0.0)
    })
    .await;
    let warned = |events: &[Value]| -> Vec<Value> {
        events
            .iter()
            .filter(|e| e["failure"] == "ordering_key_held")
            .cloned()
            .collect()
    };
    let w = warned(&log_events(&log));
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(w[0]["level"], "WARN");
    assert_eq!(w[0]["ordering_key"], "a");
    assert_eq!(w[0]["dead_id"], head.1);
    let message = w[0]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("`jobrelay dead-letter requeue --id {}`", head.1)),
        "{message}"
    );
    // The oldest hold ages from sample to sample; the episode is not told again.
    wait_until("the hold aged", Duration::from_secs(30), || async {
        gauge(port, "jobrelay_held_key_oldest_age_seconds")
            .await
            .is_some_and(|a| a >= 1.0)
    })
    .await;
    assert_eq!(warned(&log_events(&log)).len(), 1);

    mend_and_requeue(&pool, &db, head.1).await;
    wait_until("the key released", Duration::from_secs(30), || async {
        pending_count(&pool).await == 0
            && gauge(port, "jobrelay_held_keys").await == Some(0.0)
            && gauge(port, "jobrelay_held_key_oldest_age_seconds").await == Some(0.0)
    })
    .await;
    assert_eq!(ns.llen("queue:q").await, 3);
    let released = "no ordering key is held by a dead-lettered row any more";
    wait_until("the release logged", Duration::from_secs(10), || async {
        log_events(&log).iter().any(|e| e["message"] == released)
    })
    .await;
    let events = log_events(&log);
    assert_eq!(warned(&events).len(), 1);
    let infos: Vec<&Value> = events.iter().filter(|e| e["message"] == released).collect();
    assert_eq!(infos.len(), 1, "{infos:?}");
    assert_eq!(infos[0]["level"], "INFO");
    let held = held_json(&[("DATABASE_URL", &db)]).await;
    assert_eq!(held["keys"], 0, "{held}");
    d.signal("TERM");
    assert_eq!(d.wait(Duration::from_secs(30)).await, Some(0));
}

/// `EXPLAIN (ANALYZE, FORMAT JSON)` of the held keys' statement, as the probe runs it (the
/// relay's planner settings, a plan cached on the empty table or made now).
async fn explain(conn: &mut sqlx::PgConnection, mode: &str) -> Value {
    sqlx::raw_sql(&format!("SET plan_cache_mode = {mode}"))
        .execute(&mut *conn)
        .await
        .unwrap();
    let mut tx = conn.begin_with(queries::BEGIN).await.unwrap();
    let (plan,): (Value,) = sqlx::query_as("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE held(10)")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    plan[0]["Plan"].clone()
}

/// Each scan of `plan`: (relation, node type, rows read, loops).
fn scans(plan: &Value) -> Vec<(String, String, f64, f64)> {
    let mut found = Vec::new();
    let mut stack = vec![plan];
    while let Some(node) = stack.pop() {
        if let Some(children) = node.get("Plans").and_then(Value::as_array) {
            stack.extend(children);
        }
        let Some(rel) = node.get("Relation Name").and_then(Value::as_str) else {
            continue;
        };
        let count = |k: &str| node.get(k).and_then(Value::as_f64).unwrap_or(0.0);
        let loops = count("Actual Loops");
        found.push((
            rel.to_owned(),
            node["Node Type"].as_str().unwrap_or("?").to_owned(),
            (count("Actual Rows") + count("Rows Removed by Filter")) * loops,
            loops,
        ));
    }
    found
}

/// 100,000 unkeyed rows and no dead letter: the dead letters' empty partial index is probed,
/// the outbox is never read. Then, one in three rows keyed over 997 keys and one key's head
/// dead: what is read is that key's rows, not the table. Plans cached while the table was
/// empty, or made now, alike.
#[sqlx::test]
async fn the_held_keys_read_only_the_keyed_dead_rows_and_the_rows_they_hold(pool: PgPool) {
    let mut conn = pool.acquire().await.unwrap().detach();
    let sql = held_keys::statement(&TableName::default());
    sqlx::raw_sql("SET plan_cache_mode = force_generic_plan; SET statement_timeout = '30s'")
        .execute(&mut conn)
        .await
        .unwrap();
    sqlx::raw_sql(&format!("PREPARE held(int8) AS {sql}"))
        .execute(&mut conn)
        .await
        .unwrap();
    explain(&mut conn, "force_generic_plan").await;
    sqlx::query(
        "INSERT INTO pending_jobs (queue, job_type, payload)
         SELECT 'q', 't', '\\x01'::bytea FROM generate_series(1, 100000)",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    for mode in ["force_generic_plan", "force_custom_plan"] {
        let plan = explain(&mut conn, mode).await;
        for (rel, kind, read, loops) in scans(&plan) {
            match rel.as_str() {
                "pending_jobs" => assert_eq!(loops, 0.0, "{mode}: the outbox read\n{plan:#}"),
                "pending_jobs_dead" => {
                    assert!(
                        kind == "Index Only Scan" || kind == "Index Scan",
                        "{mode}: {kind} on the dead letters\n{plan:#}"
                    );
                    assert_eq!(read, 0.0, "{mode}\n{plan:#}");
                }
                _ => panic!("{mode}: {rel} read\n{plan:#}"),
            }
        }
    }

    // Keyed rows, and key k5's head dead: 100 rows of k5 wait.
    sqlx::raw_sql(
        "UPDATE pending_jobs SET ordering_key = 'k' || (id % 997) WHERE id % 3 = 0;
         INSERT INTO pending_jobs_dead (id, uuid, queue, job_type, ordering_key, last_error)
         VALUES (0, gen_random_uuid(), 'q', 't', 'k5', 'refused')",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    let waiting: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pending_jobs WHERE ordering_key = 'k5'")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert!(waiting > 30, "{waiting}");
    for mode in ["force_generic_plan", "force_custom_plan"] {
        let plan = explain(&mut conn, mode).await;
        for (rel, kind, read, _) in scans(&plan) {
            assert!(
                kind == "Index Only Scan" || kind == "Index Scan",
                "{mode}: {kind} on {rel}\n{plan:#}"
            );
            assert!(
                read <= (waiting + 2) as f64,
                "{mode}: {read} rows of {rel} read for {waiting} held\n{plan:#}"
            );
        }
    }
    let mut tx = conn.begin_with(queries::BEGIN).await.unwrap();
    let held = held_keys::read(&mut tx, &TableName::default(), 10)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!((held.keys, held.rows), (1, waiting));
    assert_eq!(held.first[0].ordering_key, "k5");
    conn.close().await.unwrap();
}
