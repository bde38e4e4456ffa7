//! The idle-fleet stage: what an idle fleet costs Postgres, the relays and Redis, and how soon
//! it relays a single row; a summary on stderr with PASS/FAIL against the targets.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use uuid::Uuid;

use super::consumer::Consumer;
use super::figures::show;
use super::latency::{latency_series, latency_stats, IDLE_P99_TARGET_MS};
use super::logs::Logs;
use super::relays::Fleet;
use super::snapshot::Snapshot;
use super::support::procfs;
use super::support::sandbox::{self, Sandbox};
use super::support::stats::round;
use super::{Args, BoxError, IdleArgs, Shape};

/// The idle-fleet targets of the issue: Postgres CPU (all of it) while the fleet idles, as a
/// percentage of one core, and a single row's latency p99.
pub const IDLE_PG_TARGET_PCT: f64 = 5.0;
/// Quiet time after the idle fleet is ready and before its CPU is measured: 24 processes that
/// just started are still opening their pools on a small machine.
const IDLE_SETTLE: Duration = Duration::from_secs(2);

/// The idle-fleet stage (issue: "an idle fleet is cheap and still quick"): `relays` relays of
/// the default workers on an empty table; the CPU of all of Postgres, of the relays and of
/// Redis while they idle; then single rows' latency from commit to a consumer's BRPOP.
pub async fn idle_stage(sb: &Sandbox, args: &Args, idle: &IdleArgs) -> Result<Value, BoxError> {
    let shape = Shape {
        processes: idle.relays,
        workers: jobrelay::config::DEFAULT_WORKERS,
    };
    sb.reset_table().await?;
    let max_connections: String = sqlx::query_scalar("SHOW max_connections")
        .fetch_one(&sb.pool)
        .await?;
    let mut fleet = Fleet::start(sb, args, shape, "idle")?;
    fleet.wait_ready().await?;
    tokio::time::sleep(IDLE_SETTLE).await;
    fleet.check_alive()?;

    // Idle cost.
    let load = procfs::load_average();
    let before = Snapshot::take(sb.redis()).await;
    let relays_before = fleet.cpu();
    tokio::time::sleep(idle.window).await;
    let relays_after = fleet.cpu();
    let after = Snapshot::take(sb.redis()).await;
    fleet.check_alive()?;
    let backends = sb.relay_backends().await?;
    let wall = after.at.duration_since(before.at).as_secs_f64();
    let pct = |cpu: f64| round(cpu / wall * 100.0, 3);
    let pg_all = after.postgres_since(&before, None).map(pct);
    let pg_relay = after.postgres_since(&before, Some(&backends)).map(pct);
    let relays: Option<f64> = relays_after
        .iter()
        .zip(&relays_before)
        .map(|(a, b)| a.since(b))
        .sum();
    let redis = after.redis.zip(before.redis).map(|(a, b)| pct(a - b));

    // Latency: a consumer BRPOPs while single rows commit.
    let mut consumer = Consumer::start(sb)?;
    let steady = latency_series(
        sb,
        &mut consumer,
        &mut fleet,
        idle.latency_rows,
        idle.latency_gap,
        false,
        0,
    )
    .await?;
    let quiet = latency_series(
        sb,
        &mut consumer,
        &mut fleet,
        idle.quiet_rows,
        idle.quiet_gap,
        true,
        idle.latency_rows,
    )
    .await?;
    consumer.finish()?;
    let popped = std::mem::take(&mut consumer.popped);
    drop(consumer);
    fleet.stop().await?;
    let logs = Logs::read(&fleet)?;
    drop(fleet);
    let uuids: Vec<Uuid> = steady.iter().chain(&quiet).map(|(u, _)| *u).collect();
    let popped_uuids: Vec<Option<Uuid>> = popped.iter().map(|p| p.uuid).collect();
    let check = sb.check_with(&uuids, &popped_uuids).await?;
    let mut con = sb.redis_con().await?;
    sandbox::unlink_keys(&mut con, sb.namespace()).await;

    let mut first_pop: HashMap<Uuid, Instant> = HashMap::new();
    for p in &popped {
        if let Some(u) = p.uuid {
            first_pop.entry(u).or_insert(p.at);
        }
    }
    let steady = latency_stats("steady", &steady, &first_pop, idle.latency_gap);
    let quiet =
        (idle.quiet_rows > 0).then(|| latency_stats("quiet", &quiet, &first_pop, idle.quiet_gap));
    let pg_ok = pg_all.is_some_and(|p| p <= IDLE_PG_TARGET_PCT);
    let report = json!({
        "relays": shape.processes,
        "workers": shape.workers,
        "relay_backends": backends.len(),
        "max_connections": max_connections.parse::<u64>().ok(),
        "seconds": round(wall, 3),
        "pg_pct_of_core": pg_all,
        "pg_relay_backends_pct_of_core": pg_relay,
        "relays_pct_of_core": relays.map(pct),
        "redis_pct_of_core": redis,
        "busy_cores": round((after.busy - before.busy) / wall.max(1e-9), 3),
        "load_average_before": load,
        "latency_ms": { "steady": steady, "quiet": quiet },
        "targets": {
            "pg_pct_of_core": IDLE_PG_TARGET_PCT,
            "p99_ms": IDLE_P99_TARGET_MS,
            "pg_ok": pg_ok,
            "p99_ok": steady["p99_ok"],
        },
        "batches": logs.claim_ms.len(),
        "claimed": logs.claimed,
        "log_warnings": logs.warnings,
        "first_warning": logs.first_warning,
        "check": check,
    });
    let verdict = |ok: bool| if ok { "PASS" } else { "FAIL" };
    let pct_text = |v: &Value| {
        v.as_f64()
            .map_or_else(|| "n/a".to_owned(), |x| format!("{x:.2} %"))
    };
    note!(
        "fleet: idle {}x{}: Postgres {} of a core over {:.1} s (relays' {} backends {}) [target \
         ≤ {IDLE_PG_TARGET_PCT} %: {}]; relays {}, Redis {}",
        shape.processes,
        shape.workers,
        pct_text(&report["pg_pct_of_core"]),
        wall,
        backends.len(),
        pct_text(&report["pg_relay_backends_pct_of_core"]),
        verdict(pg_ok),
        pct_text(&report["relays_pct_of_core"]),
        pct_text(&report["redis_pct_of_core"]),
    );
    let series = |s: &Value| {
        format!(
            "{} ms gap: commit -> BRPOP ms p50/p99/max {}/{}/{} ({} rows{}) [p99 ≤ \
             {IDLE_P99_TARGET_MS} ms: {}]",
            show(&s["gap_ms"]),
            show(&s["p50"]),
            show(&s["p99"]),
            show(&s["max"]),
            s["rows"],
            match s["missing"].as_u64() {
                Some(0) | None => String::new(),
                Some(n) => format!(", {n} NOT popped"),
            },
            verdict(s["p99_ok"] == true),
        )
    };
    note!(
        "fleet: idle {}x{}: {}",
        shape.processes,
        shape.workers,
        series(&report["latency_ms"]["steady"])
    );
    if !report["latency_ms"]["quiet"].is_null() {
        note!(
            "fleet: idle {}x{}: {}",
            shape.processes,
            shape.workers,
            series(&report["latency_ms"]["quiet"])
        );
    }
    note!(
        "fleet: idle {}x{}: exactly once: {}; {} log warnings{}",
        shape.processes,
        shape.workers,
        report["check"]["exactly_once"],
        logs.warnings,
        report["first_warning"]
            .as_str()
            .map_or_else(String::new, |w| format!(", first: {w}")),
    );
    Ok(report)
}
