//! `/healthz` and `/readyz` through outages: Redis down, a missing outbox table, Redis out of
//! memory, a read-only Postgres; each named in `/readyz` and logged once.

use super::*;

#[sqlx::test]
async fn readyz_follows_a_redis_outage_and_healthz_stays_up(pool: PgPool) {
    let mut redis = RedisServer::start();
    let ns = Namespace::on(&redis.url());
    let db = database_url_of(&pool).await;
    let mut d = Daemon::start(
        &[],
        &[
            ("DATABASE_URL", &db),
            ("REDIS_URL", &redis.url()),
            ("JOBRELAY_NAMESPACE", &ns.prefix),
        ],
    );
    d.wait_ready(Duration::from_secs(15)).await;
    let port = d.port;
    let healthz_ok = || async move {
        let s = status_of(port, "/healthz").await;
        assert_eq!(s, 200, "/healthz during the outage test");
    };

    redis.kill();
    wait_until(
        "/readyz 503 after redis went down",
        Duration::from_secs(5),
        || async {
            healthz_ok().await;
            status_of(port, "/readyz").await == 503
        },
    )
    .await;
    let (status, body) = d.get("/readyz").await;
    assert_eq!(status, 503);
    assert!(body.contains("redis"), "{body}");
    let m = d.metrics().await;
    assert_eq!(m.get("jobrelay_up{dependency=\"redis\"}"), 0.0);
    assert_eq!(m.get("jobrelay_up{dependency=\"postgres\"}"), 1.0);
    // Not synchronisation: the outage lasts a few probe periods (the scenario), with /healthz
    // checked all along.
    let outage = Instant::now();
    while outage.elapsed() < Duration::from_secs(3) {
        healthz_ok().await;
        assert_eq!(status_of(port, "/readyz").await, 503);
        hold_for(
            Duration::from_millis(100),
            "between looks during the outage",
        )
        .await;
    }

    redis.restart();
    wait_until(
        "/readyz 200 after redis came back",
        Duration::from_secs(5),
        || async {
            healthz_ok().await;
            status_of(port, "/readyz").await == 200
        },
    )
    .await;
    assert_eq!(
        d.metrics().await.get("jobrelay_up{dependency=\"redis\"}"),
        1.0
    );
    // It relays again.
    insert_rows(&pool, 2, "after").await;
    wait_until(
        "rows relayed after the outage",
        Duration::from_secs(10),
        || async { ns.llen("queue:after").await == 2 },
    )
    .await;
    assert_eq!(d.terminate(Duration::from_secs(30)).await, Some(0));
    assert_one_outage_and_one_recovery_logged(&d);
}

