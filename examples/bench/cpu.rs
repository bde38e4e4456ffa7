//! Where the machine's CPU time goes during a stage: this process (the relay), Redis, the
//! Postgres server processes, and every core together. Read from `/proc` and Redis's
//! `INFO cpu`; the Postgres figure is null when no `postgres` process is visible here (a
//! remote server).

use std::time::Instant;

/// CPU seconds used so far by each party, and by the whole machine.
pub struct CpuSnapshot {
    at: Instant,
    relay: f64,
    redis: Option<f64>,
    postgres: Option<f64>,
    machine_busy: f64,
}

impl CpuSnapshot {
    /// Reads the counters now.
    pub async fn take(redis: &redis::Client) -> Self {
        CpuSnapshot {
            at: Instant::now(),
            relay: own_cpu_seconds(),
            redis: redis_cpu_seconds(redis).await,
            postgres: postgres_cpu_seconds(),
            machine_busy: machine_busy_seconds(),
        }
    }

    /// Microseconds of CPU per job for each party between `earlier` and `self`, the rest of
    /// the machine (the kernel's work for them, the benchmark's own checks), and how many
    /// cores were busy on average.
    pub fn per_job_since(&self, earlier: &CpuSnapshot, jobs: usize) -> serde_json::Value {
        let per_job = |s: f64| round(s * 1e6 / jobs.max(1) as f64, 2);
        let relay = self.relay - earlier.relay;
        let redis = self.redis.zip(earlier.redis).map(|(a, b)| a - b);
        let postgres = self.postgres.zip(earlier.postgres).map(|(a, b)| a - b);
        let busy = self.machine_busy - earlier.machine_busy;
        let other = busy - relay - redis.unwrap_or(0.0) - postgres.unwrap_or(0.0);
        let wall = self.at.duration_since(earlier.at).as_secs_f64();
        serde_json::json!({
            "cpu_us_per_job": {
                "relay": per_job(relay),
                "redis": redis.map(per_job),
                "postgres": postgres.map(per_job),
                "other": per_job(other.max(0.0)),
                "total": per_job(busy),
            },
            "busy_cores": round(busy / wall.max(1e-9), 2),
        })
    }
}

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

/// Clock ticks per second of `/proc` times (USER_HZ, 100 on Linux).
const TICKS: f64 = 100.0;

/// utime + stime of one `/proc/<pid>/stat` line, in seconds, with the process's name.
fn proc_stat_cpu(stat: &str) -> Option<(&str, f64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = &stat[open + 1..close];
    // After ')': state is field 3 of the line; utime and stime are fields 14 and 15.
    let f: Vec<&str> = stat[close + 1..].split_whitespace().collect();
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    Some((name, (utime + stime) / TICKS))
}

/// User + system CPU seconds of this process.
pub fn own_cpu_seconds() -> f64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| proc_stat_cpu(&s).map(|(_, c)| c))
        .unwrap_or(0.0)
}

/// CPU seconds of every live process named `postgres` (the server and its backends).
fn postgres_cpu_seconds() -> Option<f64> {
    let mut total = None;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        if let Some(("postgres", cpu)) = proc_stat_cpu(&stat) {
            *total.get_or_insert(0.0) += cpu;
        }
    }
    total
}

/// Busy (not idle, not waiting for I/O) seconds of all cores, from `/proc/stat`.
fn machine_busy_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(cpu) = stat.lines().next() else {
        return 0.0;
    };
    // cpu user nice system idle iowait irq softirq steal ...
    let v: Vec<f64> = cpu
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let busy: f64 = [0, 1, 2, 5, 6, 7].iter().filter_map(|&i| v.get(i)).sum();
    busy / TICKS
}

/// `used_cpu_user + used_cpu_sys` from Redis's `INFO cpu`.
async fn redis_cpu_seconds(client: &redis::Client) -> Option<f64> {
    let mut con = client.get_multiplexed_async_connection().await.ok()?;
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(&mut con)
        .await
        .ok()?;
    let field = |name: &str| -> Option<f64> {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':')?.trim().parse().ok())
    };
    Some(field("used_cpu_user")? + field("used_cpu_sys")?)
}
