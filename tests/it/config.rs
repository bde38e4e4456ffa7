//! Configuration (docs/cli.md): precedence, validation that names the culprit, exit code 2, the
//! reference file, and passwords that never reach any output.

use std::collections::HashMap;
use std::time::Duration;

use clap::Parser;
use jobrelay::config::cli::Cli;
use jobrelay::config::{Config, ConfigError, OPTIONS};

use crate::common;

/// Command-line arguments of one case.
type Args<'a> = Vec<&'a str>;
/// Environment of one case.
type Env<'a> = Vec<(&'a str, &'a str)>;

fn resolve(args: &[&str], env: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let mut argv = vec!["jobrelay"];
    argv.extend_from_slice(args);
    let cli = Cli::try_parse_from(argv).expect("flags parse");
    let env: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Config::resolve(&cli.flags, &|k| env.get(k).cloned())
}

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
    let p = dir.path().join(name);
    std::fs::write(&p, text).unwrap();
    p.to_string_lossy().into_owned()
}

#[test]
fn defaults_match_the_spec() {
    let c = resolve(&[], &[]).unwrap();
    assert_eq!(c.redis_url.expose(), "redis://127.0.0.1:6379");
    assert_eq!(c.table.to_string(), "pending_jobs");
    assert_eq!(c.namespace, "");
    assert_eq!(c.poll_interval, Duration::from_secs(1));
    assert_eq!(c.max_attempts, 25);
    assert_eq!(c.dedup_ttl, Duration::from_secs(900));
    assert_eq!(c.http_addr, Some("0.0.0.0:9898".parse().unwrap()));
    assert_eq!(c.shutdown_timeout, Duration::from_secs(25));
    assert_eq!(c.push_timeout, Duration::from_secs(5));
    assert_eq!(c.older_than, Duration::from_secs(60));
    assert!(!c.sweep);
}

#[test]
fn flag_beats_env_beats_file_beats_default() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        &dir,
        "c.toml",
        "batch_size = 30\nworkers = 3\npoll_interval = \"3s\"\nmax_attempts = 7\n",
    );
    let env = [
        ("JOBRELAY_CONFIG", file.as_str()),
        ("JOBRELAY_BATCH_SIZE", "20"),
        ("JOBRELAY_WORKERS", "2"),
    ];
    let c = resolve(&["--batch-size", "10"], &env).unwrap();
    assert_eq!(c.batch_size, 10, "flag wins");
    assert_eq!(c.workers, 2, "env beats file");
    assert_eq!(
        c.poll_interval,
        Duration::from_secs(3),
        "file beats default"
    );
    assert_eq!(c.max_attempts, 7);
    assert_eq!(c.dedup_ttl, Duration::from_secs(900), "default");
    // --config beats JOBRELAY_CONFIG.
    let other = write(&dir, "d.toml", "workers = 5\n");
    let c = resolve(&["--config", &other], &[("JOBRELAY_CONFIG", file.as_str())]).unwrap();
    assert_eq!(c.workers, 5);
    assert_eq!(c.batch_size, jobrelay::config::DEFAULT_BATCH_SIZE);
}

#[test]
fn empty_environment_variables_count_as_unset() {
    let c = resolve(&[], &[("JOBRELAY_BATCH_SIZE", ""), ("REDIS_URL", "")]).unwrap();
    assert_eq!(c.batch_size, jobrelay::config::DEFAULT_BATCH_SIZE);
    assert_eq!(c.redis_url.expose(), "redis://127.0.0.1:6379");
}

#[test]
fn durations_take_humantime_and_bare_zero() {
    let c = resolve(&["--dedup-ttl", "0", "--poll-interval", "500ms"], &[]).unwrap();
    assert_eq!(c.dedup_ttl, Duration::ZERO);
    assert_eq!(c.poll_interval, Duration::from_millis(500));
    let c = resolve(&["--dedup-ttl", "1h30m", "--http-addr", "off"], &[]).unwrap();
    assert_eq!(c.dedup_ttl, Duration::from_secs(5400));
    assert_eq!(c.http_addr, None);
}

