//! `benches/wait`: two rounds on a private primary and replica.

#[path = "../../../benches/wait/main.rs"]
#[allow(dead_code)]
mod wait_bench;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wait_benchmark_runs_with_two_rounds() {
    let report = wait_bench::wait_cost(2, wait_bench::Servers::default())
        .await
        .expect("the benchmark runs");
    assert_eq!(report["rounds"], 2, "{report}");
    for size in [1, 1000] {
        for kind in ["without_wait", "with_wait_1"] {
            for figure in ["median_ms", "jobs_per_s"] {
                let key = format!("push_{size}_jobs_{kind}_{figure}");
                assert!(report[&key].as_f64().unwrap() > 0.0, "{key}: {report}");
            }
        }
    }
}
