//! Secrets: passwords never reach logs, errors, metrics or `--help`-style output, and the
//! configuration's Debug form hides them.

use super::*;

/// Passwords (right and wrong, plain and percent-encoded) for a private TLS Postgres and an ACL
/// Redis, the URLs that carry them, and the URL files.
struct Secrets {
    pg: PgServer,
    _redis: RedisServer,
    dir: tempfile::TempDir,
    pg_password: String,
    wrong_pg: String,
    wrong_pg_encoded: String,
    redis_password: String,
    wrong_redis: String,
    good_db: String,
    bad_db: String,
    good_redis: String,
    bad_redis: String,
    gone_db: String,
    gone_redis: String,
    good_db_file: String,
    good_redis_file: String,
}

impl Secrets {
    fn start() -> Secrets {
        // '#' must be percent-encoded in a URL: both forms must stay hidden.
        let pg_password = format!("Pg#Pw-{}", rand_hex());
        let pg_encoded: String =
            url::form_urlencoded::byte_serialize(pg_password.as_bytes()).collect();
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
        let good_db_file = write_file(dir.path(), "db", &good_db);
        let good_redis_file = write_file(dir.path(), "redis", &good_redis);
        Secrets {
            pg,
            _redis: redis,
            dir,
            pg_password,
            wrong_pg,
            wrong_pg_encoded,
            redis_password,
            wrong_redis,
            good_db,
            bad_db,
            good_redis,
            bad_redis,
            gone_db,
            gone_redis,
            good_db_file,
            good_redis_file,
        }
    }

    /// Panics if any of the four passwords shows in `out` or `err`.
    fn check_clean(&self, what: &str, out: &str, err: &str) {
        for s in [
            &self.pg_password,
            &self.wrong_pg,
            &self.redis_password,
            &self.wrong_redis,
        ] {
            assert_no_secret(s, what, &[out, err]);
        }
    }
}

#[tokio::test]
async fn passwords_never_reach_the_output() {
    let s = Secrets::start();
    right_passwords_from_files_work(&s).await;
    commands_with_wrong_passwords_fail_without_leaking(&s).await;
    the_daemon_with_wrong_passwords_logs_no_password(&s).await;
    invalid_configuration_exits_2_without_leaking(&s).await;
}

/// The right passwords, from files, work (so the wrong ones fail for the right reason).
async fn right_passwords_from_files_work(s: &Secrets) {
    let files = [
        ("DATABASE_URL_FILE", s.good_db_file.as_str()),
        ("REDIS_URL_FILE", s.good_redis_file.as_str()),
    ];
    let (code, out, err) = run_relay(&["migrate"], &files).await;
    assert_eq!(code, 0, "{out}\n{err}");
    let (code, out, err) = run_relay(&["check"], &files).await;
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("postgres://postgres:***@127.0.0.1"), "{out}");
    s.check_clean("check with the right passwords", &out, &err);
}

/// Wrong passwords and unreachable hosts, for every command that connects: exit 1, an
/// informative message, no password.
async fn commands_with_wrong_passwords_fail_without_leaking(s: &Secrets) {
    let pg_refused = "password authentication failed";
    let (good_db, bad_db, gone_db) = (&s.good_db, &s.bad_db, &s.gone_db);
    let (good_redis, bad_redis, gone_redis) = (&s.good_redis, &s.bad_redis, &s.gone_redis);
    for (what, args, db, redis_url, expect) in [
        (
            "check, wrong pg",
            vec!["check"],
            bad_db,
            good_redis,
            pg_refused,
        ),
        (
            "check, wrong redis",
            vec!["check"],
            good_db,
            bad_redis,
            "redis: ",
        ),
        (
            "status, wrong pg",
            vec!["status"],
            bad_db,
            good_redis,
            pg_refused,
        ),
        (
            "status --json, wrong pg",
            vec!["status", "--json"],
            bad_db,
            good_redis,
            pg_refused,
        ),
        (
            "sweep, wrong pg",
            vec!["--sweep"],
            bad_db,
            good_redis,
            pg_refused,
        ),
        (
            "sweep, wrong redis",
            vec!["--sweep"],
            good_db,
            bad_redis,
            "redis",
        ),
        (
            "dead-letter list, wrong pg",
            vec!["dead-letter", "list"],
            bad_db,
            good_redis,
            pg_refused,
        ),
        (
            "check, unreachable",
            vec!["check"],
            gone_db,
            gone_redis,
            "postgres: ",
        ),
        (
            "status, unreachable",
            vec!["status"],
            gone_db,
            gone_redis,
            "jobrelay: ",
        ),
        (
            "sweep, unreachable redis",
            vec!["--sweep"],
            good_db,
            gone_redis,
            "redis",
        ),
        (
            "migrate, wrong pg",
            vec!["migrate"],
            bad_db,
            good_redis,
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
        s.check_clean(what, &out, &err);
    }
}

/// The daemon, briefly, with a wrong Postgres password, then a wrong Redis password, then
/// neither server reachable; debug logs included.
async fn the_daemon_with_wrong_passwords_logs_no_password(s: &Secrets) {
    for (what, db, redis_url, outage) in [
        ("daemon, wrong pg", &s.bad_db, &s.good_redis, "postgres"),
        ("daemon, wrong redis", &s.good_db, &s.bad_redis, "redis"),
        (
            "daemon, unreachable redis",
            &s.gone_db,
            &s.gone_redis,
            "redis",
        ),
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
        let said = || async { !d.events_with(&message).is_empty() };
        let said = eventually_every(Duration::from_secs(20), Duration::from_millis(50), said);
        assert!(said.await, "{what}: no outage event\n{}", d.logs());
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
        s.check_clean(what, &d.stdout(), &d.logs());
        s.check_clean(what, &metrics, "");
    }
}

/// Invalid configuration: exit 2, one line naming the culprit, no password.
async fn invalid_configuration_exits_2_without_leaking(s: &Secrets) {
    for (what, args, culprit) in invalid_configurations(s) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, out, err) = run_relay(&args, &[]).await;
        assert_eq!(code, 2, "{what}\n{out}\n{err}");
        assert!(err.contains(culprit), "{what}: {culprit} not named\n{err}");
        s.check_clean(what, &out, &err);
    }
}