#[test]
fn every_error_names_its_culprit() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(&dir, "c.toml", "batch_size = \"many\"\n");
    let unknown = write(&dir, "u.toml", "batchsize = 3\n");
    let broken = write(
        &dir,
        "b.toml",
        "database_url = \"postgres://u:topsecret@h/db\n",
    );
    let cases: Vec<(Args, Env, String)> = vec![
        (vec!["--batch-size", "ten"], vec![], "--batch-size".into()),
        (
            vec![],
            vec![("JOBRELAY_BATCH_SIZE", "0")],
            "JOBRELAY_BATCH_SIZE".into(),
        ),
        (vec!["--workers", "65"], vec![], "--workers".into()),
        (
            vec![],
            vec![("JOBRELAY_POLL_INTERVAL", "soon")],
            "JOBRELAY_POLL_INTERVAL".into(),
        ),
        (vec!["--max-attempts=-1"], vec![], "--max-attempts".into()),
        (vec!["--dedup-ttl", "10s"], vec![], "--dedup-ttl".into()),
        (
            vec!["--http-addr", "localhost"],
            vec![],
            "--http-addr".into(),
        ),
        (
            vec!["--push-timeout", "1ms"],
            vec![],
            "--push-timeout".into(),
        ),
        (vec!["--log-format", "xml"], vec![], "--log-format".into()),
        (vec!["--table", "a.b.c"], vec![], "--table".into()),
        (vec!["--namespace", "a b"], vec![], "--namespace".into()),
        (
            vec![],
            vec![("DATABASE_URL", "mysql://x/y")],
            "DATABASE_URL".into(),
        ),
        (
            vec!["--redis-url", "http://x"],
            vec![],
            "--redis-url".into(),
        ),
        (
            vec!["--config", &file],
            vec![],
            format!("batch_size in {file}"),
        ),
        (
            vec!["--config", &unknown],
            vec![],
            format!("batchsize in {unknown}"),
        ),
        (
            vec!["--config", "/nonexistent.toml"],
            vec![],
            "--config".into(),
        ),
        (
            vec![],
            vec![("DATABASE_URL_FILE", "/nonexistent")],
            "DATABASE_URL_FILE".into(),
        ),
    ];
    for (args, env, culprit) in cases {
        let e = resolve(&args, &env).expect_err(&format!("{args:?} {env:?} must fail"));
        assert_eq!(e.culprit, culprit, "{args:?} {env:?}: {e}");
        assert!(e.to_string().starts_with(&format!("{culprit}: ")), "{e}");
    }
    let e = resolve(&["--config", &broken], &[]).unwrap_err();
    assert_eq!(e.culprit, "--config");
    assert!(e.reason.contains("line 1"), "{e}");
    assert!(!e.to_string().contains("topsecret"), "{e}");
}

#[test]
fn urls_can_come_from_files_but_not_twice() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(&dir, "db", "postgres://app:filepass@db.example:5432/app\n");
    let c = resolve(&["--database-url-file", &f], &[]).unwrap();
    assert_eq!(
        c.database_url.expose(),
        "postgres://app:filepass@db.example:5432/app"
    );
    assert!(!format!("{c:?}").contains("filepass"), "Debug redacts");
    assert!(format!("{}", c.database_url).contains("***"));
    // A file flag beats a URL from the environment (higher level wins)...
    let c = resolve(
        &["--database-url-file", &f],
        &[("DATABASE_URL", "postgres://x/y")],
    )
    .unwrap();
    assert_eq!(
        c.database_url.expose(),
        "postgres://app:filepass@db.example:5432/app"
    );
    // ...but both at the same level is ambiguous.
    let e = resolve(
        &[],
        &[
            ("DATABASE_URL", "postgres://x/y"),
            ("DATABASE_URL_FILE", &f),
        ],
    )
    .unwrap_err();
    assert_eq!(e.culprit, "DATABASE_URL_FILE");
}

#[test]
fn the_reference_file_lists_every_option_with_its_default() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/jobrelay.toml");
    let text = std::fs::read_to_string(path).unwrap();
    for (key, flag, _) in OPTIONS {
        assert!(
            text.lines().any(|l| l
                .trim_start_matches(['#', ' '])
                .starts_with(&format!("{key} ="))),
            "config/jobrelay.toml does not list {key} ({flag})"
        );
    }
    let from_file = resolve(&["--config", path, "--log-format", "json"], &[]).unwrap();
    let defaults = resolve(&["--log-format", "json"], &[]).unwrap();
    assert_eq!(
        format!("{from_file:?}").replace(&format!("Some({path:?})"), "None"),
        format!("{defaults:?}")
    );
}

