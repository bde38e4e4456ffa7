//! Endpoint failures are never a job's fault: an ACL that denies the script or a command in
//! it, a wrong password, a refused connection, a server that does not know `EVALSHA`, memory
//! hovering at `maxmemory`. Each is a transient failure of Redis with its own reason in the
//! logs (once per episode), `/readyz` and `check`; rows keep their attempts, nothing is
//! dead-lettered. And the usual ACL template (`+@all -@dangerous`) is ready and relays.

use super::*;

/// No line blamed a job: no per-job refusal, no dead letter, no isolation.
fn assert_no_job_blamed(d: &Daemon) {
    for blame in [
        "jobs refused by redis; kept for retry",
        "rows moved to the dead-letter table",
        "redis refused a push or closed the connection on it; pushing its jobs one by one",
    ] {
        assert!(d.events_with(blame).is_empty(), "{blame}:\n{}", d.logs());
    }
}

fn acl_setuser(redis: &RedisServer, rules: &[&str]) {
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(rules)
        .query(&mut redis.con())
        .unwrap();
}

/// Starts a daemon on `url`, waits until `/readyz` is 503 starting with `readyz`, lets the
/// failure last, and checks that the rows were kept untouched and the episode logged once with
/// `reason`.
async fn refused_as_the_endpoints_fault(
    pool: &PgPool,
    url: &str,
    ns: &Namespace,
    readyz: &'static str,
    reason: &str,
) -> Daemon {
    let db = database_url_of(pool).await;
    let env = [
        ("DATABASE_URL", db.as_str()),
        ("REDIS_URL", url),
        ("JOBRELAY_NAMESPACE", &ns.prefix),
    ];
    let (code, out, err) = run_relay(&["check"], &env).await;
    let d = Daemon::start(&["--max-attempts", "2"], &env);
    let port = d.port;
    wait_until(
        &format!("/readyz says {readyz}"),
        Duration::from_secs(15),
        || async move {
            matches!(http_get(port, "/readyz").await,
                Ok((503, body)) if body.starts_with(readyz))
        },
    )
    .await;
    // Not synchronisation: the failure lasts several probe periods and worker retries (with
    // --max-attempts 2, a failure counted against the jobs would dead-letter them at once).
    hold_for(
        Duration::from_secs(4),
        "the failure lasts; nothing may be blamed on a job",
    )
    .await;
    let (pending, attempts, dead) = rows_state(pool).await;
    assert!(pending > 0, "rows are pending");
    assert_eq!(
        (attempts, dead),
        (0, 0),
        "attempts untouched, no dead letter"
    );
    assert_no_job_blamed(&d);
    let episodes = redis_episodes(&d);
    assert_eq!(episodes.len(), 1, "one episode:\n{}", d.logs());
    assert_eq!(episodes[0].1, reason, "{}", d.logs());
    // `check` names the same reason when its probe sees it, and never blames a job.
    if code != 0 {
        assert!(
            out.contains(&format!("redis: {reason}: ")),
            "check: {out}{err}"
        );
    }
    d
}

