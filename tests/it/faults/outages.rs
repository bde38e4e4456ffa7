//! Redis and Postgres outages: a killed and restarted Redis, a stalled Redis, Postgres sessions
//! cut mid-batch, READONLY/MASTERDOWN replies, reconnects after an outage, outages logged once
//! and retried at a bounded rate, an OOM Redis outlasting the dedup TTL.

use super::*;

per_layout!(redis_killed_mid_drain_and_restarted_everything_arrives_once);
async fn redis_killed_mid_drain_and_restarted_everything_arrives_once(
    pool: PgPool,
    layout: TestLayout,
) {
    const ROWS: i64 = 50_000;
    // appendfsync always: every write Redis acknowledged is on disk before the reply, so what
    // the relay saw acknowledged survives kill -9, and "every uuid exactly once" is checkable.
    let mut redis = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let ns = Namespace::on(&redis.url());
    let db = database_url_of(&pool).await;
    let inserted = insert_bulk(&pool, ROWS).await;
    let mut logs = Logs::new();
    let [flag, name] = layout.args();
    let mut relay = logs.start(
        &db,
        &redis.url(),
        &ns,
        &["--push-timeout", "2s", flag, name],
    );

    wait_drained_to(&pool, ROWS - 10_000).await;
    redis.kill();
    let killed = Instant::now();
    // The batch in flight settles within --push-timeout (2 s): it rolls back, or commits the
    // script calls Redis acknowledged before it died and keeps the rest. Not waiting for work:
    // 3 s of the 5 s outage; the count sampled then must hold until Redis returns (below).
    hold_for(
        Duration::from_secs(3),
        "the outage lasts; the batch in flight settles",
    )
    .await;
    let pending_early = pending_count(&pool).await;
    assert!(pending_early > 0);
    // Redis stays down 5 s: nothing more may be deleted, and no row may count an attempt.
    while killed.elapsed() < Duration::from_secs(5) {
        assert_eq!(
            max_attempts_pending(&pool).await,
            0,
            "an outage counted an attempt"
        );
        assert_eq!(dead_count(&pool).await, 0);
        hold_for(
            Duration::from_millis(100),
            "between looks during the outage",
        )
        .await;
    }
    assert_eq!(
        pending_count(&pool).await,
        pending_early,
        "rows deleted while Redis was down"
    );
    assert!(relay.running());
    redis.restart();

    wait_drained_to(&pool, 0).await;
    let (code, _) = relay.terminate(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0));

    let in_redis = queue_uuids(&ns, layout, "default").await;
    let t = tally(&inserted, &in_redis, &HashSet::new());
    t.assert_exactly_once();
    assert_eq!(in_redis.len(), ROWS as usize);
    assert_eq!(dead_count(&pool).await, 0);
    let lines = log_lines(&logs.files());
    let b = Batches::of(&lines);
    // The relay was never killed: its log accounts for every row.
    assert_eq!(b.delivered(), ROWS as u64, "{b:?}");
    assert_eq!(b.refused + b.dead_lettered, 0, "{b:?}");
    // The outage is logged once, and so is the recovery.
    print_health(&lines);
    assert_eq!(
        count_message(&lines, "redis unavailable; retrying with backoff"),
        1
    );
    assert_eq!(count_message(&lines, "redis recovered"), 1);
    // Redis restarted, so its command counters did too: the relay's log (complete, since the
    // relay ran throughout) gives the duplicates.
    println!(
        "redis-restart: duplicates by relay logs {}; {b:?}",
        b.duplicates
    );
    figures(
        &format!("redis_restart_{}", layout.0),
        t.relayed,
        b.duplicates,
        t.lost.len(),
    );
}

