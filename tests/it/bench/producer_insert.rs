//! `benches/producer_insert.rs`: every measurement, with tiny sizes.

use super::{database_exists, database_url};

#[allow(dead_code)]
#[path = "../../../benches/producer_insert.rs"]
mod producer_bench;

/// With tiny sizes: it reports rates and drops its database.
#[tokio::test]
async fn the_producer_benchmark_runs_and_drops_its_database() {
    let admin = database_url();
    let sizes = producer_bench::Sizes {
        single_tx: 5,
        batch_tx: 2,
        baseline_tx: 1,
    };
    let report = producer_bench::run(&admin, sizes).await.unwrap();
    for key in [
        "single_job_tx",
        "thousand_job_tx",
        "row_by_row_baseline_thousand_job_tx",
    ] {
        assert!(
            report[key]["jobs_per_second"].as_f64().unwrap() > 0.0,
            "{report}"
        );
    }
    let db = report["database"]
        .as_str()
        .unwrap()
        .split(' ')
        .next()
        .unwrap();
    assert!(db.starts_with("jobrelay_bench_producer_"), "{report}");
    assert!(!database_exists(&admin, db).await, "{db} was dropped");
}
