//! The figures of the fleet benchmark's runs: claim durations, medians over the runs of a
//! configuration, and how they print.

use serde_json::{json, Value};

use super::support::stats::{median, percentile, round};
use super::Shape;

/// p50, p99 and max of claim durations.
pub fn claim_stats(ms: &[f64]) -> Value {
    let mut v = ms.to_vec();
    v.sort_by(f64::total_cmp);
    json!({
        "batches": v.len(),
        "p50": round(percentile(&v, 0.50), 3),
        "p99": round(percentile(&v, 0.99), 3),
        "max": round(v.last().copied().unwrap_or(0.0), 3),
    })
}

/// How the table stood when the rows landed.
pub fn table_state(vacuumed: bool) -> &'static str {
    if vacuumed {
        "VACUUM (ANALYZE) after the COPY (FLEET_VACUUMED: not a production state)"
    } else {
        "analysed while empty, then COPYed in one transaction"
    }
}

/// A JSON number as `{}` prints an f64 (80000, 0.853), anything else as JSON.
pub fn show(v: &Value) -> String {
    v.as_f64().map_or_else(|| v.to_string(), |x| x.to_string())
}

/// Medians over the runs of one configuration.
pub fn summarize(shape: Shape, runs: &[&Value], all_claims: &[f64]) -> Value {
    let med = |f: &dyn Fn(&Value) -> Option<f64>| {
        let v: Vec<f64> = runs.iter().filter_map(|r| f(r)).collect();
        (!v.is_empty()).then(|| round(median(&v), 3))
    };
    json!({
        "processes": shape.processes,
        "workers": shape.workers,
        "runs": runs.len(),
        "rows_per_second": med(&|r| r["rows_per_second"].as_f64()),
        "rows_per_second_each_run": runs.iter().map(|r| r["rows_per_second"].clone()).collect::<Vec<_>>(),
        "claim_ms": {
            "p50": med(&|r| r["claim_ms"]["p50"].as_f64()),
            "p99": med(&|r| r["claim_ms"]["p99"].as_f64()),
            "max": med(&|r| r["claim_ms"]["max"].as_f64()),
        },
        "claim_ms_all_batches": claim_stats(all_claims),
        "pg_us_per_row": med(&|r| r["pg_us_per_row"].as_f64()),
        "pg_all_us_per_row": med(&|r| r["pg_all_us_per_row"].as_f64()),
        "relay_us_per_row": med(&|r| r["relay_us_per_row"].as_f64()),
        "redis_us_per_row": med(&|r| r["redis_us_per_row"].as_f64()),
        "busy_cores": med(&|r| r["busy_cores"].as_f64()),
    })
}
