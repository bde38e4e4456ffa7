//! `benches/fleet`: one round of both configurations and the idle stage, with tiny sizes; its
//! settings.

use std::collections::HashMap;

use super::{database_exists, database_url};

#[path = "../../../benches/fleet/main.rs"]
#[allow(dead_code)]
mod fleet_bench;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_benchmark_runs_with_small_sizes_and_cleans_up() {
    let database_url = database_url();
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
    let args = fleet_bench::Args::from_lookup(&|k| env.get(k).cloned()).expect("settings");
    assert_eq!(
        args.fleet,
        fleet_bench::Shape {
            processes: 2,
            workers: 2
        }
    );
    let report = fleet_bench::fleet(&args)
        .await
        .expect("the fleet benchmark runs");

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
    assert!(
        !database_exists(database_url, &db).await,
        "{db} was dropped"
    );
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
    let defaults = fleet_bench::Args::from_lookup(&|k| (k == "JOBRELAY_BIN").then(|| bin.clone()))
        .expect("settings");
    assert_eq!(
        defaults.idle,
        Some(fleet_bench::IdleArgs {
            relays: 24,
            window: std::time::Duration::from_secs(10),
            latency_rows: 200,
            latency_gap: std::time::Duration::from_millis(50),
            quiet_rows: 20,
            quiet_gap: std::time::Duration::from_secs(2),
        })
    );
    let off = fleet_bench::Args::from_lookup(&|k| match k {
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
        let r = fleet_bench::Args::from_lookup(&|key| match key {
            "JOBRELAY_BIN" => Some(bin.clone()),
            _ if key == k => Some(v.into()),
            _ => None,
        });
        assert!(r.is_err(), "{k}={v} is refused");
    }
}