#[sqlx::test]
async fn stalled_redis_times_out_rolls_back_and_resumes(pool: PgPool) {
    const ROWS: i64 = 30_000;
    let redis = RedisServer::start();
    let proxy = Proxy::start(upstream(redis.port));
    let ns = Namespace::on(&redis.url());
    let db = database_url_of(&pool).await;
    let inserted = insert_bulk(&pool, ROWS).await;
    let mut logs = Logs::new();
    let mut relay = logs.start(&db, &proxy.redis_url(), &ns, &["--push-timeout", "1s"]);

    wait_drained_to(&pool, ROWS - 5_000).await;
    let accepted_before = proxy.accepted();
    proxy.stall();
    let stalled = Instant::now();
    let mut longest_tx = 0f64;
    let mut pending_settled = None;
    while stalled.elapsed() < Duration::from_secs(10) {
        let (_, age) = relay_transactions(&pool).await;
        longest_tx = longest_tx.max(age);
        assert_eq!(
            max_attempts_pending(&pool).await,
            0,
            "a stall counted an attempt"
        );
        assert_eq!(dead_count(&pool).await, 0);
        // By now the batch in flight when the stall began has timed out (1 s) and rolled back.
        if pending_settled.is_none() && stalled.elapsed() > Duration::from_millis(2500) {
            pending_settled = Some(pending_count(&pool).await);
        }
        hold_for(Duration::from_millis(50), "between looks during the stall").await;
    }
    let pending_stalled = pending_count(&pool).await;
    assert_eq!(
        Some(pending_stalled),
        pending_settled,
        "rows deleted while Redis hung"
    );
    assert!(pending_stalled > 0);
    // --push-timeout 1s bounds how long a hung Redis holds the rows' locks; without it the
    // transaction would stay open for the whole 10 s stall.
    assert!(
        longest_tx < 5.0,
        "a transaction stayed open {longest_tx:.1}s during the stall"
    );
    let new_connections = proxy.accepted() - accepted_before;
    assert!(
        new_connections <= 10,
        "{new_connections} connections opened during the stall"
    );
    println!(
        "stall: longest relay transaction {longest_tx:.2}s, {new_connections} new connections"
    );
    proxy.heal();

    wait_drained_to(&pool, 0).await;
    assert!(relay.running());
    let (code, _) = relay.terminate(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0));

    let in_redis = list_uuids(&ns, "queue:default").await;
    let t = tally(&inserted, &in_redis, &HashSet::new());
    t.assert_exactly_once();
    assert_eq!(dead_count(&pool).await, 0);
    let lines = log_lines(&logs.files());
    let b = Batches::of(&lines);
    assert_eq!(b.delivered(), ROWS as u64, "{b:?}");
    assert_eq!(
        count_message(&lines, "redis unavailable; retrying with backoff"),
        1
    );
    assert_eq!(count_message(&lines, "redis recovered"), 1);
    let duplicates = b.duplicates;
    println!("stall: duplicates by relay logs {}; {b:?}", b.duplicates);
    figures("redis_stall", t.relayed, duplicates, t.lost.len());
}

#[sqlx::test]
async fn postgres_sessions_cut_mid_batch_lose_nothing(pool: PgPool) {
    const ROWS: i64 = 50_000;
    let redis = RedisServer::start();
    let ns = Namespace::on(&redis.url());
    let db = database_url_of(&pool).await;
    let inserted = insert_bulk(&pool, ROWS).await;
    let mut logs = Logs::new();
    let mut relay = logs.start(&db, &redis.url(), &ns, &[]);
    let mut rng = rand::rng();

    // Twelve cuts, each of every relay session that is inside a transaction (a batch between
    // its claim and its commit) the moment one is seen; every third cut takes all of the
    // relay's sessions (the notification listener and idle ones too).
    let (mut cuts, mut in_tx) = (0, 0i64);
    let started = Instant::now();
    while cuts < 12 && pending_count(&pool).await > 0 {
        let all = cuts % 3 == 2;
        // A cut the moment a session is seen; none (0) once the rows are drained.
        let cut = || async {
            let n: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM (
                     SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                     WHERE datname = current_database() AND application_name = 'jobrelay'
                       AND pid <> pg_backend_pid() AND ($1 OR xact_start IS NOT NULL)) t",
            )
            .bind(all)
            .fetch_one(&pool)
            .await
            .unwrap();
            (n > 0 || pending_count(&pool).await == 0).then_some(n)
        };
        let left = drain_deadline(ROWS as u64).saturating_sub(started.elapsed());
        let n = poll(left, Duration::from_millis(5), cut)
            .await
            .expect("too slow");
        if n == 0 {
            break;
        }
        if !all {
            in_tx += n;
        }
        cuts += 1;
        assert_eq!(
            max_attempts_pending(&pool).await,
            0,
            "a cut counted an attempt"
        );
        // Not waiting for work: the fault's cadence, a cut every 50-250 ms.
        let cadence = Duration::from_millis(rng.random_range(50..250));
        hold_for(cadence, "the fault's cadence").await;
    }
    println!("cut {cuts} times; {in_tx} sessions terminated inside a transaction");
    assert!(
        in_tx >= 4,
        "too few sessions cut mid-batch to prove anything"
    );

    wait_drained_to(&pool, 0).await;
    assert!(relay.running());
    let (code, _) = relay.terminate(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0));

    let in_redis = list_uuids(&ns, "queue:default").await;
    let t = tally(&inserted, &in_redis, &HashSet::new());
    t.assert_exactly_once();
    assert_eq!(dead_count(&pool).await, 0);
    let b = Batches::of(&log_lines(&logs.files()));
    assert_eq!(b.delivered(), ROWS as u64, "{b:?}");
    let duplicates = b.duplicates;
    println!("pg-cuts: duplicates by relay logs {}; {b:?}", b.duplicates);
    figures("postgres_cuts", t.relayed, duplicates, t.lost.len());
}

