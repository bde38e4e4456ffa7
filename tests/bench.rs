//! The benchmark program runs (with tiny sizes) so that it cannot rot. Not a timed test: it
//! checks that every stage ran, delivered everything, and reported its figures.

#[path = "../examples/bench/main.rs"]
#[allow(dead_code)]
mod bench;

mod common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_benchmark_runs_with_small_sizes_and_cleans_up() {
    let args = bench::Args {
        database_url: std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into()),
        redis_url: common::redis_url(),
        rows: 2_000,
        naive_rows: 100,
        rate: 200,
        seconds: 1.0,
        insert_seconds: 0.4,
        workers: 2,
        batch_size: 500,
        layout: jobrelay::LayoutKind::Jobrelay,
    };
    let report = bench::bench(&args).await.expect("the benchmark runs");
    assert_eq!(report["drain"]["rows"], 2_000);
    assert!(report["drain"]["rows_per_second"].as_f64().unwrap() > 0.0);
    assert!(
        report["drain"]["relay_cpu_seconds_per_100k"]
            .as_f64()
            .unwrap()
            >= 0.0
    );
    assert_eq!(report["stages"]["rows"], 500);
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
    let ns = common::Namespace {
        prefix: report["sandbox"]["namespace"].as_str().unwrap().to_owned(),
        url: args.redis_url.clone(),
    };
    assert!(
        ns.keys().await.is_empty(),
        "no key left under {}",
        ns.prefix
    );
}
