//! `latency`: a producer commits `BENCH_RATE` jobs/s, one row per transaction, while the relay
//! runs and a consumer pops; per job, the time from its commit to its pop, and where it went.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use super::support::sandbox::Sandbox;
use super::support::stats::{percentile, round};
use super::{consumer, cpu, relay, rows, timed_sink, Args, BoxError};

/// Runs the stage: `BENCH_RATE` x `BENCH_SECONDS` jobs.
pub async fn bench_latency(sb: &Sandbox, args: &Args) -> Result<serde_json::Value, BoxError> {
    // A steady stream into the table the drains before left: hundreds of thousands of dead
    // tuples, not vacuumed (a production state: autovacuum comes when it comes).
    let total = (args.rate as f64 * args.seconds) as usize;
    let pushes: timed_sink::PushTimes = Arc::new(Mutex::new(HashMap::with_capacity(total)));
    let relay = relay::start_relay(sb, args, Some(pushes.clone())).await?;
    let cpu0 = cpu::CpuSnapshot::take(sb.redis()).await;
    let committed: Arc<Mutex<HashMap<uuid::Uuid, Instant>>> =
        Arc::new(Mutex::new(HashMap::with_capacity(total)));
    let popped: consumer::Popped = Arc::new(Mutex::new(HashMap::with_capacity(total)));

    // The consumer (`consumer.rs`): a thread of its own that notes when each job was popped.
    let consumer = consumer::spawn(sb, args.layout, total, popped.clone())?;

    // With `BENCH_ORDERING_KEYS`, each row is the one row of its key (its uuid): what a key
    // adds to the way of a job no other job of its key waits for or holds.
    let key = if args.ordering_keys > 0 {
        "$1::text"
    } else {
        "NULL"
    };
    let insert = format!(
        "INSERT INTO pending_jobs (uuid, queue, job_type, payload, ordering_key) \
         VALUES ($1, 'latency', 'Ping', {}, {key})",
        rows::tiny_payload(args.layout, "'\\x00'")
    );
    // Producers: job i is due at t0 + i / rate. Each commit waits for its WAL flush, so it
    // takes several connections (whose commits share flushes) to keep the schedule.
    let producers = 16usize;
    let t0 = Instant::now();
    let interval = Duration::from_secs_f64(1.0 / args.rate as f64);
    let mut handles = Vec::new();
    for p in 0..producers {
        let mut conn = sb.pool.acquire().await?.detach();
        let committed = committed.clone();
        let insert = insert.clone();
        handles.push(tokio::spawn(async move {
            let mut i = p;
            while i < total {
                let due = t0 + interval * i as u32;
                tokio::time::sleep_until(due.into()).await;
                let uuid = uuid::Uuid::new_v4();
                sqlx::query(&insert)
                    .bind(uuid)
                    .execute(&mut conn)
                    .await
                    .expect("insert");
                committed.lock().unwrap().insert(uuid, Instant::now());
                i += producers;
            }
        }));
    }
    for h in handles {
        h.await?;
    }
    let produce_secs = t0.elapsed().as_secs_f64();
    let cpu = cpu::CpuSnapshot::take(sb.redis())
        .await
        .per_job_since(&cpu0, total);
    tokio::time::timeout(
        Duration::from_secs(60),
        tokio::task::spawn_blocking(move || consumer.join()),
    )
    .await??
    .map_err(|_| "the consumer thread panicked")?;
    relay.stop().await;

    let committed = committed.lock().unwrap();
    let popped = popped.lock().unwrap();
    let pushes = pushes.lock().unwrap();
    let mut lat: Vec<f64> = committed
        .iter()
        .map(|(u, c)| {
            let p = popped.get(u).expect("every job popped");
            // The relay can push a row before its producer has even seen COMMIT return.
            p.saturating_duration_since(*c).as_secs_f64() * 1000.0
        })
        .collect();
    lat.sort_by(f64::total_cmp);
    let q = |p: f64| percentile(&lat, p);
    Ok(json!({
        "table_state": "dead tuples of the stages before, not vacuumed",
        "jobs": lat.len(),
        "target_rate": args.rate,
        "achieved_rate": round(lat.len() as f64 / produce_secs, 0),
        "p50_ms": round(q(0.50), 3),
        "p99_ms": round(q(0.99), 3),
        "max_ms": round(*lat.last().unwrap_or(&0.0), 3),
        "all_jobs": split_latency(&committed, &pushes, &popped, 0.0),
        "slowest_1_percent": split_latency(&committed, &pushes, &popped, q(0.99)),
        "cpu": cpu,
    }))
}

/// Where the time of the jobs whose latency is at least `from_ms` went, on average: waiting
/// to be claimed (commit returned until the relay's push began), the push to Redis, and
/// until the consumer popped the job; with how many relay batches and 100 ms windows of
/// commit time those jobs fall in (few: one stall; many: spread out).
fn split_latency(
    committed: &HashMap<uuid::Uuid, Instant>,
    pushes: &HashMap<uuid::Uuid, (Instant, Instant)>,
    popped: &HashMap<uuid::Uuid, Instant>,
    from_ms: f64,
) -> serde_json::Value {
    let Some(origin) = committed.values().min().copied() else {
        return json!(null);
    };
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let (mut n, mut wait, mut push, mut pop) = (0usize, 0.0, 0.0, 0.0);
    let mut batches = std::collections::HashSet::new();
    let mut windows = std::collections::HashSet::new();
    for (uuid, &c) in committed {
        let (Some(&(ps, pe)), Some(&p)) = (pushes.get(uuid), popped.get(uuid)) else {
            continue;
        };
        if ms(p.saturating_duration_since(c)) < from_ms {
            continue;
        }
        n += 1;
        // A push can begin before the producer has seen its COMMIT return.
        wait += ms(ps.saturating_duration_since(c));
        push += ms(pe.saturating_duration_since(ps.max(c)));
        pop += ms(p.saturating_duration_since(pe.max(c)));
        batches.insert(ps);
        windows.insert(c.duration_since(origin).as_millis() / 100);
    }
    let mean = |x: f64| round(x / n.max(1) as f64, 3);
    json!({
        "jobs": n,
        "mean_wait_for_claim_ms": mean(wait),
        "mean_push_ms": mean(push),
        "mean_until_popped_ms": mean(pop),
        "batches": batches.len(),
        "windows_of_100ms": windows.len(),
    })
}
