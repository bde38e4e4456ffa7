//! `benches/relay`: every stage, the drain also vacuumed, with tiny sizes.

use super::{database_exists, database_url};

#[path = "../../../benches/relay/main.rs"]
#[allow(dead_code)]
mod relay_bench;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_benchmark_runs_with_small_sizes_and_cleans_up() {
    let args = relay_bench::Args {
        database_url: database_url(),
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
        options: "{}".to_owned(),
        // Keyed rows (interleaved over 7 keys) through every stage: the COPY with the key
        // locks off, the drain and stages, a key per latency row.
        ordering_keys: 7,
        // Claims prepared once per connection, executed again: every stage still relays.
        prepared_statements: jobrelay::relay::PreparedStatements::Always,
        stages: ["drain", "stages", "naive", "latency", "notify_cost"]
            .map(str::to_owned)
            .to_vec(),
    };
    let report = relay_bench::bench(&args).await.expect("the benchmark runs");
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
    // 1,500 rows in batches of 500, and with ordering keys a first claim of key heads (one
    // row per key) before the claim of runs takes them 500 at a time.
    let batches = report["stages"]["claim_ms"]["batches"].as_u64().unwrap();
    assert!((3..=4).contains(&batches), "{batches} batches");
    assert_eq!(
        report["stages"]["claim_ms"]["mean_per_tenth_first_to_last"]
            .as_array()
            .unwrap()
            .len() as u64,
        batches
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
    assert!(
        !database_exists(&args.database_url, &db).await,
        "{db} was dropped"
    );
    let ns = crate::common::Namespace::on(&args.redis_url)
        .with_prefix(report["sandbox"]["namespace"].as_str().unwrap());
    assert!(
        ns.keys().await.is_empty(),
        "no key left under {}",
        ns.prefix
    );
}
