//! The least-privilege role (sql/relay_role.sql): the relay relays with it but cannot alter the
//! schema.

use super::*;

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
    // Keyed: the ordering trigger draws its id as the trigger's owner (the producer role has
    // no privilege on the sequence), and the relay role hands it back with its id kept.
    sqlx::query(
        "INSERT INTO pending_jobs (queue, job_type, ordering_key) VALUES ('poison', 'W', 'a-1')",
    )
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
    // The poison queue's key holds a string: its Redis side says why, the rest is read.
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let poison = &v["redis"]["queues"][0];
    assert_eq!(poison["queue"], "poison", "{out}");
    assert!(
        poison["error"]
            .as_str()
            .is_some_and(|e| e.contains("WRONGTYPE")),
        "{out}"
    );

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
