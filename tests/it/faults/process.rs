//! Relay processes that die or stop: kill -9 during a drain (alone and in a fleet), SIGTERM
//! during a large drain, a shutdown timeout cutting off a hung batch, a frozen (SIGSTOP) relay.

use super::*;

per_layout!(kill_9_five_times_during_a_drain_loses_and_doubles_nothing);
async fn kill_9_five_times_during_a_drain_loses_and_doubles_nothing(
    pool: PgPool,
    layout: TestLayout,
) {
    const ROWS: i64 = 50_000;
    let redis = RedisServer::start();
    let ns = Namespace::on(&redis.url());
    let db = database_url_of(&pool).await;
    let inserted = insert_bulk(&pool, ROWS).await;
    let mut logs = Logs::new();
    let mut rng = rand::rng();

    // Five moments, one drawn at random in each fifth of the first 25,000 rows (half the table
    // is left as a margin: a busy host may let the relay run ahead of this test), then a random
    // few milliseconds more so that the kill lands anywhere in a batch's claim-push-commit.
    for k in 0..5 {
        let drained = rng.random_range(k * 5_000 + 500..(k + 1) * 5_000);
        let mut relay = logs.start(&db, &redis.url(), &ns, &layout.args());
        wait_drained_to(&pool, ROWS - drained).await;
        // Not waiting for work: a random delay so that the kill lands anywhere in a batch.
        let delay = Duration::from_millis(rng.random_range(0..80));
        hold_for(delay, "the kill lands anywhere in a batch").await;
        assert!(relay.running(), "relay {k} exited on its own");
        relay.child.kill9().await;
        let pending = pending_count(&pool).await;
        println!("kill {k}: after {drained}+ rows drained, {pending} pending");
        assert!(pending > 0, "kill {k} came after the drain ended");
    }
    let mut relay = logs.start(&db, &redis.url(), &ns, &layout.args());
    wait_drained_to(&pool, 0).await;
    let (code, _) = relay.terminate(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0));

    let in_redis = queue_uuids(&ns, layout, "default").await;
    let t = tally(&inserted, &in_redis, &HashSet::new());
    t.assert_exactly_once();
    assert_eq!(in_redis.len(), ROWS as usize);
    assert_eq!(dead_count(&pool).await, 0);
    // One marker per job (in the bullmq and rq layouts its job hash, and the marker sets) and the
    // queue: nothing else was written.
    let mut con = ns.con().await;
    let sets = marks::mark_sets(&mut con, &ns.prefix, layout.0).await.len() as i64;
    assert_eq!(
        dbsize(&ns).await,
        ROWS * layout.keys_per_job() + layout.keys_of_queues(1) + sets
    );
    let b = Batches::of(&log_lines(&logs.files()));
    assert_eq!(b.refused + b.invalid + b.dead_lettered, 0, "{b:?}");
    // A killed relay may have committed a batch without logging it, never the reverse.
    assert!(b.delivered() <= ROWS as u64, "{b:?}");
    let duplicates = b.duplicates;
    println!(
        "kill-9: duplicates by relay logs {} (rows of batches committed \
         but not logged before a kill: {}); {b:?}",
        b.duplicates,
        ROWS as u64 - b.delivered()
    );
    figures(
        &format!("kill_9_{}", layout.0),
        t.relayed,
        duplicates,
        t.lost.len(),
    );
}

