//! CPU time from `/proc`: threads of this process (by name), whole processes, the Postgres
//! server's processes and the machine.
//!
//! A task's (a thread's, or a single-threaded process's) CPU time is read from `schedstat`, in
//! nanoseconds, where the kernel has it, else from `stat`, in clock ticks: summing dozens of
//! short-lived Postgres backends, or an idle relay's tick or two in ten seconds, would otherwise
//! add up mostly truncation.

use std::collections::HashMap;
use std::path::Path;

/// Clock ticks per second of `/proc` times (USER_HZ, 100 on Linux).
pub const TICKS: f64 = 100.0;

/// The name and utime + stime (seconds) of one `/proc/<pid>/stat` line.
pub fn stat_cpu(stat: &str) -> Option<(&str, f64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = &stat[open + 1..close];
    // After ')': state is field 3 of the line; utime and stime are fields 14 and 15.
    let f: Vec<&str> = stat[close + 1..].split_whitespace().collect();
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    Some((name, (utime + stime) / TICKS))
}

/// The CPU seconds of the task whose `/proc` directory is `dir` (`/proc/<pid>` of a
/// single-threaded process, `/proc/<pid>/task/<tid>` of a thread) if its name is `name` (any
/// name when `None`): `schedstat`'s run time when the kernel has it, else `stat`'s ticks.
fn task(dir: &Path, name: Option<&str>) -> Option<f64> {
    let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
    let (found, ticks) = stat_cpu(&stat)?;
    if name.is_some_and(|n| n != found) {
        return None;
    }
    Some(
        std::fs::read_to_string(dir.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
            .map_or(ticks, |ns| ns / 1e9),
    )
}

/// CPU seconds of the single-threaded process `pid` (a Postgres backend).
pub fn pid_cpu_seconds(pid: u32) -> Option<f64> {
    task(Path::new(&format!("/proc/{pid}")), None)
}

/// CPU seconds of this process's living threads named `name`.
pub fn threads_cpu_seconds(name: &str) -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    tasks
        .flatten()
        .filter_map(|t| task(&t.path(), Some(name)))
        .sum()
}

/// CPU seconds of every live process named `postgres` (the server, its helpers and every
/// backend), by pid; `None` when there is none here (a remote server).
pub fn postgres_cpu_seconds() -> Option<HashMap<u32, f64>> {
    let mut found = None;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        // Postgres processes are single-threaded: the task is the process.
        if let Some(cpu) = task(&entry.path(), Some("postgres")) {
            found.get_or_insert_with(HashMap::new).insert(pid, cpu);
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
/// total (every thread, living or gone) and each living thread's run time.
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
                if let (Some(tid), Some(cpu)) = (tid, task(&entry.path(), None)) {
                    tasks.insert(tid, cpu);
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

/// The 1-minute load average of the host.
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}
