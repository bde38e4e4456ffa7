//! `jobrelay check`: the schema version and each service, why Redis refuses writes, a missing
//! schema.

use super::*;

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
