//! The examples run: `examples/things.rs`, `examples/plain_sql.sql`.

use super::*;

/// `examples/things.rs`: the thing and its job commit together, and the fast path delivers.
#[sqlx::test]
async fn example_things_runs(pool: PgPool) {
    let ns = Namespace::new();
    let db = database_url_of(&pool).await;
    let created = things_example::run(&db, &ns.url, &ns.prefix).await.unwrap();
    let report = created.fast_path.unwrap();
    assert_eq!(report.pushed, vec![(created.job_uuid, Outcome::Queued)]);
    let name: String = sqlx::query_scalar("SELECT name FROM things WHERE id = $1")
        .bind(created.thing_id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(name, "a thing");
    assert_eq!(pending_count(&pool).await, 0);
    let queued = ns.list_jobs("queue:default").await;
    assert_eq!(uuids_of(&queued), vec![created.job_uuid]);
    assert_eq!(queued[0].job_type, "ProcessThing");
    let payload: serde_json::Value = serde_json::from_slice(&queued[0].payload).unwrap();
    assert_eq!(payload, serde_json::json!({ "thing_id": created.thing_id }));

    // With Redis unreachable the example still commits, and the relay delivers.
    let nowhere = format!("redis://127.0.0.1:{}", free_port());
    let created = things_example::run(&db, &nowhere, &ns.prefix)
        .await
        .unwrap();
    assert!(created.fast_path.is_err());
    assert_eq!(pending_count(&pool).await, 1);
    let (code, out) = sweep(&pool, &ns, &[]).await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(ns.llen("queue:default").await, 2);
}

/// `examples/plain_sql.sql` through psql: by default it cleans up after itself; with
/// `-v keep=1` its committed jobs stay, and the relay delivers them.
#[sqlx::test]
async fn example_plain_sql_runs(pool: PgPool) {
    let ns = Namespace::new();
    let db = database_url_of(&pool).await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/plain_sql.sql");
    let psql = |extra: &'static [&'static str]| {
        let db = db.clone();
        async move {
            let out = tokio::process::Command::new("psql")
                .arg(&db)
                .args(["-X", "-v", "ON_ERROR_STOP=1"])
                .args(extra)
                .args(["-f", script])
                .output()
                .await
                .expect("psql is installed (apt-get install postgresql-client)");
            let text = format!(
                "{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(out.status.success(), "psql failed: {text}");
            text
        }
    };
    let text = psql(&[]).await;
    assert!(text.contains("refused as expected"), "{text}");
    assert!(text.contains("cleaned up"), "{text}");
    assert_eq!(pending_count(&pool).await, 0, "{text}");

    let text = psql(&["-v", "keep=1"]).await;
    assert_eq!(pending_count(&pool).await, 4, "{text}");
    let rows: Vec<(String, serde_json::Value)> =
        sqlx::query_as("SELECT job_type, headers FROM pending_jobs ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    let types: Vec<&str> = rows.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(
        types,
        ["ProcessThing", "SendWelcomeMail", "SendReminder", "Archive"]
    );
    let (code, out) = sweep(&pool, &ns, &[]).await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(pending_count(&pool).await, 0);
    let queued = ns.list_jobs("queue:default").await;
    let queued_types: Vec<&str> = queued.iter().map(|j| j.job_type.as_str()).collect();
    assert_eq!(queued_types, ["ProcessThing", "SendWelcomeMail"]);
    let payload: serde_json::Value = serde_json::from_slice(&queued[0].payload).unwrap();
    assert!(payload["thing_id"].is_i64(), "{payload}");
    assert_eq!(ns.scheduled().await.len(), 1, "SendReminder waits a day");
    let headers: BTreeMap<_, _> = queued[1].headers.clone().into_iter().collect();
    assert!(headers["traceparent"].starts_with("00-"));
    assert_eq!(
        ns.list_jobs(&format!("jobs:{}:onComplete", queued[1].uuid))
            .await
            .len(),
        1
    );
}
