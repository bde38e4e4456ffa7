//! What the relay asks of Redis before it trusts it with jobs: a `maxmemory-policy` that never
//! evicts (unless `--redis-allow-eviction`), and with `--redis-wait-replicas` the replicas'
//! acknowledgement (`WAIT`) before a row is deleted. Private servers only.

use super::*;

fn config_set(redis: &RedisServer, name: &str, value: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query(&mut redis.con())
        .unwrap();
}

/// A private Redis of 64 MB with the `maxmemory-policy` `policy`.
fn redis_with_policy(policy: &str) -> RedisServer {
    RedisServer::start_with(&["--maxmemory", "64mb", "--maxmemory-policy", policy])
}

/// The relay's environment: the test's database, `redis` and `ns`'s prefix.
fn env_of<'a>(db: &'a str, redis: &'a str, ns: &'a Namespace) -> [(&'static str, &'a str); 3] {
    [
        ("DATABASE_URL", db),
        ("REDIS_URL", redis),
        ("JOBRELAY_NAMESPACE", &ns.prefix),
    ]
}

/// An `allkeys-lru` Redis would evict queued jobs and markers: `check` fails with one line
/// naming the policy and the fix; with `--redis-allow-eviction` it is ok and says so.
#[sqlx::test]
async fn check_names_an_evicting_policy_and_the_opt_out(pool: PgPool) {
    let db = database_url_of(&pool).await;
    let redis = redis_with_policy("allkeys-lru");
    let ns = Namespace::on(&redis.url());
    let url = redis.url();
    let env = env_of(&db, &url, &ns);
    let (code, out, err) = run_relay(&["check"], &env).await;
    assert_eq!(code, 1, "{out}{err}");
    let line = out.lines().find(|l| l.starts_with("redis: ")).unwrap();
    assert!(
        line.starts_with("redis: eviction policy: maxmemory-policy is allkeys-lru")
            && line.contains("noeviction")
            && line.contains("--redis-allow-eviction"),
        "{out}"
    );
    let (code, out, err) = run_relay(&["check", "--redis-allow-eviction"], &env).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(
            "redis: ok (maxmemory-policy allkeys-lru, accepted by --redis-allow-eviction)"
        ),
        "{out}"
    );
}

