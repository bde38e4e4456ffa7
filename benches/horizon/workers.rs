//! What runs during the horizon benchmark: the relay's workers (its own `Batcher`s sharing one
//! claim cursor, as one relay's workers do, into a sink without Redis) and the steady stream
//! of producers' rows.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use jobrelay::broker::enqueue::JobResult;
use jobrelay::config::STATEMENT_TIMEOUT;
use jobrelay::relay::cursor::ClaimCursor;
use jobrelay::relay::{self, BatchSettings, JobSink};
use jobrelay::{Job, Outcome, TableName};
use sqlx::PgPool;
use tokio::task::JoinHandle;

use super::sample::{insert, Bench};
use super::support::sandbox::Sandbox;
use super::BoxError;

/// Acknowledges every job at once: the benchmark measures Postgres.
struct Acknowledge;

impl JobSink for Acknowledge {
    async fn push(&self, jobs: &[Job]) -> jobrelay::Result<Vec<JobResult>> {
        Ok(jobs.iter().map(|_| Ok(Outcome::Queued)).collect())
    }
}

/// Tasks that run until [`Running::stop`].
pub struct Running {
    stop: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<Result<(), BoxError>>>,
}

impl Running {
    /// Tells the tasks to stop and waits for them; the first error of one.
    pub async fn stop(self) -> Result<(), BoxError> {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await??;
        }
        Ok(())
    }
}

/// `workers` workers on `relay_pool`, each polling every 20 ms when a batch was not full, and
/// adding what it did to `bench`'s totals.
pub fn start_workers(relay_pool: &PgPool, workers: usize, bench: &Bench) -> Running {
    let queries = Arc::new(relay::Queries::new(&TableName::default()));
    let settings = Arc::new(BatchSettings {
        statement_timeout: STATEMENT_TIMEOUT,
        ..BatchSettings::default()
    });
    let cursor = Arc::new(ClaimCursor::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let b = relay::Batcher::new(
            relay_pool.clone(),
            queries.clone(),
            settings.clone(),
            Acknowledge,
        )
        .with_cursor(cursor.clone());
        let (totals, stop) = (bench.totals.clone(), stop.clone());
        let batch_size = settings.batch_size as u64;
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let t0 = Instant::now();
                let r = b.run_once(None).await?;
                if r.claimed > 0 {
                    totals.batches.fetch_add(1, Ordering::Relaxed);
                    totals.jobs.fetch_add(r.claimed, Ordering::Relaxed);
                    totals
                        .claim_us
                        .fetch_add(r.stages.claim.as_micros() as u64, Ordering::Relaxed);
                    totals
                        .batch_us
                        .fetch_add(t0.elapsed().as_micros() as u64, Ordering::Relaxed);
                }
                if !r.more && r.claimed < batch_size {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            Ok::<_, BoxError>(())
        }));
    }
    Running { stop, tasks }
}

/// The steady stream: every 10 ms, one transaction with the rows due at `rate` rows a second.
pub fn start_stream(sb: &Sandbox, bench: &Bench, rate: u64) -> Running {
    let (pool, produced) = (sb.pool.clone(), bench.produced.clone());
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let task = tokio::spawn(async move {
        let t0 = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        while !s.load(Ordering::Relaxed) {
            tick.tick().await;
            let due = (t0.elapsed().as_secs_f64() * rate as f64) as u64;
            let n = due.saturating_sub(produced.load(Ordering::Relaxed));
            if n > 0 {
                insert(&pool, n as i64).await?;
                produced.fetch_add(n, Ordering::Relaxed);
            }
        }
        Ok::<_, BoxError>(())
    });
    Running {
        stop,
        tasks: vec![task],
    }
}