/// The binary: bad configuration exits 2 with one line naming the flag, before connecting.
#[tokio::test]
async fn bad_configuration_exits_2_with_one_line() {
    for (args, env, culprit) in [
        (vec!["--batch-size", "lots"], vec![], "--batch-size"),
        (vec![], vec![("JOBRELAY_WORKERS", "0")], "JOBRELAY_WORKERS"),
        (
            vec!["--sweep", "--older-than", "yesterday"],
            vec![],
            "--older-than",
        ),
        (
            vec!["status"],
            vec![("JOBRELAY_DEDUP_TTL", "1s")],
            "JOBRELAY_DEDUP_TTL",
        ),
    ] {
        let (code, out, err) = common::run_relay(&args, &env).await;
        assert_eq!(code, 2, "{args:?}: {out}{err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(err.contains(culprit), "names {culprit}: {err}");
    }
    // The byte options: sizes with units, and a job limit above the batch cap is refused.
    for (args, culprit) in [
        (vec!["--batch-max-bytes", "lots"], "--batch-max-bytes"),
        (vec!["--max-job-size", "1"], "--max-job-size"),
        (
            vec!["--batch-max-bytes", "1mb", "--max-job-size", "2mb"],
            "--max-job-size",
        ),
    ] {
        let (code, out, err) = common::run_relay(&args, &[]).await;
        assert_eq!(code, 2, "{args:?}: {out}{err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(err.contains(culprit), "names {culprit}: {err}");
    }
}

/// Every usage error of the argument parser is one line naming the flag, exit 2; `--help` and
/// `--version` keep their output and exit 0.
#[tokio::test]
async fn usage_errors_are_one_line_naming_the_flag() {
    for (args, culprit) in [
        (vec!["--no-such-flag"], "--no-such-flag"),
        (vec!["--batch-size"], "--batch-size"),
        (vec!["status", "--jsn"], "--jsn"),
        (vec!["no-such-command"], "no-such-command"),
        (vec!["dead-letter", "purge"], "--id"),
        (vec!["dead-letter", "requeue", "--id"], "--id"),
        (vec!["--older-than", "1s"], "--sweep"),
    ] {
        let (code, out, err) = common::run_relay(&args, &[]).await;
        assert_eq!(code, 2, "{args:?}: {out}{err}");
        assert_eq!(out, "", "{args:?}");
        assert_eq!(err.lines().count(), 1, "{args:?}: one line: {err}");
        assert!(err.starts_with("jobrelay: "), "{err}");
        assert!(err.contains(culprit), "{args:?}: names {culprit}: {err}");
    }
    let (code, out, _) = common::run_relay(&["--help"], &[]).await;
    assert_eq!(code, 0);
    assert!(
        out.contains("Usage:") && out.contains("--batch-max-bytes"),
        "{out}"
    );
    let (code, out, _) = common::run_relay(&["--version"], &[]).await;
    assert_eq!(code, 0);
    assert_eq!(
        out.trim(),
        format!("jobrelay {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn byte_sizes_read_like_redis_sizes() {
    use jobrelay::config::parse_byte_size;
    assert_eq!(parse_byte_size("1048576"), Ok(1 << 20));
    assert_eq!(parse_byte_size("1mb"), Ok(1 << 20));
    assert_eq!(parse_byte_size("16MiB"), Ok(16 << 20));
    assert_eq!(parse_byte_size("512k"), Ok(512 << 10));
    assert_eq!(parse_byte_size(" 2 GB "), Ok(2 << 30));
    for bad in ["", "mb", "1.5mb", "-1", "1tb", "99999999999999999999"] {
        assert!(parse_byte_size(bad).is_err(), "{bad:?}");
    }
}

/// A password inside DATABASE_URL or REDIS_URL appears in no output, even when the
/// connection fails or the URL is rejected.
#[tokio::test]
async fn passwords_never_reach_the_output() {
    let pw = "S3cr3t-Pa55word";
    let closed = common::free_port();
    let db_bad = format!("postgres://app:{pw}@127.0.0.1:{closed}/nope?connect_timeout=1");
    let redis_bad = format!("redis://user:{pw}@127.0.0.1:{closed}");
    let db_wrong_pw = format!("postgres://nosuchuser:{pw}@127.0.0.1:5432/postgres");
    let invalid = format!("postgres://app:{pw}@host:notaport/db");
    let runs: Vec<(Args, Env)> = vec![
        (
            vec!["--sweep"],
            vec![("DATABASE_URL", &db_bad), ("REDIS_URL", &redis_bad)],
        ),
        (vec!["--sweep"], vec![("DATABASE_URL", &db_wrong_pw)]),
        (vec!["--sweep"], vec![("REDIS_URL", &redis_bad)]),
        (
            vec!["check"],
            vec![("DATABASE_URL", &db_bad), ("REDIS_URL", &redis_bad)],
        ),
        (vec!["status"], vec![("DATABASE_URL", &db_wrong_pw)]),
        (vec!["migrate"], vec![("DATABASE_URL", &db_bad)]),
        (vec!["status"], vec![("DATABASE_URL", &invalid)]),
        (vec!["--redis-url", &redis_bad, "--batch-size", "x"], vec![]),
    ];
    for (args, env) in runs {
        let (code, out, err) = common::run_relay(&args, &env).await;
        assert_ne!(code, 0, "{args:?} must fail");
        assert!(
            !out.contains(pw) && !err.contains(pw),
            "password leaked by {args:?}:\n{out}\n{err}"
        );
        assert!(
            !err.trim().is_empty() || !out.trim().is_empty(),
            "{args:?} says why it failed"
        );
    }
}

/// `--pg-max-connections` (docs/cli.md#postgres-connections): workers + 3 by default; below
/// that the wake-up lock, then the listener, give way; fewer than workers + 1 is refused.
#[test]
fn pg_max_connections_decides_the_footprint() {
    use jobrelay::config::PgFootprint;
    let fp = |args: &[&str]| resolve(args, &[]).unwrap().pg_footprint();
    let c = resolve(&["--workers", "2"], &[]).unwrap();
    assert_eq!(c.pg_max_connections, 5);
    for (n, pool, listener, wakeup_lock) in [
        ("10", 8, true, true),
        ("5", 3, true, true),
        ("4", 3, true, false),
        ("3", 3, false, false),
    ] {
        let got = fp(&["--workers", "2", "--pg-max-connections", n]);
        let want = PgFootprint {
            pool,
            listener,
            wakeup_lock,
        };
        assert_eq!(got, want, "--pg-max-connections {n}");
        assert_eq!(got.total(), n.parse::<u32>().unwrap().max(3));
    }
    assert_eq!(
        fp(&["--workers", "1", "--pg-max-connections", "2"]),
        PgFootprint {
            pool: 2,
            listener: false,
            wakeup_lock: false
        }
    );
    let e = resolve(&["--workers", "3"], &[("JOBRELAY_PG_MAX_CONNECTIONS", "3")]).unwrap_err();
    assert_eq!(e.culprit, "JOBRELAY_PG_MAX_CONNECTIONS");
    assert!(e.reason.contains("use at least 4"), "{}", e.reason);
    let e = resolve(&["--listen-url", "mysql://x"], &[]).unwrap_err();
    assert_eq!(e.culprit, "--listen-url");
}

/// `--prepared-statements`: `auto` unless told, as a bare flag (`true`), `=VALUE` or the
/// environment.
#[test]
fn prepared_statements_are_auto_unless_told() {
    use jobrelay::relay::PreparedStatements::{Always, Auto, Never};
    let claims = |args: &[&str], env: &[(&str, &str)]| {
        let c = resolve(args, env).unwrap();
        assert_eq!(
            c.batch_settings().prepared_statements,
            c.prepared_statements
        );
        c.prepared_statements
    };
    assert_eq!(claims(&[], &[]), Auto);
    assert_eq!(claims(&["--prepared-statements"], &[]), Always);
    assert_eq!(claims(&["--prepared-statements=false"], &[]), Never);
    assert_eq!(claims(&["--prepared-statements=auto"], &[]), Auto);
    assert_eq!(
        claims(&[], &[("JOBRELAY_PREPARED_STATEMENTS", "true")]),
        Always
    );
    let e = resolve(&[], &[("JOBRELAY_PREPARED_STATEMENTS", "sometimes")]).unwrap_err();
    assert_eq!(e.culprit, "JOBRELAY_PREPARED_STATEMENTS");
}

/// `--redis-allow-eviction` (a bare flag, or a boolean from the environment or the file),
/// `--redis-wait-replicas` and `--redis-wait-timeout`, which must be shorter than
/// `--push-timeout` when replicas are waited for.
#[test]
fn redis_safety_options_parse_and_name_their_culprit() {
    let c = resolve(&[], &[]).unwrap();
    assert!(!c.redis_allow_eviction);
    assert_eq!(
        (c.redis_wait_replicas, c.redis_wait_timeout),
        (0, Duration::from_secs(1))
    );
    let c = resolve(
        &[
            "--redis-allow-eviction",
            "--redis-wait-replicas",
            "2",
            "--redis-wait-timeout",
            "250ms",
        ],
        &[],
    )
    .unwrap();
    assert!(c.redis_allow_eviction);
    assert_eq!(
        (c.redis_wait_replicas, c.redis_wait_timeout),
        (2, Duration::from_millis(250))
    );
    let c = resolve(&["--redis-allow-eviction=false"], &[]).unwrap();
    assert!(!c.redis_allow_eviction);
    // The bare flag takes no value from the next argument.
    let c = resolve(&["--redis-allow-eviction", "--batch-size", "5"], &[]).unwrap();
    assert!(c.redis_allow_eviction && c.batch_size == 5);
    let c = resolve(&[], &[("JOBRELAY_REDIS_ALLOW_EVICTION", "yes")]).unwrap();
    assert!(c.redis_allow_eviction);
    for (args, env, culprit, says) in [
        (
            vec![],
            vec![("JOBRELAY_REDIS_ALLOW_EVICTION", "maybe")],
            "JOBRELAY_REDIS_ALLOW_EVICTION",
            "is not true or false",
        ),
        (
            vec!["--redis-wait-replicas", "1", "--redis-wait-timeout", "5s"],
            vec![],
            "--redis-wait-timeout",
            "--push-timeout",
        ),
        (
            vec!["--redis-wait-replicas", "101"],
            vec![],
            "--redis-wait-replicas",
            "out of range",
        ),
    ] {
        let e = resolve(&args, &env).unwrap_err();
        assert_eq!(e.culprit, culprit, "{e}");
        assert!(e.reason.contains(says), "{e}");
    }
}

/// The bullmq layout: BullMQ's default prefix as the default namespace, a namespace that cannot
/// be BullMQ's prefix and ':' refused, and a hash-tagged one accepted on a Cluster.
#[test]
fn bullmq_namespace_is_a_prefix_and_a_colon() {
    let c = resolve(&["--layout", "bullmq"], &[]).unwrap();
    assert_eq!(c.namespace, "bull:");
    let c = resolve(&["--layout", "bullmq", "--namespace", "app:"], &[]).unwrap();
    assert_eq!(c.namespace, "app:");
    for ns in ["bull", ":", "app:x"] {
        let e = resolve(&["--layout", "bullmq", "--namespace", ns], &[]).unwrap_err();
        assert_eq!(e.culprit, "--namespace", "{ns}");
        assert!(
            e.reason.contains("BullMQ's prefix followed by ':'"),
            "{e:?}"
        );
    }
    let cluster = ["--redis-url", "redis+cluster://127.0.0.1:7000"];
    let mut args = vec!["--layout", "bullmq", "--namespace", "{bull}:"];
    args.extend_from_slice(&cluster);
    assert_eq!(resolve(&args, &[]).unwrap().namespace, "{bull}:");
    let mut args = vec!["--layout", "bullmq"];
    args.extend_from_slice(&cluster);
    assert!(resolve(&args, &[]).unwrap_err().reason.contains("hash tag"));
    // Other layouts keep the empty default.
    assert_eq!(resolve(&["--layout", "celery"], &[]).unwrap().namespace, "");
}