#[sqlx::test]
async fn sigterm_during_a_large_drain_exits_0_and_loses_nothing(pool: PgPool) {
    const ROWS: i64 = 200_000;
    const SHUTDOWN: Duration = Duration::from_secs(10);
    let redis = RedisServer::start();
    let ns = Namespace::on(&redis.url());
    let db = database_url_of(&pool).await;
    let inserted = insert_bulk(&pool, ROWS).await;
    let mut logs = Logs::new();
    let args = ["--shutdown-timeout", "10s"];
    let mut relay = logs.start(&db, &redis.url(), &ns, &args);

    let drained = rand::rng().random_range(20_000..60_000);
    wait_drained_to(&pool, ROWS - drained).await;
    // Exit 0 means every batch in hand finished within --shutdown-timeout (the relay exits 1
    // when the timeout cuts one off); the test waits a little longer than that, no more.
    let (code, took) = relay.terminate(SHUTDOWN + Duration::from_secs(5)).await;
    assert_eq!(code, Some(0), "exit code after SIGTERM");
    println!("SIGTERM after {drained}+ rows: exit 0 in {took:?}");

    // Stopped mid-drain: what is not pending is in Redis, exactly once.
    let pending = pending_uuids(&pool).await;
    assert!(!pending.is_empty(), "the drain had ended before SIGTERM");
    let in_redis = list_uuids(&ns, "queue:default").await;
    let t = tally(&inserted, &in_redis, &pending);
    t.assert_exactly_once();
    assert_eq!(
        t.relayed + pending.len() - t.pending_and_pushed,
        ROWS as usize
    );
    println!(
        "after SIGTERM: {} pending, {} in redis, {} both",
        pending.len(),
        in_redis.len(),
        t.pending_and_pushed
    );
    let lines = log_lines(&logs.files());
    assert_eq!(count_message(&lines, "shutdown complete"), 1);

    // A new relay finishes the drain.
    let mut relay = logs.start(&db, &redis.url(), &ns, &args);
    wait_drained_to(&pool, 0).await;
    let (code, _) = relay.terminate(SHUTDOWN + Duration::from_secs(5)).await;
    assert_eq!(code, Some(0));
    let in_redis = list_uuids(&ns, "queue:default").await;
    let t = tally(&inserted, &in_redis, &HashSet::new());
    t.assert_exactly_once();
    assert_eq!(in_redis.len(), ROWS as usize);
    assert_eq!(dead_count(&pool).await, 0);
    let b = Batches::of(&log_lines(&logs.files()));
    assert_eq!(b.delivered(), ROWS as u64, "{b:?}");
    let duplicates = b.duplicates;
    println!("sigterm: duplicates by relay logs {}; {b:?}", b.duplicates);
    figures("sigterm", t.relayed, duplicates, t.lost.len());
}

/// A batch that cannot finish within --shutdown-timeout (Redis hangs) is cut off: exit 1, and
/// its rows are pending again, attempts untouched.
#[sqlx::test]
async fn shutdown_timeout_cuts_off_a_hung_batch_and_loses_nothing(pool: PgPool) {
    let redis = RedisServer::start();
    let proxy = Proxy::start(upstream(redis.port));
    let ns = Namespace::on(&redis.url());
    let db = database_url_of(&pool).await;
    let mut logs = Logs::new();
    let mut relay = logs.start(
        &db,
        &proxy.redis_url(),
        &ns,
        &["--push-timeout", "30s", "--shutdown-timeout", "1s"],
    );
    let files = logs.files();
    let files = &files;
    wait_until(
        "the relay connected to redis",
        Duration::from_secs(30),
        || async move { count_message(&log_lines(files), "redis connected") == 1 },
    )
    .await;
    proxy.stall();
    let inserted = insert_bulk(&pool, 5_000).await;
    let p = &pool;
    wait_until("a batch in hand", Duration::from_secs(30), || async move {
        relay_transactions(p).await.0 > 0
    })
    .await;
    let (code, took) = relay.terminate(Duration::from_secs(10)).await;
    assert_eq!(code, Some(1), "a cut-off batch exits 1");
    assert!(took < Duration::from_secs(5), "exit took {took:?}");
    println!("hung batch: exit 1 in {took:?}");
    assert_eq!(pending_uuids(&pool).await, inserted);
    assert_eq!(max_attempts_pending(&pool).await, 0);
    // The push never reached Redis (the proxy held it), and nothing else did.
    drop(proxy);
    assert_eq!(dbsize(&ns).await, 0);
}

