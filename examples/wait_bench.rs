//! The cost of `--redis-wait-replicas 1`: pushes through the relay's sink (`RedisSink`) into a
//! private primary with one replica, with and without `WAIT 1` after the push, alternating
//! (ABBA order per round, so a drift in machine load hits both alike), for batches of 1 job
//! and of 1,000 jobs (200-byte payloads). Prints the median time of one push of each kind and
//! the jobs per second it makes, as one JSON object.
//!
//! ```text
//! cargo run --release --example wait_bench
//! ```
//!
//! It starts its own `redis-server` pair (primary and `--replicaof` replica, no persistence)
//! on free ports in a temporary directory and kills them at the end, also on SIGINT or SIGTERM.
//! `BENCH_ROUNDS` (default 40) sets the rounds; each round pushes every kind twice.

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jobrelay::redis::connection::connect;
use jobrelay::redis::probe::RedisSafety;
use jobrelay::redis::sink::RedisSink;
use jobrelay::relay::JobSink;
use jobrelay::{Enqueuer, Job};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The two servers; killed on drop and by the signal handler.
#[derive(Clone, Default)]
struct Servers(Arc<Mutex<Vec<Child>>>);

impl Servers {
    fn start(&self, port: u16, dir: &std::path::Path, extra: &[String]) -> Result<(), BoxError> {
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(dir)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        self.0.lock().unwrap().push(child);
        Ok(())
    }

    fn kill(&self) {
        for mut c in self.0.lock().unwrap().drain(..) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        if Arc::strong_count(&self.0) == 1 {
            self.kill();
        }
    }
}

fn free_port() -> Result<u16, BoxError> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

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
        })
        .collect()
}

async fn info(client: &redis::Client, section: &str) -> Result<String, BoxError> {
    let mut con = client.get_multiplexed_async_connection().await?;
    Ok(redis::cmd("INFO")
        .arg(section)
        .query_async(&mut con)
        .await?)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    let dir = tempfile::tempdir()?;
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
    let (p, r) = (free_port()?, free_port()?);
    let (pdir, rdir) = (dir.path().join("p"), dir.path().join("r"));
    std::fs::create_dir_all(&pdir)?;
    std::fs::create_dir_all(&rdir)?;
    servers.start(p, &pdir, &[])?;
    servers.start(
        r,
        &rdir,
        &["--replicaof".into(), "127.0.0.1".into(), p.to_string()],
    )?;
    let primary = redis::Client::open(format!("redis://127.0.0.1:{p}"))?;
    let replica = redis::Client::open(format!("redis://127.0.0.1:{r}"))?;
    let started = Instant::now();
    loop {
        let ok = match (
            info(&primary, "replication").await,
            info(&replica, "replication").await,
        ) {
            (Ok(a), Ok(b)) => {
                a.contains("connected_slaves:1") && b.contains("master_link_status:up")
            }
            _ => false,
        };
        if ok {
            break;
        }
        if started.elapsed() > Duration::from_secs(20) {
            return Err("the replica did not sync within 20 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let timeout = Duration::from_secs(5);
    let enqueuer = Enqueuer::new("bench:", Duration::from_secs(900));
    let plain = RedisSink::new(enqueuer.clone(), connect(&primary, timeout).await?, timeout)
        .with_safety(RedisSafety::default());
    let waiting = RedisSink::new(enqueuer, connect(&primary, timeout).await?, timeout).with_safety(
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
    servers.kill();

    let mut out = serde_json::Map::new();
    out.insert("rounds".into(), rounds.into());
    for (s, &size) in sizes.iter().enumerate() {
        for (w, name) in ["without_wait", "with_wait_1"].iter().enumerate() {
            let m = median(times[s][w].clone());
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
    println!("{}", serde_json::Value::Object(out));
    Ok(())
}