/// One outage event and one recovery event, however many probes failed in between.
fn assert_one_outage_and_one_recovery_logged(d: &Daemon) {
    let redis_events: Vec<String> = d
        .events()
        .into_iter()
        .filter(|e| e["dependency"] == "redis")
        .map(|e| e["message"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        redis_events[..3],
        [
            "redis connected",
            "redis unavailable; retrying with backoff",
            "redis recovered"
        ],
        "{}",
        d.logs()
    );
    eprintln!("redis events: {redis_events:?}");
    let recovered = &d.events_with("redis recovered")[0];
    assert!(
        recovered["failed_tries"].as_u64().unwrap() >= 2,
        "{recovered}"
    );
    assert!(
        recovered["outage_seconds"].as_f64().unwrap() >= 3.0,
        "{recovered}"
    );
    assert_eq!(d.events_with("postgres connected").len(), 1);
    // A worker whose connection went stale during the outage may fail its first push after the
    // recovery (and retry at once); that shows as at most one more short outage.
    let tail = &redis_events[3..];
    assert!(
        tail.is_empty()
            || tail
                == [
                    "redis unavailable; retrying with backoff",
                    "redis recovered"
                ],
        "{}",
        d.logs()
    );
}

/// A daemon pointed at a table that does not exist says so once, naming the table and
/// `jobrelay migrate`; /readyz is 503 with that reason; it re-checks quietly, and relays as
/// soon as the table appears.
#[sqlx::test]
async fn a_missing_table_is_one_line_and_a_named_readiness_reason(pool: PgPool) {
    let db = database_url_of(&pool).await;
    let ns = Namespace::new();
    let env = [
        ("DATABASE_URL", db.as_str()),
        ("REDIS_URL", &ns.url),
        ("JOBRELAY_NAMESPACE", &ns.prefix),
        ("JOBRELAY_TABLE", "late_outbox"),
    ];
    let mut d = Daemon::start(&[], &env);
    let port = d.port;
    wait_until(
        "/readyz names the missing table",
        Duration::from_secs(15),
        || async move {
            matches!(http_get(port, "/readyz").await,
            Ok((503, body)) if body.contains("late_outbox") && body.contains("jobrelay migrate"))
        },
    )
    .await;
    // Not synchronisation: the episode lasts a few probe periods and worker backoffs.
    hold_for(Duration::from_secs(4), "the episode lasts; said once").await;
    let missing =
        "outbox table late_outbox does not exist: run `jobrelay migrate` (checking again quietly)";
    assert_eq!(d.events_with(missing).len(), 1, "{}", d.logs());
    assert_eq!(d.events_with(missing)[0]["table"], "late_outbox");
    assert_eq!(d.events_with(missing)[0]["level"], "ERROR");
    for flapping in [
        "postgres unavailable; retrying with backoff",
        "postgres recovered",
    ] {
        assert!(
            d.events_with(flapping).is_empty(),
            "{flapping}:\n{}",
            d.logs()
        );
    }
    assert!(
        d.logs().lines().count() < 10,
        "a quiet re-check:\n{}",
        d.logs()
    );

    let (code, out, err) = run_relay(&["migrate"], &env).await;
    assert_eq!(code, 0, "{out}{err}");
    sqlx::query("INSERT INTO late_outbox (queue, job_type) VALUES ('late', 'T')")
        .execute(&pool)
        .await
        .unwrap();
    d.wait_ready(Duration::from_secs(15)).await;
    let ns = &ns;
    wait_until("the row relayed", Duration::from_secs(40), || async move {
        ns.llen("queue:late").await == 1
    })
    .await;
    assert_eq!(d.events_with("outbox table late_outbox present").len(), 1);
    assert_eq!(d.terminate(Duration::from_secs(30)).await, Some(0));
}

/// /readyz says why Redis is down: at maxmemory it answers PING but refuses writes, and that
/// is one episode (one line when it begins, one when it ends), not a flapping outage.
#[sqlx::test]
async fn readyz_names_out_of_memory_and_logs_it_once(pool: PgPool) {
    let db = database_url_of(&pool).await;
    let redis = RedisServer::start();
    let ns = Namespace::on(&redis.url());
    let mut con = redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "maxmemory", "1"])
        .query(&mut con)
        .unwrap();
    insert_rows(&pool, 50, "oom").await;
    let env = [
        ("DATABASE_URL", db.as_str()),
        ("REDIS_URL", &redis.url()),
        ("JOBRELAY_NAMESPACE", &ns.prefix),
    ];
    let mut d = Daemon::start(&[], &env);
    let port = d.port;
    wait_until(
        "/readyz says out of memory",
        Duration::from_secs(15),
        || async move {
            matches!(http_get(port, "/readyz").await,
            Ok((503, body)) if body.starts_with("redis: out of memory"))
        },
    )
    .await;
    // Not synchronisation: the outage lasts several probe periods and worker retries.
    hold_for(Duration::from_secs(4), "the outage lasts; rows kept").await;
    assert_eq!(pending_count(&pool).await, 50);
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "maxmemory", "0"])
        .query(&mut con)
        .unwrap();
    d.wait_ready(Duration::from_secs(15)).await;
    let ns = &ns;
    wait_until("the rows relayed", Duration::from_secs(40), || async move {
        ns.llen("queue:oom").await == 50
    })
    .await;
    let began = d.events_with("redis not reachable yet; retrying with backoff");
    assert_eq!(began.len(), 1, "{}", d.logs());
    assert_eq!(began[0]["reason"], "out of memory");
    assert!(d
        .events_with("redis unavailable; retrying with backoff")
        .is_empty());
    assert_eq!(d.events_with("redis recovered").len(), 1, "{}", d.logs());
    assert_eq!(d.terminate(Duration::from_secs(30)).await, Some(0));
}