/// (what, arguments, the culprit the one line must name) of each invalid configuration.
fn invalid_configurations(s: &Secrets) -> Vec<(&'static str, Vec<String>, &'static str)> {
    let (wrong_pg, wrong_pg_encoded, wrong_redis) =
        (&s.wrong_pg, &s.wrong_pg_encoded, &s.wrong_redis);
    let (good_db, good_redis) = (s.good_db.as_str(), s.good_redis.as_str());
    let dir = s.dir.path();
    let ca = s.pg.certs.ca.display().to_string();
    let not_a_cert = write_file(dir, "not-a-cert.pem", "hello\n");
    let bare_secret_file = write_file(dir, "bare", &format!("{}\n", s.pg_password));
    let bad_toml = write_file(
        dir,
        "bad.toml",
        &format!(
            "batch_size = 10\ndatabase_url = \"postgres://app:{wrong_pg}@db/x\nredis_url = 1\n"
        ),
    );
    let unknown_key_toml = write_file(
        dir,
        "unknown.toml",
        &format!("database_url = \"postgres://app:{wrong_pg_encoded}@db/x\"\npasword = \"{wrong_redis}\"\n"),
    );
    let rediss_bad = format!("rediss://relay:{wrong_redis}@127.0.0.1:1");
    let mysql = format!("mysql://app:{wrong_pg_encoded}@db/x");
    let bad_port = format!("postgres://app:{wrong_pg_encoded}@db:notaport/x");
    let bad_redis_port = format!("redis://relay:{wrong_redis}@127.0.0.1:notaport");
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<String>>();
    vec![
        (
            "not postgres",
            args(&["check", "--database-url", &mysql]),
            "--database-url",
        ),
        (
            "bad port",
            args(&["check", "--database-url", &bad_port]),
            "--database-url",
        ),
        (
            "bad redis port",
            args(&["--sweep", "--redis-url", &bad_redis_port]),
            "--redis-url",
        ),
        (
            "bad batch size",
            args(&[
                "--database-url",
                good_db,
                "--redis-url",
                good_redis,
                "--batch-size",
                "ten",
            ]),
            "--batch-size",
        ),
        (
            "bare secret in a URL file",
            args(&["check", "--database-url-file", &bare_secret_file]),
            "--database-url-file",
        ),
        (
            "URL and file",
            args(&[
                "check",
                "--redis-url",
                good_redis,
                "--redis-url-file",
                &s.good_redis_file,
            ]),
            "--redis-url-file",
        ),
        (
            "broken TOML",
            args(&["check", "--config", &bad_toml]),
            "--config",
        ),
        (
            "unknown TOML key",
            args(&["check", "--config", &unknown_key_toml]),
            "pasword",
        ),
        (
            "CA file that is no certificate",
            args(&[
                "check",
                "--redis-url",
                &rediss_bad,
                "--redis-ca-file",
                &not_a_cert,
            ]),
            "--redis-ca-file",
        ),
        (
            "CA file with redis://",
            args(&["check", "--redis-url", good_redis, "--redis-ca-file", &ca]),
            "--redis-ca-file",
        ),
        (
            "missing CA file",
            args(&[
                "check",
                "--redis-url",
                &rediss_bad,
                "--redis-ca-file",
                "/nonexistent/ca.pem",
            ]),
            "--redis-ca-file",
        ),
        (
            "clap: --older-than without --sweep",
            args(&["--database-url", good_db, "--older-than", "5s"]),
            "--sweep",
        ),
    ]
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
