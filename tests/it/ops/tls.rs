//! TLS to Postgres and Redis (URLs read from files) and Redis ACL users with passwords.

use super::*;

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

    the_daemon_relays_over_tls(&pg, &pg_password, &dir, &redis_file, &ns, &pool).await;
    plain_or_unverified_connections_fail(&pg, &pg_password, &db_url, &tls_port).await;
    assert!(pg.log().contains("no pg_hba.conf entry") || pg.log().contains("rejects connection"));
}

/// The daemon, with the same settings as flags, and sslmode=require (encrypted, unverified).
async fn the_daemon_relays_over_tls(
    pg: &PgServer,
    pg_password: &str,
    dir: &tempfile::TempDir,
    redis_file: &str,
    ns: &Namespace,
    pool: &sqlx::PgPool,
) {
    let ca = pg.certs.ca.display().to_string();
    let require_url = pg.url("postgres", pg_password, "postgres", "sslmode=require");
    let require_file = write_file(dir.path(), "database-url-require", &require_url);
    let mut d = Daemon::start(
        &[
            "--database-url-file",
            &require_file,
            "--redis-url-file",
            redis_file,
            "--redis-ca-file",
            &ca,
            "--namespace",
            &ns.prefix,
        ],
        &[],
    );
    d.wait_ready(Duration::from_secs(15)).await;
    insert_rows(pool, 2, "tls").await;
    wait_until(
        "daemon relays over TLS",
        Duration::from_secs(10),
        || async { ns.llen("queue:tls").await == 5 },
    )
    .await;
    assert_eq!(d.terminate(Duration::from_secs(30)).await, Some(0));
    assert_no_secret(pg_password, "daemon over TLS", &[&d.logs(), &d.stdout()]);
    let conns: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
         WHERE a.application_name = 'jobrelay' AND NOT s.ssl",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(conns, 0);
}

/// What must fail: plain TCP to Postgres; verify-full without the test CA (the native roots
/// do not know it); plain Redis on the TLS port; rediss:// without the CA file.
async fn plain_or_unverified_connections_fail(
    pg: &PgServer,
    pg_password: &str,
    db_url: &str,
    tls_port: &str,
) {
    let ca = pg.certs.ca.display().to_string();
    let redis_tls = format!("rediss://127.0.0.1:{tls_port}");
    for (what, db, redis_url, ca_file, expect) in [
        (
            "sslmode=disable",
            pg.url("postgres", pg_password, "postgres", "sslmode=disable"),
            redis_tls.clone(),
            Some(ca.as_str()),
            "postgres: ",
        ),
        (
            "verify-full without sslrootcert",
            pg.url("postgres", pg_password, "postgres", "sslmode=verify-full"),
            redis_tls.clone(),
            Some(ca.as_str()),
            "postgres: ",
        ),
        (
            "rediss:// without --redis-ca-file",
            db_url.to_owned(),
            redis_tls.clone(),
            None,
            "redis: ",
        ),
        (
            "redis:// to the TLS port",
            db_url.to_owned(),
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
        assert_no_secret(pg_password, what, &[&out, &err]);
    }
}

/// A Redis ACL user with a password (redis://user:pass@): anonymous and wrong passwords are
/// refused without the password in the message; the right one checks and sweeps.
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