/// A relay frozen mid-batch (SIGSTOP: its sockets stay open, so Postgres sees no disconnect)
/// holds its claimed rows only until `idle_in_transaction_session_timeout` (push timeout +
/// statement timeout, here 1 s + 15 s) ends its session; then another relay delivers them.
#[sqlx::test]
async fn a_frozen_relay_gives_its_rows_up_after_the_idle_transaction_timeout(pool: PgPool) {
    // Few enough that the other relay (a debug build, on a busy CI host) takes every other row
    // well within the frozen session's 16 s.
    const ROWS: i64 = 20_000;
    let redis = RedisServer::start();
    let ns = Namespace::on(&redis.url());
    let db = database_url_of(&pool).await;
    let inserted = insert_bulk(&pool, ROWS).await;
    let mut logs = Logs::new();
    // Three claim slots: the frozen relay's two workers can hold two, so the other relay keeps
    // one (a relay holds at most as many slots as it has workers; see the README, Deploying).
    let args = ["--push-timeout", "1s", "--claim-slots", "3"];
    let mut frozen = logs.start(&db, &redis.url(), &ns, &args);

    // Freeze it while one of its batches is between claim and commit.
    let every = Duration::from_millis(5);
    let caught = eventually_every(Duration::from_secs(60), every, || async {
        assert!(pending_count(&pool).await > 0, "drained before the freeze");
        if relay_transactions(&pool).await.0 == 0 {
            return false;
        }
        frozen.child.signal("STOP");
        // Not waiting for work: lets the stop take hold before the look below (a miss
        // resumes the relay and tries again, within the deadline).
        let why = "the stop takes hold before the look";
        hold_for(Duration::from_millis(100), why).await;
        // Frozen with a transaction open *and* rows claimed in it (not, say, between
        // BEGIN and its claim, or in a one-statement poll that the server finished).
        let unlocked: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM (SELECT 1 FROM pending_jobs FOR UPDATE SKIP LOCKED) t",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        if relay_transactions(&pool).await.0 > 0 && unlocked < pending_count(&pool).await {
            return true;
        }
        frozen.child.signal("CONT");
        false
    })
    .await;
    assert!(caught, "never caught a batch in hand");
    let froze = Instant::now();
    let mut other = logs.start(&db, &redis.url(), &ns, &args);
    // The other relay takes every row but the locked ones (SKIP LOCKED): none is claimable, and
    // the count holds still (no batch of the other relay in flight) ...
    let last = std::cell::Cell::new(None);
    let still = || async {
        let unlocked: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM (SELECT 1 FROM pending_jobs FOR UPDATE SKIP LOCKED) t",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        let pending = pending_count(&pool).await;
        if unlocked == 0 && last.get() == Some(pending) {
            return Some(pending);
        }
        last.set((unlocked == 0).then_some(pending));
        None
    };
    let deadline = drain_deadline(ROWS as u64);
    let locked = poll(deadline, Duration::from_millis(200), still)
        .await
        .expect("the other relay stalled");
    // The default workers, each with at most one default-sized batch.
    let most = (jobrelay::config::DEFAULT_WORKERS * jobrelay::config::DEFAULT_BATCH_SIZE) as i64;
    assert!(
        (1..=most).contains(&locked),
        "{locked} rows held by the frozen relay, {:?} after the freeze (the frozen session \
         ends after 16 s)",
        froze.elapsed()
    );
    // ... which come free when Postgres ends the frozen session, not before.
    wait_drained_to(&pool, 0).await;
    let held = froze.elapsed();
    println!("a frozen relay held {locked} rows for {held:?}");
    assert!(held > Duration::from_secs(10), "freed after only {held:?}");
    frozen.child.kill9().await;
    let (code, _) = other.terminate(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0));
    let in_redis = list_uuids(&ns, "queue:default").await;
    tally(&inserted, &in_redis, &HashSet::new()).assert_exactly_once();
    assert_eq!(in_redis.len(), ROWS as usize);
    assert_eq!(dead_count(&pool).await, 0);
}

