//! A fleet drains keyed rows while producers commit them: 6 relays of 4 workers, 200,000 rows
//! over 1,000 keys from 8 concurrent producers. Every key's jobs are in its queue in `id`
//! order, each once: plainly, through a Redis outage, through kill -9 of two relays, and
//! through refusals (a queue key of another type for a moment, the relay's ACL user losing
//! its script commands for a moment).
//!
//! Each prints `FIGURES test=<name> rows=<n> keys=<n> seconds=<s> ...`.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::common::child::RelayChild;
use crate::common::redis_server::RedisServer;

const RELAYS: usize = 6;
const WORKERS: &str = "4";
const ROWS: usize = 200_000;
const KEYS: usize = 1_000;
const PRODUCERS: usize = 8;
const QUEUES: [&str; 4] = ["o0", "o1", "o2", "o3"];
/// How long the whole drain may take (a debug build, 2 shared cores).
const DEADLINE: Duration = Duration::from_secs(600);

/// What happens to the fleet in the middle of the drain.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    None,
    /// The Redis server stopped (SIGSTOP) for 3 s: pushes time out, may land late.
    RedisOutage,
    /// Two relays killed with -9, mid-batch.
    Kill9,
    /// Refusals while the fleet drains: every 100 ms for 10 ms, one queue key holds a string
    /// (its jobs are refused, per job, and back off), or the relays' ACL user loses EVALSHA
    /// (the whole call is refused).
    Refusals,
}

/// The relays' ACL user on the private server, and its password.
const USER: &str = "relay";
const PASSWORD: &str = "ordering-test";

async fn fleet(pool: PgPool, fault: Fault) {
    let mut server = RedisServer::start();
    let mut admin = server.async_con().await;
    let _: () = redis::cmd("ACL")
        .arg(
            &[
                "SETUSER",
                USER,
                "on",
                &format!(">{PASSWORD}"),
                "~*",
                "&*",
                "+@all",
            ][..],
        )
        .query_async(&mut admin)
        .await
        .unwrap();
    let relay_url = server
        .url()
        .replacen("redis://", &format!("redis://{USER}:{PASSWORD}@"), 1);
    let ns = Namespace::on_server(&server);
    let layout = TestLayout(LayoutKind::Jobrelay);
    let db = database_url_of(&pool).await;
    let logs = tempfile::tempdir().unwrap();
    let mut relays: Vec<RelayChild> = (0..RELAYS)
        .map(|i| {
            RelayChild::start_logged(
                &db,
                &relay_url,
                &ns.prefix,
                &["--workers", WORKERS, "--push-timeout", "1s"],
                &logs.path().join(format!("relay-{i}.log")),
                "info",
            )
        })
        .collect();

    let started = Instant::now();
    let producing = {
        let pool = pool.clone();
        tokio::spawn(async move { produce(&pool, ROWS, KEYS, PRODUCERS, &QUEUES).await })
    };
    // The fault strikes once a third of the rows went out.
    let mut con = server.async_con().await;
    wait_until("a third of the rows relayed", DEADLINE, || {
        let mut con = con.clone();
        let ns = &ns;
        async move { queued(&mut con, layout, ns, &QUEUES).await >= ROWS / 3 }
    })
    .await;
    let refusals = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut chaos = None;
    match fault {
        Fault::None => {}
        Fault::RedisOutage => {
            server.signal("STOP");
            hold_for(Duration::from_secs(3), "Redis stopped").await;
            server.signal("CONT");
        }
        Fault::Kill9 => {
            for relay in &relays[..2] {
                relay.signal("KILL");
            }
        }
        Fault::Refusals => {
            let queue_keys = QUEUES.map(|q| layout.queue_key(&ns, q)).to_vec();
            chaos = Some(tokio::spawn(refuse_now_and_then(
                admin.clone(),
                queue_keys,
                Arc::clone(&refusals),
                Arc::clone(&stop),
            )));
        }
    }
    let written = producing.await.unwrap();
    let produced_in = started.elapsed();
    // The refusals go on while the rest drains, then stop: the rows refused last go once
    // their backoff ends.
    if let Some(chaos) = chaos {
        wait_until("most rows relayed under refusals", DEADLINE, || {
            let mut con = con.clone();
            let ns = &ns;
            async move { queued(&mut con, layout, ns, &QUEUES).await >= ROWS * 9 / 10 }
        })
        .await;
        stop.store(true, Ordering::SeqCst);
        chaos.await.unwrap();
    }
    wait_drained(&pool, &mut con, layout, &ns, &QUEUES, ROWS, DEADLINE).await;
    let drained_in = started.elapsed();
    let (jobs, keys) = Ledger::new(&written)
        .check(&mut con, layout, &ns, &QUEUES)
        .await;
    assert_eq!((jobs, keys), (ROWS, KEYS));
    let dead: i64 = sqlx::query_scalar("SELECT count(*) FROM pending_jobs_dead")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(dead, 0, "no row may be dead-lettered here");
    let refused = refused_in_logs(logs.path());
    if fault == Fault::Refusals {
        assert!(
            refused > 0 && refusals.load(Ordering::SeqCst) > 0,
            "the refusals must have happened: {} toggles, {refused} jobs refused",
            refusals.load(Ordering::SeqCst)
        );
    }
    if fault == Fault::Kill9 {
        for relay in &mut relays[..2] {
            assert_eq!(
                relay.wait(Duration::from_secs(10)).await,
                None,
                "killed by -9"
            );
        }
    }
    println!(
        "FIGURES test=ordering_fleet fault={fault:?} relays={RELAYS} workers={WORKERS} rows={jobs} \
         keys={keys} producers={PRODUCERS} produced_s={:.1} drained_s={:.1} toggles={} \
         jobs_refused={refused} refused_pct={:.2}",
        produced_in.as_secs_f64(),
        drained_in.as_secs_f64(),
        refusals.load(Ordering::SeqCst),
        100.0 * refused as f64 / ROWS as f64,
    );
    drop(relays);
    server.kill();
}

