//! CPU counters at one instant: the machine's busy time, every Postgres process's and Redis's.

use std::collections::HashMap;
use std::time::Instant;

use super::support::{procfs, redis_info};

/// CPU counters at one instant.
pub struct Snapshot {
    pub at: Instant,
    pub busy: f64,
    postgres: Option<HashMap<u32, f64>>,
    pub redis: Option<f64>,
}

impl Snapshot {
    pub async fn take(redis: &redis::Client) -> Snapshot {
        Snapshot {
            redis: redis_info::cpu_seconds(redis).await,
            at: Instant::now(),
            busy: procfs::machine_busy_seconds(),
            postgres: procfs::postgres_cpu_seconds(),
        }
    }

    /// CPU seconds of the Postgres processes `pids` (all of them when `None`) since `earlier`;
    /// a process that started meanwhile counts whole, one that exited is left out.
    pub fn postgres_since(&self, earlier: &Snapshot, pids: Option<&[u32]>) -> Option<f64> {
        let (now, then) = (self.postgres.as_ref()?, earlier.postgres.as_ref()?);
        let delta = |pid: &u32| {
            now.get(pid)
                .map(|cpu| cpu - then.get(pid).copied().unwrap_or(0.0))
        };
        Some(match pids {
            Some(pids) => pids.iter().filter_map(delta).sum(),
            None => now.keys().filter_map(delta).sum(),
        })
    }
}