/// Which of `pids` owns the local TCP port `port` (a Postgres session's `client_port`), from
/// `/proc/<pid>/fd` (socket inodes) and `/proc/net/tcp{,6}` (local port -> inode).
fn owner_of_port(pids: &[i32], port: i32) -> Option<i32> {
    let mut inode = None;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        for line in std::fs::read_to_string(table)
            .unwrap_or_default()
            .lines()
            .skip(1)
        {
            let f: Vec<&str> = line.split_whitespace().collect();
            let local_port = f.get(1).and_then(|a| a.rsplit(':').next());
            if local_port.and_then(|p| i32::from_str_radix(p, 16).ok()) == Some(port) {
                inode = f.get(9).map(|s| s.to_string());
            }
        }
    }
    let wanted = format!("socket:[{}]", inode?);
    pids.iter().copied().find(|pid| {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy() == wanted))
    })
}

per_layout!(kill_9_of_a_relay_in_a_fleet_loses_nothing);
/// A fleet of three relays (two workers each, two claim slots): kill -9 of a relay that holds
/// a batch in the middle of a drain loses nothing and doubles nothing, and its rows are taken
/// over by the others well within the idle-in-transaction timeout (`--push-timeout` + 15 s).
async fn kill_9_of_a_relay_in_a_fleet_loses_nothing(pool: PgPool, layout: TestLayout) {
    const ROWS: i64 = 30_000;
    let redis = RedisServer::start();
    let ns = Namespace::on(&redis.url());
    let db = database_url_of(&pool).await;
    let inserted = insert_bulk(&pool, ROWS).await;
    let mut logs = Logs::new();
    let mut relays: Vec<Relay> = (0..3)
        .map(|_| {
            let [flag, name] = layout.args();
            logs.start(&db, &redis.url(), &ns, &["--batch-size", "500", flag, name])
        })
        .collect();
    let pids: Vec<i32> = relays.iter().map(|r| r.child.pid()).collect();
    // A relay with a batch in hand: the owner of a session inside a claim transaction.
    let (p, pids_ref) = (&pool, &pids);
    let victim = std::sync::Mutex::new(None);
    let v = &victim;
    wait_until(
        "a relay holding a batch",
        Duration::from_secs(60),
        || async move {
            let ports: Vec<i32> = sqlx::query_scalar(
                "SELECT client_port FROM pg_stat_activity
                 WHERE datname = current_database() AND application_name = 'jobrelay'
                   AND xact_start IS NOT NULL AND pid <> pg_backend_pid()",
            )
            .fetch_all(p)
            .await
            .unwrap();
            let found = ports
                .into_iter()
                .find_map(|port| owner_of_port(pids_ref, port));
            *v.lock().unwrap() = found;
            found.is_some() && pending_count(p).await < ROWS
        },
    )
    .await;
    let victim = victim.into_inner().unwrap().expect("found above");
    let i = pids.iter().position(|&p| p == victim).unwrap();
    relays[i].child.kill9().await;
    let killed = Instant::now();
    let left = pending_count(&pool).await;
    println!("killed relay {i} (pid {victim}) holding a batch; {left} rows pending");
    assert!(left > 0, "the kill came after the drain ended");
    wait_pending_at_most(&pool, 0, Duration::from_secs(120)).await;
    let took = killed.elapsed();
    println!("the rest drained {took:?} after the kill");
    for (j, r) in relays.iter_mut().enumerate().filter(|(j, _)| *j != i) {
        assert_eq!(
            r.terminate(Duration::from_secs(30)).await.0,
            Some(0),
            "relay {j}"
        );
    }
    let in_redis = queue_uuids(&ns, layout, "default").await;
    let t = tally(&inserted, &in_redis, &HashSet::new());
    t.assert_exactly_once();
    assert_eq!(in_redis.len() as i64, ROWS);
    assert_eq!(dead_count(&pool).await, 0);
    // The killed relay's sessions end with its sockets, so its slot and rows are free at once;
    // the bound is the idle-in-transaction timeout for a relay that vanished without closing.
    assert!(took < Duration::from_secs(20), "took {took:?}");
    figures(
        &format!("fleet_kill_9_{}", layout.0),
        t.relayed,
        Batches::of(&log_lines(&logs.files())).duplicates,
        t.lost.len(),
    );
}
