//! The cost of `--redis-wait-replicas 1`: pushes through the relay's sink (`RedisSink`) into a
//! private primary with one replica, with and without `WAIT 1` after the push, alternating
//! (ABBA order per round, so a drift in machine load hits both alike), for batches of 1 job
//! and of 1,000 jobs (200-byte payloads). Prints the median time of one push of each kind and
//! the jobs per second it makes, as one JSON object.
//!
//! ```text
//! cargo bench --bench wait
//! ```
//!
//! It starts its own `redis-server` pair (primary and `--replicaof` replica, no persistence)
//! on free ports in a temporary directory and kills them at the end, also on SIGINT or SIGTERM.
//! `BENCH_ROUNDS` (default 40) sets the rounds; each round pushes every kind twice. The servers
//! are `servers.rs`.

// Each benchmark uses a part of it; also loaded by the others when the tests compile them all.
#[allow(clippy::duplicate_mod, dead_code)]
#[macro_use]
#[path = "../support/mod.rs"]
mod support;

#[path = "servers.rs"]
mod servers;

use std::time::{Duration, Instant};

use jobrelay::broker::connection::connect;
use jobrelay::broker::redis_sink::RedisSink;
use jobrelay::broker::safety::RedisSafety;
use jobrelay::relay::JobSink;
use jobrelay::{Enqueuer, Job};

use servers::Pair;
pub use servers::Servers;
use support::stats::median;
pub use support::BoxError;

fn jobs(n: usize) -> Vec<Job> {
    (0..n)
        .map(|_| Job {
            uuid: uuid::Uuid::new_v4(),
            queue: "bench".into(),
            job_type: "Bench".into(),
            payload: vec![b'p'; 200],
            parent_uuid: None,
            predecessor_uuid: None,
            dead_parent: false,
            run_at: None,
            created_at: chrono::Utc::now(),
            headers: Default::default(),
            options: Default::default(),
            ordering_key: None,
        })
        .collect()
}

/// Runs `rounds` rounds on a private pair started into `servers` (killed at the end); returns
/// the JSON report.
pub async fn wait_cost(rounds: usize, servers: Servers) -> Result<serde_json::Value, BoxError> {
    let pair = Pair::start(servers).await?;
    let primary = &pair.primary;
    let timeout = Duration::from_secs(5);
    let enqueuer = Enqueuer::new("bench:", Duration::from_secs(900));
    let plain = RedisSink::new(enqueuer.clone(), connect(primary, timeout).await?, timeout)
        .with_safety(RedisSafety::default());
    let waiting = RedisSink::new(enqueuer, connect(primary, timeout).await?, timeout).with_safety(
        RedisSafety {
            wait_replicas: 1,
            ..RedisSafety::default()
        },
    );
    // Warm-up: load the script, look up the policy, fill the connection pools.
    for sink in [&plain, &waiting] {
        for _ in 0..5 {
            sink.push(&jobs(1000)).await?;
        }
    }

    let sizes = [1usize, 1000];
    // [size][with wait] -> push times in seconds
    let mut times: Vec<[Vec<f64>; 2]> = sizes.iter().map(|_| [Vec::new(), Vec::new()]).collect();
    for round in 0..rounds {
        for (s, &size) in sizes.iter().enumerate() {
            let order: [usize; 4] = if round % 2 == 0 {
                [0, 1, 1, 0]
            } else {
                [1, 0, 0, 1]
            };
            for w in order {
                let sink = if w == 0 { &plain } else { &waiting };
                let batch = jobs(size);
                let t = Instant::now();
                let results = sink.push(&batch).await?;
                let elapsed = t.elapsed().as_secs_f64();
                if let Some(Err(e)) = results.iter().find(|r| r.is_err()) {
                    return Err(format!("a push failed: {e}").into());
                }
                times[s][w].push(elapsed);
            }
        }
    }
    pair.servers.kill();

    let mut out = serde_json::Map::new();
    out.insert("rounds".into(), rounds.into());
    for (s, &size) in sizes.iter().enumerate() {
        for (w, name) in ["without_wait", "with_wait_1"].iter().enumerate() {
            let m = median(&times[s][w]);
            out.insert(
                format!("push_{size}_jobs_{name}_median_ms"),
                serde_json::json!((m * 1e5).round() / 100.0),
            );
            out.insert(
                format!("push_{size}_jobs_{name}_jobs_per_s"),
                serde_json::json!((size as f64 / m).round()),
            );
        }
    }
    Ok(serde_json::Value::Object(out))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    if !support::cli::started_by_cargo_bench("wait") {
        return Ok(());
    }
    let rounds = support::env::num("BENCH_ROUNDS", 40)?;
    let servers = Servers::default();
    {
        let servers = servers.clone();
        tokio::spawn(async move {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("signal handler");
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            servers.kill();
            std::process::exit(130);
        });
    }
    println!("{}", wait_cost(rounds, servers).await?);
    Ok(())
}
