//! `benches/horizon`: phases A and B of a second each, and a short simulated hour.

use std::time::Duration;

use super::{database_exists, database_url};

#[path = "../../../benches/horizon/main.rs"]
#[allow(dead_code)]
mod horizon_bench;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_horizon_benchmark_runs_with_small_sizes_and_drops_its_database() {
    let args = horizon_bench::Args {
        database_url: database_url(),
        rate: 300,
        workers: 2,
        phase: Duration::from_secs(1),
        pairs: 1,
        window: Duration::from_millis(500),
        hour_rows: 2_000,
    };
    let (report, db) = horizon_bench::horizon(&args)
        .await
        .expect("the benchmark runs");

    let phases: Vec<&str> = report["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["phase"].as_str().unwrap())
        .collect();
    assert_eq!(phases, ["A1", "B1"], "{report:#}");
    for phase in report["phases"].as_array().unwrap() {
        let w = &phase["last_window"];
        assert!(
            w["batches"].is_u64() && w["dead_tuples"].is_i64(),
            "{report:#}"
        );
        assert!(
            w["pg_cpu_us_per_job"].as_f64().unwrap() >= 0.0,
            "{report:#}"
        );
    }
    let windows = report["windows"].as_array().unwrap();
    assert!(windows.len() >= 4, "two windows a phase: {report:#}");
    let jobs: u64 = windows.iter().map(|w| w["jobs"].as_u64().unwrap()).sum();
    assert!(
        jobs > 0,
        "the workers claimed the stream's rows: {report:#}"
    );
    // The hour: at least one window, at most one per tenth, each with its claim mean.
    let hour = report["hour"].as_array().unwrap();
    assert!((1..=10).contains(&hour.len()), "{report:#}");
    assert_eq!(
        report["hour_claim_mean_ms_per_tenth"]
            .as_array()
            .unwrap()
            .len(),
        hour.len()
    );
    assert!(report["settings"]["autovacuum"].is_string(), "{report:#}");

    assert!(db.starts_with("jobrelay_horizon_"), "{db}");
    assert!(
        !database_exists(&args.database_url, &db).await,
        "{db} was dropped"
    );
}
