//! `benches/sessions`: each phase with tiny sizes, on its private Postgres and Redis.

use std::path::PathBuf;

#[path = "../../../benches/sessions/main.rs"]
#[allow(dead_code)]
mod sessions_bench;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sessions_benchmark_runs_with_small_sizes() {
    let opts = sessions_bench::Opts {
        relay_bin: PathBuf::from(env!("CARGO_BIN_EXE_jobrelay")),
        phases: vec!["drain".into(), "stream".into(), "fleet".into()],
        max_connections: 20,
        drain_rows: 3_000,
        stream_rate: 200,
        stream_secs: 3,
        fleet: 2,
        fleet_secs: 3,
    };
    let report = sessions_bench::run(&opts)
        .await
        .expect("the benchmark runs");
    for phase in ["drain", "stream"] {
        let p = &report[phase];
        assert!(p["samples"].as_u64().unwrap() >= 1, "{report:#}");
        assert!(p["idle_in_transaction_terminations"].is_u64(), "{report:#}");
        assert!(p["notify_calls_while_busy"].is_i64(), "{report:#}");
        assert!(p["horizon_gauge_max_seconds"].is_f64(), "{report:#}");
    }
    assert_eq!(report["fleet"]["relays"], 2, "{report:#}");
    assert!(
        report["fleet"]["refused"].as_u64().unwrap() >= 1,
        "{report:#}"
    );
}