/// The usual ACL template, `~ns:* +@all -@dangerous`, denies `ROLE`, `CONFIG` and `INFO`: the
/// probe cannot tell the role or the policy, says so, and is ready; the relay relays.
#[sqlx::test]
async fn the_usual_acl_template_is_ready_and_relays(pool: PgPool) {
    let db = database_url_of(&pool).await;
    let redis = RedisServer::start();
    let ns = Namespace::on(&redis.url());
    let keys = format!("~{}*", ns.prefix);
    acl_setuser(
        &redis,
        &["relay", "on", ">pw", &keys, "+@all", "-@dangerous"],
    );
    let url = format!("redis://relay:pw@127.0.0.1:{}", redis.port);
    let env = [
        ("DATABASE_URL", db.as_str()),
        ("REDIS_URL", url.as_str()),
        ("JOBRELAY_NAMESPACE", &ns.prefix),
    ];
    let (code, out, err) = run_relay(&["check"], &env).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("redis: ok (cannot tell the maxmemory-policy (CONFIG GET: ")
            && out.contains("NOPERM")
            && out.contains("make sure it is noeviction"),
        "{out}"
    );
    insert_rows(&pool, 10, "acl").await;
    let mut d = Daemon::start(&[], &env);
    d.wait_ready(Duration::from_secs(15)).await;
    let n = &ns;
    wait_until("the rows relayed", Duration::from_secs(30), || async move {
        n.llen("queue:acl").await == 10
    })
    .await;
    assert!(redis_episodes(&d).is_empty(), "{}", d.logs());
    let cannot_tell = d.events_with(
        "cannot tell redis's maxmemory-policy; relaying as if it were noeviction (make sure it is)",
    );
    assert_eq!(cannot_tell.len(), 1, "{}", d.logs());
    assert_eq!(d.terminate(Duration::from_secs(30)).await, Some(0));

    // The tight ACL of docs/guarantees.md#the-minimal-acl, word for word, in the conveyor
    // layout (the one that needs the most commands): ready, relays, tells the policy.
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/guarantees.md"))
        .unwrap();
    let line = doc
        .lines()
        .find(|l| l.starts_with("ACL SETUSER jobrelay on >PASSWORD ~app1:* +evalsha"))
        .expect("the tight ACL line");
    let rules: Vec<String> = line
        .split_whitespace()
        .skip(2)
        .map(|w| match w {
            ">PASSWORD" => ">pw".to_owned(),
            "~app1:*" => format!("~{}*", ns.prefix),
            w => w.to_owned(),
        })
        .collect();
    let rules: Vec<&str> = rules.iter().map(String::as_str).collect();
    acl_setuser(&redis, &rules);
    let url = format!("redis://jobrelay:pw@127.0.0.1:{}", redis.port);
    let env = [
        ("DATABASE_URL", db.as_str()),
        ("REDIS_URL", url.as_str()),
        ("JOBRELAY_NAMESPACE", &ns.prefix),
        ("JOBRELAY_LAYOUT", "conveyor"),
    ];
    let (code, out, err) = run_relay(&["check"], &env).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("redis: ok (maxmemory-policy noeviction)"),
        "{out}"
    );
    insert_rows(&pool, 10, "tight").await;
    let mut d = Daemon::start(&[], &env);
    d.wait_ready(Duration::from_secs(15)).await;
    wait_until("the rows relayed", Duration::from_secs(30), || async move {
        n.llen("queue:tight").await == 10
    })
    .await;
    assert!(redis_episodes(&d).is_empty(), "{}", d.logs());
    assert_eq!(d.terminate(Duration::from_secs(30)).await, Some(0));
}

/// A user denied `EVALSHA`, and one whose script's `LPUSH` is denied (Redis 7.0 reports that as
/// a plain `ERR` from inside the script): `permission denied`, rows untouched, one episode;
/// granted the command, the relay resumes on its own.
#[sqlx::test]
async fn acl_denials_of_the_script_are_the_endpoints_fault(pool: PgPool) {
    let redis = RedisServer::start();
    let ns = Namespace::on(&redis.url());
    let keys = format!("~{}*", ns.prefix);
    for (user, denied) in [("noeval", "-evalsha"), ("nolpush", "-lpush")] {
        acl_setuser(
            &redis,
            &[user, "on", ">pw", &keys, "+@all", "-@dangerous", denied],
        );
        let queue = format!("acl-{user}");
        insert_rows(&pool, 10, &queue).await;
        let url = format!("redis://{user}:pw@127.0.0.1:{}", redis.port);
        let mut d = refused_as_the_endpoints_fault(
            &pool,
            &url,
            &ns,
            "redis: permission denied",
            "permission denied",
        )
        .await;
        let granted = denied.replacen('-', "+", 1);
        acl_setuser(&redis, &[user, &granted]);
        let (n, q) = (&ns, queue.as_str());
        wait_until("the rows relayed", Duration::from_secs(40), || async move {
            n.llen(&format!("queue:{q}")).await == 10
        })
        .await;
        d.wait_ready(Duration::from_secs(15)).await;
        let episodes = redis_episodes(&d);
        assert_eq!(episodes.len(), 2, "{}", d.logs());
        assert_eq!(episodes[1].0, "redis recovered", "{}", d.logs());
        assert_eq!(d.terminate(Duration::from_secs(30)).await, Some(0));
    }
}