/// A Postgres that answers but refuses writes (here: sessions read-only by default, as on a
/// hot standby): `check` fails naming it, /readyz says so, and the daemon logs one episode
/// (the probe's SELECT succeeds while every claim fails: it must not end the episode).
#[sqlx::test]
async fn a_read_only_postgres_is_named_and_logged_once(pool: PgPool) {
    let db = database_url_of(&pool).await;
    let name: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&pool)
        .await
        .unwrap();
    insert_rows(&pool, 20, "ro").await;
    let admin = std::env::var("DATABASE_URL").unwrap();
    let alter = |setting: &'static str| {
        let (admin, name) = (admin.clone(), name.clone());
        async move {
            use sqlx::Connection;
            let mut con = sqlx::PgConnection::connect(&admin).await.unwrap();
            let sql = format!("ALTER DATABASE \"{name}\" {setting}");
            sqlx::query(&sql).execute(&mut con).await.unwrap();
        }
    };
    alter("SET default_transaction_read_only = on").await;
    let ns = Namespace::new();
    let env = [
        ("DATABASE_URL", db.as_str()),
        ("REDIS_URL", &ns.url),
        ("JOBRELAY_NAMESPACE", &ns.prefix),
    ];
    let (code, out, _) = run_relay(&["check"], &env).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("postgres: read-only replica: "), "{out}");
    let mut d = Daemon::start(&[], &env);
    let port = d.port;
    wait_until(
        "/readyz says read-only",
        Duration::from_secs(15),
        || async move {
            matches!(http_get(port, "/readyz").await,
            Ok((503, body)) if body.starts_with("postgres: read-only replica"))
        },
    )
    .await;
    // Not synchronisation: the episode lasts several probe periods and worker retries.
    hold_for(Duration::from_secs(4), "the read-only episode lasts").await;
    alter("RESET default_transaction_read_only").await;
    let ns = &ns;
    wait_until("the rows relayed", Duration::from_secs(60), || async move {
        ns.llen("queue:ro").await == 20
    })
    .await;
    // The probe logs the recovery on its next round, which may come after a worker relayed
    // the rows.
    let daemon = &d;
    wait_until(
        "the recovery logged",
        Duration::from_secs(15),
        || async move { !daemon.events_with("postgres recovered").is_empty() },
    )
    .await;
    let began = d.events_with("postgres not reachable yet; retrying with backoff");
    assert_eq!(began.len(), 1, "{}", d.logs());
    assert_eq!(began[0]["reason"], "read-only replica");
    assert!(
        d.events_with("postgres unavailable; retrying with backoff")
            .is_empty(),
        "{}",
        d.logs()
    );
    assert_eq!(d.events_with("postgres recovered").len(), 1, "{}", d.logs());
    assert_eq!(d.terminate(Duration::from_secs(30)).await, Some(0));
}

/// The probe, one round at a time, driven directly: each dependency's finding names why.
#[sqlx::test]
async fn the_probe_reports_each_dependency_in_one_round(pool: PgPool) {
    use jobrelay::broker::redis_probe::RedisProbe;
    use jobrelay::error::Reason;
    use jobrelay::relay::probe::Probe;
    use jobrelay::TableName;
    let ns = Namespace::new();
    let table = TableName::default();
    let timeout = Duration::from_secs(2);
    let redis = redis::Client::open(ns.url.as_str()).unwrap();
    let redis = RedisProbe::new(redis, &ns.prefix, timeout);
    let mut probe = Probe::new(pool.clone(), &table, timeout, redis);
    let found = probe.run_once().await;
    assert!(matches!(found.postgres, Ok(true)), "{:?}", found.postgres);
    assert!(found.endpoint.is_ok(), "{:?}", found.endpoint);
    assert_eq!(
        ns.keys().await,
        ["jobrelay:probe"],
        "the probe's own key, nothing else"
    );

    sqlx::query("DROP TABLE pending_jobs")
        .execute(&pool)
        .await
        .unwrap();
    let found = probe.run_once().await;
    assert!(
        matches!(found.postgres, Ok(false)),
        "a missing table: {:?}",
        found.postgres
    );

    let nowhere = redis::Client::open(format!("redis://127.0.0.1:{}", free_port())).unwrap();
    let nowhere = RedisProbe::new(nowhere, &ns.prefix, timeout);
    let mut probe = Probe::new(pool, &table, timeout, nowhere);
    let e = probe
        .run_once()
        .await
        .endpoint
        .expect_err("nothing listens there");
    assert_eq!(e.reason(), Reason::Refused, "{e}");
}