/// A Redis that turned replica (READONLY), then a stale replica (MASTERDOWN): rows wait with
/// their attempts untouched, the outage is logged once, and delivery resumes on promotion.
#[sqlx::test]
async fn readonly_and_masterdown_are_transient(pool: PgPool) {
    let redis = RedisServer::start();
    let ns = Namespace::on(&redis.url());
    let db = database_url_of(&pool).await;
    let dead_master = free_port().to_string();
    redis_cmd(&redis.url(), &["REPLICAOF", "127.0.0.1", &dead_master]).await;
    let inserted = insert_bulk(&pool, 2_000).await;
    let mut logs = Logs::new();
    let mut relay = logs.start(&db, &redis.url(), &ns, &[]);

    // (redis-rs renders the codes as ReadOnly and MasterDown.)
    for (stale, code) in [("yes", "readonly"), ("no", "masterdown")] {
        redis_cmd(
            &redis.url(),
            &["CONFIG", "SET", "replica-serve-stale-data", stale],
        )
        .await;
        let files = logs.files();
        let files = &files;
        wait_until(
            &format!("a push refused with {code}"),
            Duration::from_secs(30),
            || async move {
                log_lines(files).iter().any(|l| {
                    message(l) == "batch rolled back; backing off"
                        && l["error"]
                            .as_str()
                            .unwrap_or("")
                            .to_lowercase()
                            .contains(code)
                })
            },
        )
        .await;
        // Not waiting for work: a window of a few more tries, in which nothing may change.
        hold_for(Duration::from_secs(2), "a few more tries change nothing").await;
        assert_eq!(pending_count(&pool).await, 2_000);
        assert_eq!(
            max_attempts_pending(&pool).await,
            0,
            "{code} counted an attempt"
        );
        assert_eq!(dead_count(&pool).await, 0);
    }
    redis_cmd(&redis.url(), &["REPLICAOF", "NO", "ONE"]).await;
    wait_drained_to(&pool, 0).await;
    let (code, _) = relay.terminate(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0));
    tally(
        &inserted,
        &list_uuids(&ns, "queue:default").await,
        &HashSet::new(),
    )
    .assert_exactly_once();
    let lines = log_lines(&logs.files());
    print_health(&lines);
    // Not writable from the start: one "not reachable yet" and, on promotion, one "recovered",
    // however often the probe and the workers were refused in between.
    assert_eq!(
        count_message(&lines, "redis not reachable yet; retrying with backoff"),
        1
    );
    assert_eq!(
        count_message(&lines, "redis unavailable; retrying with backoff"),
        0
    );
    assert_eq!(count_message(&lines, "redis recovered"), 1);
}

async fn ping(
    con: &mut jobrelay::broker::connection::RedisConnection,
) -> redis::RedisResult<String> {
    redis::cmd("PING").query_async(con).await
}

