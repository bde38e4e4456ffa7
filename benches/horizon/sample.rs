//! The horizon benchmark's figures: the workers' totals, the CPU of the database's backends,
//! and the line of each window.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::{json, Value};
use sqlx::PgPool;

use super::support::procfs;
use super::support::sandbox::Sandbox;
use super::support::stats::round;
use super::BoxError;

/// What the workers did, summed.
#[derive(Default)]
pub struct Totals {
    pub batches: AtomicU64,
    pub jobs: AtomicU64,
    pub claim_us: AtomicU64,
    pub batch_us: AtomicU64,
}

/// The counters at one instant.
#[derive(Clone, Copy)]
pub struct Sample {
    at: Instant,
    batches: u64,
    pub jobs: u64,
    claim_us: u64,
    batch_us: u64,
    pg_cpu: f64,
}

/// The run's counters: what the workers did, what the producers wrote, the CPU of this
/// database's backends.
#[derive(Default)]
pub struct Bench {
    pub totals: Arc<Totals>,
    pub produced: Arc<AtomicU64>,
    cpu_seen: Mutex<HashMap<u32, f64>>,
    cpu_gone: Mutex<f64>,
}

impl Bench {
    /// CPU seconds of this database's backends so far (backends that ended keep their last
    /// reading).
    async fn pg_cpu(&self, sb: &Sandbox) -> Result<f64, BoxError> {
        let pids: Vec<i32> =
            sqlx::query_scalar("SELECT pid FROM pg_stat_activity WHERE datname = $1")
                .bind(sb.db_name())
                .fetch_all(&sb.pool)
                .await?;
        let mut seen = self.cpu_seen.lock().unwrap();
        let mut gone = self.cpu_gone.lock().unwrap();
        let now: HashMap<u32, f64> = pids
            .iter()
            .filter_map(|&p| Some((p as u32, procfs::pid_cpu_seconds(p as u32)?)))
            .collect();
        for (pid, cpu) in seen.iter() {
            if !now.contains_key(pid) {
                *gone += cpu;
            }
        }
        *seen = now;
        Ok(*gone + seen.values().sum::<f64>())
    }

    /// The counters now.
    pub async fn sample(&self, sb: &Sandbox) -> Result<Sample, BoxError> {
        let t = &self.totals;
        Ok(Sample {
            at: Instant::now(),
            batches: t.batches.load(Ordering::Relaxed),
            jobs: t.jobs.load(Ordering::Relaxed),
            claim_us: t.claim_us.load(Ordering::Relaxed),
            batch_us: t.batch_us.load(Ordering::Relaxed),
            pg_cpu: self.pg_cpu(sb).await?,
        })
    }

    /// One window's line: from `a` to `b`.
    pub async fn window(
        &self,
        sb: &Sandbox,
        phase: &str,
        a: &Sample,
        b: &Sample,
    ) -> Result<Value, BoxError> {
        let (dead, size): (i64, i64) = sqlx::query_as(
            "SELECT n_dead_tup, pg_total_relation_size('pending_jobs')
             FROM pg_stat_user_tables WHERE relname = 'pending_jobs'",
        )
        .fetch_one(&sb.pool)
        .await?;
        let batches = (b.batches - a.batches).max(1) as f64;
        let jobs = b.jobs - a.jobs;
        let w = json!({
            "phase": phase,
            "seconds": round(b.at.duration_since(a.at).as_secs_f64(), 1),
            "batches": b.batches - a.batches,
            "jobs": jobs,
            "batch_mean_ms": round((b.batch_us - a.batch_us) as f64 / batches / 1000.0, 2),
            "claim_mean_ms": round((b.claim_us - a.claim_us) as f64 / batches / 1000.0, 2),
            "dead_tuples": dead,
            "table_mb": round(size as f64 / 1048576.0, 1),
            "pg_cpu_us_per_job": round((b.pg_cpu - a.pg_cpu) * 1e6 / (jobs.max(1) as f64), 1),
            "pg_cores": round((b.pg_cpu - a.pg_cpu) / b.at.duration_since(a.at).as_secs_f64(), 2),
            "backlog": self.produced.load(Ordering::Relaxed).saturating_sub(b.jobs),
        });
        eprintln!("{w}");
        Ok(w)
    }
}

/// Inserts `n` rows in one transaction.
pub async fn insert(pool: &PgPool, n: i64) -> Result<(), BoxError> {
    sqlx::query(
        "INSERT INTO pending_jobs (queue, job_type, payload)
         SELECT 'horizon', 'Tick', convert_to(repeat('x', 200), 'UTF8')
         FROM generate_series(1, $1)",
    )
    .bind(n)
    .execute(pool)
    .await?;
    Ok(())
}