/// An `allkeys-lru` or `volatile-lru` Redis: the daemon is not ready and pushes nothing (rows
/// stay, attempts untouched, logged once) until the policy is `noeviction`.
#[sqlx::test]
async fn an_evicting_redis_gets_no_job_until_it_stops_evicting(pool: PgPool) {
    let db = database_url_of(&pool).await;
    let redis = redis_with_policy("allkeys-lru");
    let ns = Namespace::on(&redis.url());
    let url = redis.url();
    insert_rows(&pool, 30, "evict").await;
    let mut d = Daemon::start(&["--max-attempts", "2"], &env_of(&db, &url, &ns));
    let port = d.port;
    wait_until(
        "/readyz names the allkeys-lru policy",
        Duration::from_secs(15),
        || async move {
            matches!(http_get(port, "/readyz").await,
                Ok((503, body)) if body.starts_with("redis: eviction policy (maxmemory-policy is allkeys-lru"))
        },
    )
    .await;
    config_set(&redis, "maxmemory-policy", "volatile-lru");
    wait_until(
        "/readyz names the volatile-lru policy",
        Duration::from_secs(15),
        || async move {
            matches!(http_get(port, "/readyz").await,
                Ok((503, body)) if body.contains("maxmemory-policy is volatile-lru"))
        },
    )
    .await;
    // Not synchronisation: the refusal lasts several probe periods and worker retries.
    hold_for(Duration::from_secs(3), "the refusal lasts; rows kept").await;
    assert_eq!(rows_state(&pool).await, (30, 0, 0), "rows kept untouched");
    assert_eq!(ns.llen("queue:evict").await, 0, "nothing pushed");

    config_set(&redis, "maxmemory-policy", "noeviction");
    let n = &ns;
    wait_until("the rows relayed", Duration::from_secs(40), || async move {
        n.llen("queue:evict").await == 30
    })
    .await;
    d.wait_ready(Duration::from_secs(15)).await;
    let episodes = redis_episodes(&d);
    assert_eq!(episodes.len(), 2, "{}", d.logs());
    assert!(
        episodes[0].0.ends_with("; retrying with backoff"),
        "{episodes:?}"
    );
    assert_eq!(episodes[0].1, "eviction policy");
    assert_eq!(
        episodes[1],
        ("redis recovered".to_owned(), "eviction policy".to_owned())
    );
    // The refusal is what the log says happened, once for the episode, naming the policy;
    // nothing else: no note that the evicting policy was accepted (no --redis-allow-eviction).
    let refusals: Vec<String> = d
        .events()
        .into_iter()
        .filter(|e| e["reason"] == "eviction policy" && e["message"] != "redis recovered")
        .map(|e| e["error"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(refusals.len(), 1, "{refusals:#?}");
    assert!(refusals[0].contains("allkeys-lru"), "{refusals:#?}");
    let policy_notes: Vec<String> = d
        .events()
        .into_iter()
        .filter(|e| {
            e["policy"].is_string()
                || e["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("relaying anyway"))
        })
        .map(|e| e.to_string())
        .collect();
    assert!(policy_notes.is_empty(), "{policy_notes:#?}");
    assert_eq!(d.terminate(Duration::from_secs(30)).await, Some(0));
}

/// The opt-out, from the environment (`JOBRELAY_REDIS_ALLOW_EVICTION`): a `volatile-lru` Redis
/// gets its jobs, and the probe logs the accepted policy once.
#[sqlx::test]
async fn an_evicting_redis_allowed_from_the_environment_gets_its_jobs(pool: PgPool) {
    let db = database_url_of(&pool).await;
    let redis = redis_with_policy("volatile-lru");
    let ns = Namespace::on(&redis.url());
    let url = redis.url();
    let [db_env, redis_env, ns_env] = env_of(&db, &url, &ns);
    let allowed = [
        db_env,
        redis_env,
        ns_env,
        ("JOBRELAY_REDIS_ALLOW_EVICTION", "true"),
    ];
    insert_rows(&pool, 10, "allowed").await;
    let mut d = Daemon::start(&[], &allowed);
    let n = &ns;
    wait_until("the rows relayed", Duration::from_secs(40), || async move {
        n.llen("queue:allowed").await == 10
    })
    .await;
    d.wait_ready(Duration::from_secs(15)).await;
    // The probe logs it (the workers do not look when eviction is allowed): readiness may
    // come from the workers' pushes before the probe's first round ends.
    let dd = &d;
    wait_until(
        "the probe notes the accepted policy",
        Duration::from_secs(15),
        || async move { dd.events().iter().any(|e| e["policy"] == "volatile-lru") },
    )
    .await;
    let accepted = d
        .events()
        .into_iter()
        .filter(|e| e["policy"] == "volatile-lru")
        .count();
    assert_eq!(
        accepted,
        1,
        "the accepted policy is logged once:\n{}",
        d.logs()
    );
    assert_eq!(d.terminate(Duration::from_secs(30)).await, Some(0));
}

/// A primary with one replica in sync.
async fn primary_and_replica() -> (RedisServer, RedisServer) {
    let primary = RedisServer::start();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &primary.port.to_string()]);
    let info = |server: &RedisServer| -> String {
        redis::cmd("INFO")
            .arg("replication")
            .query(&mut server.con())
            .unwrap()
    };
    wait_until("the replica in sync", Duration::from_secs(20), || async {
        info(&primary).contains("connected_slaves:1")
            && info(&replica).contains("master_link_status:up")
    })
    .await;
    (primary, replica)
}

const WAIT_ONE: [&str; 4] = [
    "--redis-wait-replicas",
    "1",
    "--redis-wait-timeout",
    "300ms",
];

/// `check` with `--redis-wait-replicas`: ok when as many replicas acknowledge a write within
/// the timeout; `replicas behind` naming how many did when fewer do.
#[sqlx::test]
async fn check_counts_the_replicas_that_acknowledge(pool: PgPool) {
    let db = database_url_of(&pool).await;
    let (primary, _replica) = primary_and_replica().await;
    let ns = Namespace::on(&primary.url());
    let url = primary.url();
    let env = env_of(&db, &url, &ns);
    // WAIT answers as soon as the replica has the write: a generous bound costs nothing here,
    // and 300 ms fell short once on a loaded machine.
    let wait_one = ["--redis-wait-replicas", "1", "--redis-wait-timeout", "3s"];
    let (code, out, err) = run_relay(&[&["check"], &wait_one[..]].concat(), &env).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("redis: ok (maxmemory-policy noeviction; 1 replicas acknowledged within 3s)"),
        "{out}"
    );
    let (code, out, _) = run_relay(
        &[
            "check",
            "--redis-wait-replicas",
            "2",
            "--redis-wait-timeout",
            "300ms",
        ],
        &env,
    )
    .await;
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(
            "redis: replicas behind: 1 of 2 replicas acknowledged the writes within 300ms"
        ),
        "{out}"
    );
}

