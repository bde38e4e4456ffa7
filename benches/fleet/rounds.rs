//! The fleet benchmark's rounds: the baseline and the fleet alternating, their medians and
//! ratios, a table on stderr; then the idle stage; the JSON report.

use std::collections::HashMap;

use serde_json::{json, Value};

use super::drain::drain;
use super::figures::{show, summarize};
use super::idle::idle_stage;
use super::outbox::{PAYLOAD_BYTES, QUEUES};
use super::support::sandbox::Sandbox;
use super::support::stats::{median, round};
use super::{Args, BoxError, BASELINE};

/// The rounds (baseline, then fleet, each round), their summary on stderr, then the idle
/// stage; the report.
pub async fn run(args: &Args, sb: &Sandbox) -> Result<Value, BoxError> {
    let mut runs = Vec::new();
    let mut claims: HashMap<&str, Vec<f64>> = HashMap::new();
    let mut ratios = Vec::new();
    for round_no in 1..=args.rounds {
        let mut rates = [0.0; 2];
        for (i, (config, shape)) in [("baseline", BASELINE), ("fleet", args.fleet)]
            .into_iter()
            .enumerate()
        {
            let (r, c) = drain(sb, args, round_no, config, shape).await?;
            rates[i] = r["rows_per_second"].as_f64().unwrap_or(0.0);
            claims.entry(config).or_default().extend(c);
            runs.push(r);
        }
        ratios.push(round(rates[1] / rates[0], 3));
    }
    let of =
        |config: &str| -> Vec<&Value> { runs.iter().filter(|r| r["config"] == config).collect() };
    let baseline = summarize(BASELINE, &of("baseline"), &claims["baseline"]);
    let fleet = summarize(args.fleet, &of("fleet"), &claims["fleet"]);
    let rounds_exactly_once = runs.iter().all(|r| r["check"]["exactly_once"] == true);
    let of_medians = fleet["rows_per_second"].as_f64().unwrap_or(0.0)
        / baseline["rows_per_second"]
            .as_f64()
            .unwrap_or(f64::INFINITY);
    let ratio = json!({
        "per_round": ratios,
        "median": round(median(&ratios), 3),
        "of_medians": round(of_medians, 3),
    });
    let row = |what: &str, b: String, f: String| note!("  {what:<30} {b:>18} {f:>18}");
    let claims = |c: &Value| {
        format!(
            "{}/{}/{}",
            show(&c["p50"]),
            show(&c["p99"]),
            show(&c["max"])
        )
    };
    note!(
        "fleet: medians of {} rounds {:>24} {:>18}",
        args.rounds,
        "baseline 1x2",
        format!("fleet {}x{}", args.fleet.processes, args.fleet.workers)
    );
    row(
        "rows/s",
        show(&baseline["rows_per_second"]),
        show(&fleet["rows_per_second"]),
    );
    row(
        "claim ms p50/p99/max",
        claims(&baseline["claim_ms"]),
        claims(&fleet["claim_ms"]),
    );
    row(
        "PG µs/row (relays' backends)",
        show(&baseline["pg_us_per_row"]),
        show(&fleet["pg_us_per_row"]),
    );
    row(
        "PG µs/row (all of Postgres)",
        show(&baseline["pg_all_us_per_row"]),
        show(&fleet["pg_all_us_per_row"]),
    );
    note!(
        "  ratio fleet/baseline: median {} (rounds: {}); exactly once: {rounds_exactly_once}",
        show(&ratio["median"]),
        ratios
            .iter()
            .map(|r| r.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let idle = match &args.idle {
        Some(idle) => idle_stage(sb, args, idle).await?,
        None => Value::Null,
    };
    let exactly_once =
        rounds_exactly_once && (idle.is_null() || idle["check"]["exactly_once"] == true);
    Ok(json!({
        "settings": {
            "rows": args.rows,
            "rounds": args.rounds,
            "baseline": { "processes": BASELINE.processes, "workers": BASELINE.workers },
            "fleet": { "processes": args.fleet.processes, "workers": args.fleet.workers },
            "batch_size": jobrelay::config::DEFAULT_BATCH_SIZE,
            "queues": QUEUES,
            "payload_bytes": PAYLOAD_BYTES,
            "relay_bin": args.relay_bin.display().to_string(),
            "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            "idle": args.idle.as_ref().map(|i| json!({
                "relays": i.relays,
                "seconds": i.window.as_secs_f64(),
                "latency_rows": i.latency_rows,
                "latency_gap_ms": i.latency_gap.as_secs_f64() * 1000.0,
                "quiet_rows": i.quiet_rows,
                "quiet_gap_ms": i.quiet_gap.as_secs_f64() * 1000.0,
            })),
        },
        "runs": runs,
        "baseline": baseline,
        "fleet": fleet,
        "ratio": ratio,
        "idle": idle,
        "exactly_once": exactly_once,
    }))
}
