//! The cost of watching the Redis side (docs/redis-side.md#what-it-costs): what one daemon's
//! watch asks of Redis for 100 queues, per minute (12 samples, one every 5 s), in the sidekiq
//! layout (20 Sidekiq processes' heartbeats read, one `LLEN` and `LINDEX` per queue) and in the
//! bullmq layout (`CLIENT LIST` with 20 named clients, and each oldest job's hash). Prints, per
//! layout, the median Redis CPU of one sample (`INFO commandstats`, the commands' own time) and
//! of a minute's 12 samples (`INFO cpu`, the server's whole time, including reading and writing
//! the replies), and the watch's own time per sample, as one JSON object.
//!
//! ```text
//! cargo bench --bench redis_side
//! ```
//!
//! It starts its own `redis-server` (no persistence, a free port, a temporary directory) and
//! kills it at the end. `BENCH_ROUNDS` (default 15) sets how many minutes' worth are measured.

// Each benchmark uses a part of it; also loaded by the others when the tests compile them all.
#[allow(clippy::duplicate_mod, dead_code)]
#[macro_use]
#[path = "../support/mod.rs"]
mod support;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use jobrelay::admin::queues;
use jobrelay::broker::connection::connect;
use jobrelay::LayoutKind;
use support::redis_info::{command_usec, cpu_seconds};
use support::stats::median;
pub use support::BoxError;

/// Queues watched, as a daemon watches at most.
const QUEUES: usize = 100;
/// Jobs waiting in each.
const JOBS: usize = 50;
/// Workers (Sidekiq processes, BullMQ worker connections).
const WORKERS: usize = 20;
/// Samples a minute: one every 5 s.
const PER_MINUTE: usize = 12;

struct Server(Child, #[allow(dead_code)] tempfile::TempDir);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn start_server() -> Result<(Server, redis::Client), BoxError> {
    let dir = tempfile::tempdir()?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--dir"])
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let server = Server(child, dir);
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    let started = Instant::now();
    while client.get_multiplexed_async_connection().await.is_err() {
        if started.elapsed() > Duration::from_secs(10) {
            return Err("redis-server did not start".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok((server, client))
}

fn names() -> Vec<String> {
    (0..QUEUES).map(|i| format!("queue{i:03}")).collect()
}

/// Sidekiq's keys: each queue's list of jobs, and the processes' heartbeats (5 queues each).
async fn fill_sidekiq(con: &mut redis::aio::MultiplexedConnection) -> Result<(), BoxError> {
    let now = chrono::Utc::now().timestamp() as f64;
    let mut pipe = redis::pipe();
    for q in names() {
        for j in 0..JOBS {
            let job = serde_json::json!({"retry": true, "queue": q, "class": "HardJob",
                "args": [j], "jid": format!("{j:032x}"), "created_at": now, "enqueued_at": now});
            pipe.cmd("LPUSH")
                .arg(format!("queue:{q}"))
                .arg(job.to_string());
        }
        pipe.cmd("SADD").arg("queues").arg(&q);
    }
    for w in 0..WORKERS {
        let id = format!("host{w}:1:abcdef");
        let queues: Vec<String> = (0..5)
            .map(|k| format!("queue{:03}", (w * 5 + k) % QUEUES))
            .collect();
        let info = serde_json::json!({"hostname": format!("host{w}"), "queues": queues});
        pipe.cmd("SADD").arg("processes").arg(&id);
        pipe.cmd("HSET")
            .arg(&id)
            .arg("info")
            .arg(info.to_string())
            .arg("beat")
            .arg(now);
    }
    let () = pipe.query_async(con).await?;
    Ok(())
}

/// BullMQ's keys: each queue's wait list of ids and their hashes; the workers are clients
/// named as BullMQ names them (kept open by the caller).
async fn fill_bullmq(
    client: &redis::Client,
    con: &mut redis::aio::MultiplexedConnection,
) -> Result<Vec<redis::aio::MultiplexedConnection>, BoxError> {
    use base64::Engine as _;
    let now = chrono::Utc::now().timestamp_millis();
    let mut pipe = redis::pipe();
    for q in names() {
        for j in 0..JOBS {
            pipe.cmd("LPUSH").arg(format!("bull:{q}:wait")).arg(j);
            pipe.cmd("HSET")
                .arg(format!("bull:{q}:{j}"))
                .arg("name")
                .arg("HardJob")
                .arg("data")
                .arg("[1]")
                .arg("opts")
                .arg("{}")
                .arg("timestamp")
                .arg(now);
        }
    }
    let () = pipe.query_async(con).await?;
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let mut c = client.get_multiplexed_async_connection().await?;
        let q = format!("queue{:03}", w % QUEUES);
        let name = format!(
            "bull:{}",
            base64::engine::general_purpose::STANDARD.encode(q)
        );
        let () = redis::cmd("CLIENT")
            .arg("SETNAME")
            .arg(name)
            .query_async(&mut c)
            .await?;
        workers.push(c);
    }
    Ok(workers)
}

/// Median Redis usec per sample, Redis CPU seconds per minute, and the watch's median time per
/// sample, over `rounds` minutes of samples.
async fn measure(
    client: &redis::Client,
    layout: LayoutKind,
    namespace: &str,
    rounds: usize,
) -> Result<serde_json::Value, BoxError> {
    let mut con = connect(client, Duration::from_secs(5)).await?;
    let names = names();
    let (mut per_sample, mut per_minute, mut took) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let usec_before: f64 = command_usec(client)
            .await
            .unwrap_or_default()
            .values()
            .sum();
        let cpu_before = cpu_seconds(client).await.ok_or("INFO cpu")?;
        for _ in 0..PER_MINUTE {
            let t = Instant::now();
            let side = queues::look(&mut con, layout, namespace, &names).await?;
            took.push(t.elapsed().as_secs_f64() * 1e3);
            assert_eq!(side.queues.len(), QUEUES);
            assert!(side.queues.iter().all(|q| q.depth == JOBS as u64));
        }
        let cpu_after = cpu_seconds(client).await.ok_or("INFO cpu")?;
        let usec_after: f64 = command_usec(client)
            .await
            .unwrap_or_default()
            .values()
            .sum();
        per_sample.push((usec_after - usec_before) / PER_MINUTE as f64);
        per_minute.push((cpu_after - cpu_before) * 1e3);
    }
    Ok(serde_json::json!({
        "redis_command_usec_per_sample": median(&per_sample),
        "redis_cpu_ms_per_minute": median(&per_minute),
        "watch_ms_per_sample": median(&took),
    }))
}

async fn run() -> Result<serde_json::Value, BoxError> {
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(15);
    let (_sidekiq_server, sidekiq) = start_server().await?;
    fill_sidekiq(&mut sidekiq.get_multiplexed_async_connection().await?).await?;
    let (_bullmq_server, bullmq) = start_server().await?;
    let _workers = fill_bullmq(
        &bullmq,
        &mut bullmq.get_multiplexed_async_connection().await?,
    )
    .await?;
    Ok(serde_json::json!({
        "queues": QUEUES,
        "jobs_per_queue": JOBS,
        "workers": WORKERS,
        "samples_per_minute": PER_MINUTE,
        "minutes": rounds,
        "sidekiq": measure(&sidekiq, LayoutKind::Sidekiq, "", rounds).await?,
        "bullmq": measure(&bullmq, LayoutKind::Bullmq, "bull:", rounds).await?,
    }))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    if !support::cli::started_by_cargo_bench("redis_side") {
        return Ok(());
    }
    let report = run().await?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
