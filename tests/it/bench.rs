//! The benchmark programs run with tiny sizes so that they cannot rot. Not timed tests: they
//! check that every stage ran, delivered everything exactly once, and reported its figures (not
//! whether they meet the targets), and that what they created is gone.
//!
//! - `examples/bench`: drain, live rate and the naive comparison;
//! - `examples/fleet`: both configurations and the idle-fleet stage; the relays are this
//!   build's debug binary, handed over as `JOBRELAY_BIN` like any other setting.

use std::collections::HashMap;

#[path = "../../examples/bench/main.rs"]
#[allow(dead_code)]
mod bench_example;

#[path = "../../examples/fleet/main.rs"]
#[allow(dead_code)]
mod fleet;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_benchmark_runs_with_small_sizes_and_cleans_up() {
    let args = bench_example::Args {
        database_url: std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into()),
        redis_url: crate::common::redis_url(),
        rows: 2_000,
        naive_rows: 100,
        rate: 200,
        seconds: 1.0,
        insert_seconds: 0.4,
        workers: 2,
        batch_size: 500,
        layout: jobrelay::LayoutKind::Jobrelay,
        backlog_rows: 1_500,
        vacuumed: true,
    };
    let report = bench_example::bench(&args)
        .await
        .expect("the benchmark runs");
    assert_eq!(report["drain"]["rows"], 2_000);
    assert!(report["drain"]["rows_per_second"].as_f64().unwrap() > 0.0);
    assert!(
        report["drain"]["relay_cpu_seconds_per_100k"]
            .as_f64()
            .unwrap()
            >= 0.0
    );
    assert_eq!(report["drain_vacuumed"]["rows"], 2_000);
    assert_eq!(report["stages"]["rows"], 1_500);
    assert_eq!(report["stages"]["claim_ms"]["batches"], 3);
    assert_eq!(
        report["stages"]["claim_ms"]["mean_per_tenth_first_to_last"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
    assert_eq!(report["naive"]["rows"], 100);
    assert!(report["drain_over_naive"].as_f64().unwrap() > 0.0);
    assert_eq!(report["latency"]["jobs"], 200);
    for k in ["p50_ms", "p99_ms", "max_ms"] {
        assert!(report["latency"][k].as_f64().unwrap() >= 0.0, "{k}");
    }
    for k in [
        "inserts_per_second_with_trigger",
        "inserts_per_second_without_trigger",
    ] {
        assert!(report["notify_cost"][k].as_f64().unwrap() > 0.0, "{k}");
    }
    // Its database and its Redis keys are gone.
    let db = report["sandbox"]["database"].as_str().unwrap().to_owned();
    assert!(db.starts_with("jobrelay_bench_"), "{db}");
    let mut admin = <sqlx::PgConnection as sqlx::Connection>::connect(&args.database_url)
        .await
        .unwrap();
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(&db)
            .fetch_one(&mut admin)
            .await
            .unwrap();
    assert!(!exists, "{db} was dropped");
    let ns = crate::common::Namespace::on(&args.redis_url)
        .with_prefix(report["sandbox"]["namespace"].as_str().unwrap());
    assert!(
        ns.keys().await.is_empty(),
        "no key left under {}",
        ns.prefix
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_benchmark_runs_with_small_sizes_and_cleans_up() {
    let database_url = std::env::var("DATABASE_URL")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let env: HashMap<&str, String> = [
        ("FLEET_ROWS", "2000".to_owned()),
        ("FLEET_PROCESSES", "2".to_owned()),
        ("FLEET_WORKERS", "2".to_owned()),
        ("FLEET_ROUNDS", "1".to_owned()),
        ("FLEET_TIMEOUT", "2m".to_owned()),
        ("FLEET_IDLE_RELAYS", "2".to_owned()),
        ("FLEET_IDLE_SECONDS", "2".to_owned()),
        ("FLEET_LATENCY_ROWS", "10".to_owned()),
        ("FLEET_QUIET_ROWS", "2".to_owned()),
        ("JOBRELAY_BIN", env!("CARGO_BIN_EXE_jobrelay").to_owned()),
        ("DATABASE_URL", database_url.clone()),
        ("REDIS_URL", crate::common::redis_url()),
    ]
    .into_iter()
    .collect();
    let args = fleet::Args::from_lookup(&|k| env.get(k).cloned()).expect("settings");
    assert_eq!(
        args.fleet,
        fleet::Shape {
            processes: 2,
            workers: 2
        }
    );
    let report = fleet::fleet(&args).await.expect("the fleet benchmark runs");

    assert_every_run_delivered_exactly_once(&report);
    assert_the_idle_stage_ran(&report);
    assert_the_sandbox_is_gone(&report, &database_url, &args.redis_url).await;
}

/// Both configurations of the one round delivered every job exactly once and reported figures.
fn assert_every_run_delivered_exactly_once(report: &serde_json::Value) {
    assert_eq!(report["exactly_once"], true, "{report:#}");
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "one round: the baseline, then the fleet");
    for (run, (config, processes)) in runs.iter().zip([("baseline", 1), ("fleet", 2)]) {
        assert_eq!(run["config"], config);
        assert_eq!(run["processes"], processes);
        assert_eq!(run["workers"], 2);
        assert_eq!(run["rows"], 2000);
        let check = &run["check"];
        assert_eq!(check["exactly_once"], true, "{run:#}");
        assert_eq!(check["jobs_in_queues"], 2000);
        for k in [
            "missing",
            "duplicated",
            "unexpected",
            "left_in_table",
            "dead_lettered",
        ] {
            assert_eq!(check[k], 0, "{k}: {run:#}");
        }
        assert!(run["rows_per_second"].as_f64().unwrap() > 0.0);
        // Every batch's line carried claim_ms: 2,000 rows are at least one batch.
        assert!(run["claim_ms"]["batches"].as_u64().unwrap() >= 1, "{run:#}");
        for k in ["p50", "p99", "max"] {
            assert!(run["claim_ms"][k].as_f64().unwrap() > 0.0, "{k}: {run:#}");
        }
        assert!(run["relay_backends"].as_u64().unwrap() > 0, "{run:#}");
        assert!(run["pg_us_per_row"].as_f64().unwrap() > 0.0, "{run:#}");
        assert!(run["pg_all_us_per_row"].as_f64().unwrap() > 0.0, "{run:#}");
    }
    for config in ["baseline", "fleet"] {
        let c = &report[config];
        assert!(c["rows_per_second"].as_f64().unwrap() > 0.0, "{c:#}");
        for k in ["p50", "p99", "max"] {
            assert!(c["claim_ms"][k].as_f64().unwrap() > 0.0, "{config} {k}");
        }
        assert!(c["pg_us_per_row"].as_f64().unwrap() > 0.0, "{c:#}");
    }
    let ratio = &report["ratio"];
    assert!(ratio["median"].as_f64().unwrap() > 0.0);
    assert_eq!(ratio["per_round"].as_array().unwrap().len(), 1);
}

/// The idle stage: 2 relays of the default 2 workers, 2 s idle, 10 + 2 single rows.
fn assert_the_idle_stage_ran(report: &serde_json::Value) {
    let idle = &report["idle"];
    assert_eq!(idle["relays"], 2, "{idle:#}");
    assert_eq!(idle["workers"], 2, "{idle:#}");
    assert!(idle["relay_backends"].as_u64().unwrap() >= 2, "{idle:#}");
    assert!(idle["seconds"].as_f64().unwrap() >= 2.0, "{idle:#}");
    for k in [
        "pg_pct_of_core",
        "pg_relay_backends_pct_of_core",
        "relays_pct_of_core",
        "redis_pct_of_core",
    ] {
        assert!(idle[k].as_f64().unwrap() >= 0.0, "{k}: {idle:#}");
    }
    assert!(idle["pg_pct_of_core"].as_f64().unwrap() > 0.0, "{idle:#}");
    for (series, rows) in [("steady", 10), ("quiet", 2)] {
        let s = &idle["latency_ms"][series];
        assert_eq!(s["series"], series, "{idle:#}");
        assert_eq!(s["rows"], rows, "{series}: {idle:#}");
        assert_eq!(s["popped"], rows, "{series}: {idle:#}");
        assert_eq!(s["missing"], 0, "{series}: {idle:#}");
        let (p50, p99, max) = (
            s["p50"].as_f64().unwrap(),
            s["p99"].as_f64().unwrap(),
            s["max"].as_f64().unwrap(),
        );
        assert!(0.0 < p50 && p50 <= p99 && p99 <= max, "{series}: {idle:#}");
        assert!(s["p99_ok"].is_boolean(), "{series}: {idle:#}");
    }
    assert!(idle["targets"]["pg_ok"].is_boolean(), "{idle:#}");
    assert!(idle["targets"]["p99_ok"].is_boolean(), "{idle:#}");
    let check = &idle["check"];
    assert_eq!(check["exactly_once"], true, "{idle:#}");
    assert_eq!(check["popped"], 12, "{idle:#}");
    assert_eq!(check["jobs_in_queues"], 12, "{idle:#}");
    assert_eq!(report["settings"]["idle"]["relays"], 2);
}

/// Its database, its Redis keys and its logs are gone.
async fn assert_the_sandbox_is_gone(
    report: &serde_json::Value,
    database_url: &str,
    redis_url: &str,
) {
    let db = report["sandbox"]["database"].as_str().unwrap().to_owned();
    assert!(db.starts_with("jobrelay_fleet_"), "{db}");
    let mut admin = <sqlx::PgConnection as sqlx::Connection>::connect(database_url)
        .await
        .unwrap();
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(&db)
            .fetch_one(&mut admin)
            .await
            .unwrap();
    assert!(!exists, "{db} was dropped");
    let ns = crate::common::Namespace::on(redis_url)
        .with_prefix(report["sandbox"]["namespace"].as_str().unwrap());
    assert!(
        ns.keys().await.is_empty(),
        "no key left under {}",
        ns.prefix
    );
    assert!(!std::env::temp_dir().join(&db).exists(), "logs removed");
}

#[test]
fn the_idle_stage_is_on_by_default_and_off_with_zero_relays() {
    let bin = env!("CARGO_BIN_EXE_jobrelay").to_owned();
    let defaults = fleet::Args::from_lookup(&|k| (k == "JOBRELAY_BIN").then(|| bin.clone()))
        .expect("settings");
    assert_eq!(
        defaults.idle,
        Some(fleet::IdleArgs {
            relays: 24,
            window: std::time::Duration::from_secs(10),
            latency_rows: 200,
            latency_gap: std::time::Duration::from_millis(50),
            quiet_rows: 20,
            quiet_gap: std::time::Duration::from_secs(2),
        })
    );
    let off = fleet::Args::from_lookup(&|k| match k {
        "JOBRELAY_BIN" => Some(bin.clone()),
        "FLEET_IDLE_RELAYS" => Some("0".into()),
        _ => None,
    })
    .expect("settings");
    assert_eq!(off.idle, None);
    for (k, v) in [
        ("FLEET_IDLE_RELAYS", "-1"),
        ("FLEET_IDLE_SECONDS", "0"),
        ("FLEET_LATENCY_ROWS", "0"),
        ("FLEET_LATENCY_GAP", "fast"),
    ] {
        let r = fleet::Args::from_lookup(&|key| match key {
            "JOBRELAY_BIN" => Some(bin.clone()),
            _ if key == k => Some(v.into()),
            _ => None,
        });
        assert!(r.is_err(), "{k}={v} is refused");
    }
}
