//! Where the machine's CPU time goes during a stage: the relay (the threads of its runtime,
//! named [`RELAY_THREAD`]), Redis, the Postgres server processes, and every core together.
//! Read from `/proc` and Redis's `INFO` (`benches/support/`); the Postgres figure is null when no `postgres`
//! process is visible here (a remote server). The bench's own producers and consumer are part
//! of "other".

use std::collections::HashMap;
use std::time::Instant;

use super::support::stats::round;
use super::support::{procfs, redis_info};

/// Thread name of the relay's runtime (at most 15 bytes: `/proc` truncates longer ones).
pub const RELAY_THREAD: &str = "jobrelay-relay";

/// CPU seconds used so far by each party, and by the whole machine.
pub struct CpuSnapshot {
    at: Instant,
    relay: f64,
    redis: Option<f64>,
    /// CPU seconds of each live `postgres` process, by pid: backends come and go during a
    /// stage, and one that exited must not take its earlier CPU out of the sum.
    postgres: Option<HashMap<u32, f64>>,
    /// Redis's `INFO commandstats`: microseconds spent so far in each command. Commands run by
    /// the enqueue script count twice: on their own line and inside `evalsha`.
    redis_commands: Option<HashMap<String, f64>>,
    machine_busy: f64,
}

impl CpuSnapshot {
    /// Reads the counters now.
    pub async fn take(redis: &redis::Client) -> Self {
        CpuSnapshot {
            at: Instant::now(),
            relay: procfs::threads_cpu_seconds(RELAY_THREAD),
            redis: redis_info::cpu_seconds(redis).await,
            postgres: procfs::postgres_cpu_seconds(),
            redis_commands: redis_info::command_usec(redis).await,
            machine_busy: procfs::machine_busy_seconds(),
        }
    }

    /// Microseconds of CPU per job for each party between `earlier` and `self`, the rest of
    /// the machine (the kernel's work for them, the benchmark's own checks), and how many
    /// cores were busy on average.
    pub fn per_job_since(&self, earlier: &CpuSnapshot, jobs: usize) -> serde_json::Value {
        let per_job = |s: f64| round(s * 1e6 / jobs.max(1) as f64, 2);
        let relay = self.relay - earlier.relay;
        let redis = self.redis.zip(earlier.redis).map(|(a, b)| a - b);
        // Backends that exited meanwhile are left out (their last seconds are unknown);
        // backends that started count whole.
        let postgres = self
            .postgres
            .as_ref()
            .zip(earlier.postgres.as_ref())
            .map(|(a, b)| {
                a.iter()
                    .map(|(pid, cpu)| cpu - b.get(pid).copied().unwrap_or(0.0))
                    .sum::<f64>()
            });
        let busy = self.machine_busy - earlier.machine_busy;
        let other = busy - relay - redis.unwrap_or(0.0) - postgres.unwrap_or(0.0);
        let wall = self.at.duration_since(earlier.at).as_secs_f64();
        // Microseconds per job in each Redis command that took at least 0.001 µs a job.
        let by_command: Option<serde_json::Map<String, serde_json::Value>> = self
            .redis_commands
            .as_ref()
            .zip(earlier.redis_commands.as_ref())
            .map(|(now, then)| {
                let mut rows: Vec<(&String, f64)> = now
                    .iter()
                    .map(|(cmd, usec)| (cmd, usec - then.get(cmd).copied().unwrap_or(0.0)))
                    .filter(|(_, usec)| *usec * 1000.0 >= jobs as f64)
                    .collect();
                rows.sort_by(|a, b| b.1.total_cmp(&a.1));
                rows.into_iter()
                    .map(|(cmd, usec)| (cmd.clone(), per_job(usec / 1e6).into()))
                    .collect()
            });
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        serde_json::json!({
            // What this CPU cost per job allows with every core busy.
            "ceiling_rows_per_second": round(cores * jobs as f64 / busy.max(1e-9), 0),
            "redis_command_us_per_job": by_command,
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