/// A wrong password is `authentication failed`, a port nobody listens on `refused` (not
/// `timeout`), a server without `EVALSHA` (a sentinel's port, a proxy) `unknown command`: in
/// `check`, `/readyz` and the logs, rows untouched.
#[sqlx::test]
async fn wrong_password_refused_port_and_unknown_command_are_named(pool: PgPool) {
    insert_rows(&pool, 10, "named").await;
    let guarded = RedisServer::start();
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "requirepass", "right"])
        .query(&mut guarded.con())
        .unwrap();
    let ns = Namespace::on(&format!("redis://:right@127.0.0.1:{}", guarded.port));
    let wrong = format!("redis://:wrong@127.0.0.1:{}", guarded.port);
    let mut d = refused_as_the_endpoints_fault(
        &pool,
        &wrong,
        &ns,
        "redis: authentication failed",
        "authentication failed",
    )
    .await;
    assert_eq!(d.terminate(Duration::from_secs(30)).await, Some(0));

    let nowhere = format!("redis://127.0.0.1:{}", free_port());
    let mut d =
        refused_as_the_endpoints_fault(&pool, &nowhere, &ns, "redis: refused", "refused").await;
    assert_eq!(d.terminate(Duration::from_secs(30)).await, Some(0));

    let no_scripts =
        RedisServer::start_with(&["--rename-command", "EVALSHA", "evalsha-not-for-you"]);
    let ns = Namespace::on(&no_scripts.url());
    let mut d = refused_as_the_endpoints_fault(
        &pool,
        &no_scripts.url(),
        &ns,
        "redis: unknown command",
        "unknown command",
    )
    .await;
    assert_eq!(d.terminate(Duration::from_secs(30)).await, Some(0));
}

per_layout!(an_oom_outage_hovering_at_the_limit_is_logged_once);
/// Redis at `maxmemory` with `noeviction`, memory hovering just under the limit: the probe's
/// small write goes through every second while every batch (a script call of about 2 MB) is
/// refused with `OOM`. That is one episode, logged once when it begins and once when it ends
/// (when a batch goes through), not an "unavailable"/"recovered" pair a second.
async fn an_oom_outage_hovering_at_the_limit_is_logged_once(pool: PgPool, layout: TestLayout) {
    let db = database_url_of(&pool).await;
    let redis = RedisServer::start();
    let ns = Namespace::on(&redis.url());
    sqlx::query(
        "INSERT INTO pending_jobs (queue, job_type, payload)
         SELECT 'hover', 'T', convert_to('[\"' || repeat('x', 2000) || i || '\"]', 'UTF8')
         FROM generate_series(1, 3000) AS i",
    )
    .execute(&pool)
    .await
    .unwrap();
    let mut con = redis.con();
    let used = |con: &mut redis::Connection| -> u64 {
        let info: String = redis::cmd("INFO").arg("memory").query(con).unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let limit = used(&mut con) + 8 * 1024 * 1024;
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "maxmemory", &limit.to_string()])
        .query(&mut con)
        .unwrap();
    // Filler up to half a megabyte under the limit: a small SET fits, a 2 MB call does not.
    let chunk = vec![b'f'; 64 * 1024];
    let mut i = 0;
    while used(&mut con) + 512 * 1024 < limit {
        let _: () = redis::cmd("SET")
            .arg(ns.key(&format!("filler:{i}")))
            .arg(&chunk)
            .query(&mut con)
            .unwrap();
        i += 1;
    }
    let env = [
        ("DATABASE_URL", db.as_str()),
        ("REDIS_URL", &redis.url()),
        ("JOBRELAY_NAMESPACE", &ns.prefix),
    ];
    let [flag, name] = layout.args();
    let mut d = Daemon::start(&["--max-attempts", "2", flag, name], &env);
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
    // Not synchronisation: the outage lasts several probe periods, during which the probe's
    // small write keeps succeeding.
    let outage = Instant::now();
    let mut probe_writes = 0;
    while outage.elapsed() < Duration::from_secs(6) {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(ns.key("jobrelay:probe"))
            .query(&mut con)
            .unwrap();
        if ttl > 9_000 {
            probe_writes += 1;
        }
        hold_for(
            Duration::from_millis(500),
            "between looks at the probe's key",
        )
        .await;
    }
    assert!(
        probe_writes >= 4,
        "the probe's write went through during the outage ({probe_writes} fresh looks)"
    );
    assert_eq!(rows_state(&pool).await, (3000, 0, 0), "rows kept untouched");
    let began = redis_episodes(&d);
    assert_eq!(began.len(), 1, "one line when it begins:\n{}", d.logs());
    assert!(began[0].0.ends_with("; retrying with backoff"), "{began:?}");
    assert_eq!(began[0].1, "out of memory");

    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "maxmemory", "0"])
        .query(&mut con)
        .unwrap();
    let p = &pool;
    wait_until("the rows relayed", Duration::from_secs(60), || async move {
        pending_count(p).await == 0
    })
    .await;
    assert_eq!(layout.llen(&ns, "hover").await, 3000);
    let episodes = redis_episodes(&d);
    assert_eq!(
        episodes[1..],
        [("redis recovered".to_owned(), "out of memory".to_owned())],
        "one line when it ends:\n{}",
        d.logs()
    );
    assert_eq!(episodes[0], began[0]);
    assert_no_job_blamed(&d);
    assert_eq!(d.terminate(Duration::from_secs(30)).await, Some(0));
}