/// A primary with one replica, `--redis-wait-replicas 1`: a row is deleted only once the
/// replica has its job. With the replica stopped (SIGSTOP) WAIT falls short: the rows stay
/// (attempts untouched, no dead letter), `/readyz` says `replicas behind`, logged once; once it
/// resumes, the rows go and every job is in Redis exactly once, on the replica too.
#[sqlx::test]
async fn with_wait_replicas_rows_stay_until_the_replica_has_the_jobs(pool: PgPool) {
    let db = database_url_of(&pool).await;
    let (primary, replica) = primary_and_replica().await;
    let ns = Namespace::on(&primary.url());
    let on_replica = |key: &str| -> usize {
        redis::cmd("LLEN")
            .arg(ns.key(key))
            .query(&mut replica.con())
            .unwrap()
    };
    let url = primary.url();
    let env = env_of(&db, &url, &ns);
    let mut d = Daemon::start(&[&WAIT_ONE[..], &["--max-attempts", "2"]].concat(), &env);
    d.wait_ready(Duration::from_secs(15)).await;
    insert_rows(&pool, 20, "first").await;
    let p = &pool;
    wait_until(
        "the first rows relayed",
        Duration::from_secs(20),
        || async move { pending_count(p).await == 0 },
    )
    .await;
    assert_eq!(
        on_replica("queue:first"),
        20,
        "deleted only once on the replica"
    );

    replica.signal("STOP");
    insert_rows(&pool, 20, "second").await;
    let port = d.port;
    wait_until(
        "/readyz says replicas behind",
        Duration::from_secs(15),
        || async move {
            matches!(http_get(port, "/readyz").await,
                Ok((503, body)) if body.starts_with("redis: replicas behind"))
        },
    )
    .await;
    // Not synchronisation: the replica stays stopped for several retries.
    hold_for(
        Duration::from_secs(3),
        "the replica stays stopped; rows kept",
    )
    .await;
    assert_eq!(rows_state(&pool).await, (20, 0, 0), "rows kept untouched");
    assert_eq!(
        ns.llen("queue:second").await,
        20,
        "the jobs are on the primary, their rows kept until a replica has them"
    );

    replica.signal("CONT");
    wait_until(
        "the second rows relayed",
        Duration::from_secs(40),
        || async move { pending_count(p).await == 0 },
    )
    .await;
    assert_eq!(ns.llen("queue:second").await, 20, "each job once");
    assert_eq!(on_replica("queue:second"), 20);
    assert_eq!(rows_state(&pool).await, (0, 0, 0));
    let episodes = redis_episodes(&d);
    assert_eq!(
        episodes,
        [
            (
                "redis unavailable; retrying with backoff".to_owned(),
                "replicas behind".to_owned()
            ),
            ("redis recovered".to_owned(), "replicas behind".to_owned())
        ],
        "{}",
        d.logs()
    );
    assert_eq!(d.terminate(Duration::from_secs(30)).await, Some(0));
}