/// A connection whose reconnects all failed during an outage: the first request after Redis is
/// back gets an answer (one more try on a new connection), not the stale failure of a reconnect
/// begun during the outage, which the relay would report as a second outage.
#[tokio::test]
async fn the_first_request_after_an_outage_is_not_handed_a_stale_reconnect_failure() {
    let redis = RedisServer::start();
    let proxy = Proxy::start(upstream(redis.port));
    let client = redis::Client::open(proxy.redis_url()).unwrap();
    let mut con = jobrelay::broker::connection::connect(&client, Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(ping(&mut con).await.unwrap(), "PONG");

    let before = proxy.accepted();
    proxy.set_mode(Mode::Reject);
    assert!(ping(&mut con).await.is_err(), "Redis is unreachable");
    // The request found its connection cut and started a reconnect of two attempts. Once both
    // were refused, the connection holds a failed reconnect.
    wait_until(
        "two reconnect attempts refused",
        Duration::from_secs(10),
        || async { proxy.accepted() >= before + 2 },
    )
    .await;
    proxy.set_mode(Mode::Forward);
    assert_eq!(
        ping(&mut con)
            .await
            .expect("first request after the outage"),
        "PONG"
    );
}

/// Postgres, then Redis, unreachable for 4 s each (a proxy that closes every connection):
/// each outage is logged once and its end once, the relay retries at a bounded rate, and
/// every row arrives once.
#[sqlx::test]
async fn outages_are_logged_once_and_retried_at_a_bounded_rate(pool: PgPool) {
    const ROWS: i64 = 30_000;
    let redis = RedisServer::start();
    let redis_proxy = Proxy::start(upstream(redis.port));
    let pg_proxy = Proxy::start(upstream(5432));
    let ns = Namespace::on(&redis.url());
    let db = database_url_of(&pool).await;
    let mut db_via_proxy = url::Url::parse(&db).unwrap();
    db_via_proxy.set_port(Some(pg_proxy.port)).unwrap();
    let inserted = insert_bulk(&pool, ROWS).await;
    let mut logs = Logs::new();
    let mut relay = logs.start(db_via_proxy.as_str(), &redis_proxy.redis_url(), &ns, &[]);

    let mut drained_to = ROWS;
    for (name, proxy) in [("postgres", &pg_proxy), ("redis", &redis_proxy)] {
        drained_to -= 5_000;
        wait_drained_to(&pool, drained_to).await;
        let before = proxy.accepted();
        proxy.set_mode(Mode::Reject);
        let down = Instant::now();
        // The batch in flight settles within --push-timeout (5 s): it rolls back, or commits
        // the script calls Redis acknowledged before the outage and keeps the rest. Not waiting
        // for work: 6 s of the 9 s outage; the count sampled then must hold until its end.
        hold_for(
            Duration::from_secs(6),
            "the outage lasts; the batch in flight settles",
        )
        .await;
        let pending_down = pending_count(&pool).await;
        while down.elapsed() < Duration::from_secs(9) {
            assert_eq!(
                max_attempts_pending(&pool).await,
                0,
                "{name} outage counted an attempt"
            );
            hold_for(
                Duration::from_millis(100),
                "between looks during the outage",
            )
            .await;
        }
        assert_eq!(
            pending_count(&pool).await,
            pending_down,
            "rows deleted during the {name} outage"
        );
        let tries = proxy.accepted() - before;
        let rate = tries as f64 / down.elapsed().as_secs_f64();
        println!(
            "{name} down {:?}: {tries} connection attempts ({rate:.1}/s)",
            down.elapsed()
        );
        // Two workers, the probe (1/s) and the listener, each backing off: a handful a second.
        // A relay that retried in a loop would make hundreds.
        assert!(rate < 15.0, "{name}: {tries} connection attempts in 9 s");
        proxy.set_mode(Mode::Forward);
    }
    wait_drained_to(&pool, 0).await;
    assert!(relay.running());
    let (code, _) = relay.terminate(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0));
    tally(
        &inserted,
        &list_uuids(&ns, "queue:default").await,
        &HashSet::new(),
    )
    .assert_exactly_once();
    assert_eq!(dead_count(&pool).await, 0);
    let lines = log_lines(&logs.files());
    print_health(&lines);
    for dep in ["postgres", "redis"] {
        let down = format!("{dep} unavailable; retrying with backoff");
        let up = format!("{dep} recovered");
        assert_eq!(count_message(&lines, &down), 1, "{down}");
        assert_eq!(count_message(&lines, &up), 1, "{up}");
    }
}

/// `used_memory` of a Redis, from `INFO memory`.
async fn used_memory(url: &str) -> i64 {
    let mut con = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut con)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("INFO memory has used_memory")
}