/// A Redis Cluster node that owns every slot but the queue's: the probe's key is its own, so
/// the probe's write goes through, while every script call meets a key of another node
/// (Redis's "non local key" or `CLUSTERDOWN`, from inside the script). That is the endpoint's
/// failure, `cluster`, not the jobs': rows untouched, one episode. Following the cluster is the
/// `redis+cluster://` URL's job; this is a plain URL pointed at one node.
#[sqlx::test]
async fn a_cluster_node_that_does_not_own_the_queue_is_the_endpoints_fault(pool: PgPool) {
    insert_rows(&pool, 10, "elsewhere").await;
    let node = RedisServer::start_with(&[
        "--cluster-enabled",
        "yes",
        "--cluster-require-full-coverage",
        "no",
    ]);
    let ns = Namespace::on(&node.url());
    let mut con = node.con();
    let slot: u16 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(ns.key("queue:elsewhere"))
        .query(&mut con)
        .unwrap();
    for (from, to) in [(0, slot.checked_sub(1)), (slot + 1, Some(16383))] {
        if let Some(to) = to.filter(|&to| to >= from) {
            let _: () = redis::cmd("CLUSTER")
                .arg("ADDSLOTSRANGE")
                .arg(from)
                .arg(to)
                .query(&mut con)
                .unwrap();
        }
    }
    let mut d =
        refused_as_the_endpoints_fault(&pool, &node.url(), &ns, "redis: cluster", "cluster").await;
    assert_eq!(d.terminate(Duration::from_secs(30)).await, Some(0));
}

/// `min-replicas-to-write 1` on a primary without a replica: Redis answers `NOREPLICAS` to the
/// probe and the pushes alike; `replicas behind`, rows untouched, in `check` too.
#[sqlx::test]
async fn noreplicas_is_replicas_behind_not_the_jobs_fault(pool: PgPool) {
    insert_rows(&pool, 10, "lonely").await;
    let redis = RedisServer::start_with(&["--min-replicas-to-write", "1"]);
    let ns = Namespace::on(&redis.url());
    let mut d = refused_as_the_endpoints_fault(
        &pool,
        &redis.url(),
        &ns,
        "redis: replicas behind",
        "replicas behind",
    )
    .await;
    assert_eq!(d.terminate(Duration::from_secs(30)).await, Some(0));
}