/// Every 100 ms, for 10 ms: one queue key holds a string (the list set aside and put back,
/// atomically), or the relays' user loses EVALSHA. Counts the toggles.
async fn refuse_now_and_then(
    mut admin: redis::aio::MultiplexedConnection,
    queue_keys: Vec<String>,
    toggles: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
) {
    let block = redis::Script::new(
        "if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('RENAME', KEYS[1], KEYS[2]) end
         redis.call('SET', KEYS[1], 'not a list')",
    );
    let unblock = redis::Script::new(
        "redis.call('DEL', KEYS[1])
         if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('RENAME', KEYS[2], KEYS[1]) end",
    );
    let mut i = 0usize;
    while !stop.load(Ordering::SeqCst) {
        hold_for(Duration::from_millis(90), "between refusals").await;
        i += 1;
        if i % 2 == 0 {
            let queue = &queue_keys[i / 2 % queue_keys.len()];
            let aside = format!("{queue}:aside");
            let _: () = block
                .key(queue)
                .key(&aside)
                .invoke_async(&mut admin)
                .await
                .unwrap();
            hold_for(Duration::from_millis(10), "a queue key of another type").await;
            let _: () = unblock
                .key(queue)
                .key(&aside)
                .invoke_async(&mut admin)
                .await
                .unwrap();
        } else {
            let _: () = redis::cmd("ACL")
                .arg(&["SETUSER", USER, "-evalsha", "-eval"][..])
                .query_async(&mut admin)
                .await
                .unwrap();
            hold_for(
                Duration::from_millis(10),
                "the relays' user without EVALSHA",
            )
            .await;
            let _: () = redis::cmd("ACL")
                .arg(&["SETUSER", USER, "+evalsha", "+eval"][..])
                .query_async(&mut admin)
                .await
                .unwrap();
        }
        toggles.fetch_add(1, Ordering::SeqCst);
    }
}

/// The jobs Redis refused, summed from the relays' logs in `dir` (the `refused` field of each
/// "jobs refused by redis" line).
fn refused_in_logs(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap_or_default())
        .flat_map(|text| {
            text.lines()
                .filter(|l| l.contains("jobs refused by redis"))
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .map(|v| {
                    v.get("refused")
                        .or_else(|| v.get("fields").and_then(|f| f.get("refused")))
                        .and_then(serde_json::Value::as_u64)
                        .unwrap_or(0)
                })
                .collect::<Vec<_>>()
        })
        .sum()
}

#[sqlx::test]
async fn a_fleet_keeps_every_key_in_order(pool: PgPool) {
    fleet(pool, Fault::None).await;
}

#[sqlx::test]
async fn a_fleet_keeps_every_key_in_order_through_a_redis_outage(pool: PgPool) {
    fleet(pool, Fault::RedisOutage).await;
}

#[sqlx::test]
async fn a_fleet_keeps_every_key_in_order_through_kill_9(pool: PgPool) {
    fleet(pool, Fault::Kill9).await;
}

#[sqlx::test]
async fn a_fleet_keeps_every_key_in_order_through_refusals(pool: PgPool) {
    fleet(pool, Fault::Refusals).await;
}