/// A Redis at `maxmemory` (noeviction) for 2.5 x `--dedup-ttl`, reached in the middle of a
/// batch: the script calls Redis acknowledged before the OOM are committed (their rows
/// deleted), the rest kept with attempts untouched; when the markers of the acknowledged jobs
/// have expired and the limit is lifted, every job is in Redis exactly once (list entries
/// counted, not markers), nothing is dead-lettered, and the outage is logged once, with its
/// reason, although the probe and the workers were refused all along.
#[sqlx::test]
async fn acknowledged_pushes_survive_an_oom_outage_longer_than_the_dedup_ttl(pool: PgPool) {
    const ROWS: i64 = 20_000;
    const TTL_SECONDS: u64 = 32; // the least --dedup-ttl allows with --push-timeout 1s
    let redis = RedisServer::start();
    let url = redis.url();
    let ns = Namespace::on(&url);
    let db = database_url_of(&pool).await;
    // 1 KiB payloads: one script call (1,000 jobs) needs over 1 MiB of Redis memory.
    sqlx::query(
        "INSERT INTO pending_jobs (queue, job_type, payload)
         SELECT 'default', 'Bulk', convert_to(rpad(i::text, 1024, 'x'), 'UTF8')
         FROM generate_series(1, $1) AS i",
    )
    .bind(ROWS)
    .execute(&pool)
    .await
    .unwrap();
    let inserted = pending_uuids(&pool).await;
    // Room for about one call (its request, over 1 MiB, counts while Redis reads it; its
    // writes take over 2 MiB): the first call lands, the next is refused with OOM.
    let room = used_memory(&url).await + 5 * 512 * 1024;
    redis_cmd(&url, &["CONFIG", "SET", "maxmemory-policy", "noeviction"]).await;
    redis_cmd(&url, &["CONFIG", "SET", "maxmemory", &room.to_string()]).await;
    let mut logs = Logs::new();
    let ttl = format!("{TTL_SECONDS}s");
    let mut relay = logs.start(
        &db,
        &url,
        &ns,
        &["--dedup-ttl", &ttl, "--push-timeout", "1s"],
    );

    let files = logs.files();
    let oom_logged = |files: Vec<PathBuf>| async move {
        log_lines(&files).iter().any(|l| {
            message(l) == "redis unavailable; retrying with backoff"
                && l["reason"] == "out of memory"
        })
    };
    wait_until("an OOM outage logged", Duration::from_secs(60), || {
        oom_logged(files.clone())
    })
    .await;
    // Hold Redis full: every write is refused while the acknowledged jobs' markers expire.
    redis_cmd(&url, &["CONFIG", "SET", "maxmemory", "1"]).await;
    let landed = ns.llen("queue:default").await as i64;
    println!("{landed} jobs landed before the OOM");
    assert!(
        (1_000..ROWS).contains(&landed),
        "{landed} jobs landed before the OOM"
    );
    // Not synchronisation: the outage must outlast the markers (the scenario).
    let outlast = Duration::from_secs(TTL_SECONDS * 5 / 2);
    hold_for(outlast, "the outage outlasts the markers").await;
    assert_eq!(
        ns.marker_count().await,
        0,
        "the markers expired during the outage"
    );
    assert_eq!(
        pending_count(&pool).await,
        ROWS - landed,
        "acknowledged rows deleted, the rest kept"
    );
    assert_eq!(
        max_attempts_pending(&pool).await,
        0,
        "OOM counted no attempt"
    );

    redis_cmd(&url, &["CONFIG", "SET", "maxmemory", "0"]).await;
    wait_drained_to(&pool, 0).await;
    let (code, _) = relay.terminate(Duration::from_secs(30)).await;
    // Printed before any assertion, so that a failure shows what the relay went through.
    let lines = log_lines(&logs.files());
    print_health(&lines);
    assert_eq!(code, Some(0));
    let in_redis = list_uuids(&ns, "queue:default").await;
    assert_eq!(
        in_redis.len() as i64,
        ROWS,
        "list entries, not only markers"
    );
    let t = tally(&inserted, &in_redis, &HashSet::new());
    t.assert_exactly_once();
    assert_eq!(dead_count(&pool).await, 0);
    // The OOM outage is one episode, logged once with its reason however long the probe and
    // the workers were refused. Another outage is its own episode (a script call cut off by
    // the 1 s --push-timeout on a loaded machine: `timeout`), and each one recovers once.
    let outages: Vec<&str> = lines
        .iter()
        .filter(|l| message(l) == "redis unavailable; retrying with backoff")
        .map(|l| l["reason"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        outages.iter().filter(|r| **r == "out of memory").count(),
        1,
        "outages logged: {outages:?}"
    );
    assert_eq!(
        count_message(&lines, "redis recovered"),
        outages.len(),
        "one recovery per outage: {outages:?}"
    );
    figures(
        "oom_longer_than_dedup_ttl",
        t.relayed,
        Batches::of(&lines).duplicates,
        t.lost.len(),
    );
}
