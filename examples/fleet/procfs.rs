//! CPU time from `/proc`, for the fleet benchmark: the Postgres server processes (by pid, in
//! nanoseconds from `schedstat`, so that summing dozens of short-lived backends does not add up
//! their clock-tick truncations), whole processes (the relays, from `stat`, or from their
//! threads' `schedstat` for the idle fleet), and the machine.
//! The `stat` line is read by `examples/support/proc_stat.rs`, shared with the bench.

use std::collections::HashMap;

// Also loaded by the other benchmark example when both are compiled into the tests.
#[allow(clippy::duplicate_mod)]
#[path = "../support/proc_stat.rs"]
mod proc_stat;

use proc_stat::{stat_cpu, TICKS};

/// CPU seconds of a single-threaded process: `schedstat`'s run time (ns) when the kernel has
/// it, else `stat`'s ticks.
fn task_cpu(pid: u32, stat_seconds: f64) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(stat_seconds, |ns| ns / 1e9)
}

/// CPU seconds of every live process named `postgres` (the server, its helpers and every
/// backend), by pid; `None` when there is none here (a remote server).
pub fn postgres_cpu_seconds() -> Option<HashMap<u32, f64>> {
    let mut found = None;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        if let Some(("postgres", cpu)) = stat_cpu(&stat) {
            // Postgres processes are single-threaded: the task's schedstat is the process's.
            found
                .get_or_insert_with(HashMap::new)
                .insert(pid, task_cpu(pid, cpu));
        }
    }
    found
}

/// utime + stime of a whole process (every thread, living or gone), in seconds.
pub fn process_cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat_cpu(&stat).map(|(_, cpu)| cpu)
}

/// The CPU time of one (multi-threaded) process at one instant, two ways: `stat`'s whole-tick
/// total (every thread, living or gone) and each living thread's `schedstat` run time (ns).
/// An idle relay uses a tick or two in ten seconds, so ticks alone would be mostly truncation.
pub struct ProcessCpu {
    stat: Option<f64>,
    tasks: Option<HashMap<u32, f64>>,
}

/// [`ProcessCpu`] of `pid` now.
pub fn process_cpu(pid: u32) -> ProcessCpu {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()
        .and_then(|dir| {
            let mut tasks = HashMap::new();
            for entry in dir.flatten() {
                // A thread that ended meanwhile is left out.
                let tid = entry.file_name().to_str().and_then(|n| n.parse().ok());
                let ns = std::fs::read_to_string(entry.path().join("schedstat"))
                    .ok()
                    .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok());
                if let (Some(tid), Some(ns)) = (tid, ns) {
                    tasks.insert(tid, ns / 1e9);
                }
            }
            (!tasks.is_empty()).then_some(tasks)
        });
    ProcessCpu {
        stat: process_cpu_seconds(pid),
        tasks,
    }
}

impl ProcessCpu {
    /// CPU seconds since `earlier`: from the threads' run times when no thread ended meanwhile
    /// (a thread that started counts whole), else from the ticks.
    pub fn since(&self, earlier: &ProcessCpu) -> Option<f64> {
        if let (Some(now), Some(then)) = (&self.tasks, &earlier.tasks) {
            if then.keys().all(|tid| now.contains_key(tid)) {
                return Some(
                    now.iter()
                        .map(|(tid, cpu)| cpu - then.get(tid).copied().unwrap_or(0.0))
                        .sum(),
                );
            }
        }
        Some(self.stat? - earlier.stat?)
    }
}

/// Busy (not idle, not waiting for I/O) seconds of all cores, from `/proc/stat`.
pub fn machine_busy_seconds() -> f64 {
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
pub async fn redis_cpu_seconds(client: &redis::Client) -> Option<f64> {
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
