//! Rows that fail: poison rows retried then dead-lettered while the rest flows, invalid rows
//! dead-lettered at once, and the `status` / `dead-letter` commands end to end.

use super::*;

per_layout!(poison_rows_are_retried_then_dead_lettered_and_the_rest_flows);
async fn poison_rows_are_retried_then_dead_lettered_and_the_rest_flows(
    pool: PgPool,
    layout: TestLayout,
) {
    let redis = RedisServer::start();
    let ns = Namespace::on(&redis.url());
    let db = database_url_of(&pool).await;
    let (good, poison) = insert_poison_among_good_rows(&pool, &ns, layout).await;
    let mut logs = Logs::new();
    let [flag, name] = layout.args();
    let mut relay = logs.start(&db, &redis.url(), &ns, &["--max-attempts", "3", flag, name]);

    wait_poison_dead_lettered_after_3_attempts(&pool).await;
    wait_drained_to(&pool, 0).await;

    let want = assert_dead_letters_are_the_poison_rows(&pool, &ns, layout, &poison).await;
    // Every good row arrived, once.
    let in_redis = queue_uuids(&ns, layout, "default").await;
    let t = tally(&good, &in_redis, &HashSet::new());
    t.assert_exactly_once();
    assert_eq!(in_redis.len(), good.len());

    // The relay never stopped: rows written now still flow.
    assert!(relay.running());
    insert_rows(&pool, 100, "later").await;
    wait_drained_to(&pool, 0).await;
    assert_eq!(layout.llen(&ns, "later").await, 100);

    // The operator fixes the key and requeues the dead letters: they arrive too.
    let mut con = ns.con().await;
    let _: () = redis::cmd("DEL")
        .arg(layout.queue_key(&ns, "poison"))
        .query_async(&mut con)
        .await
        .unwrap();
    let (code, out, err) = run_relay(
        &["dead-letter", "requeue", "--queue", "poison"],
        &[("DATABASE_URL", &db)],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), "requeued 30 rows");
    wait_drained_to(&pool, 0).await;
    let mut requeued = queue_uuids(&ns, layout, "poison").await;
    requeued.sort();
    assert_eq!(requeued, want);
    assert_eq!(dead_count(&pool).await, 0);

    assert!(relay.running());
    let (code, _) = relay.terminate(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0));
    let b = Batches::of(&log_lines(&logs.files()));
    assert_eq!(b.dead_lettered, 30, "{b:?}");
    assert_eq!(b.refused, 60 + 30, "{b:?}");
    let relayed = t.relayed + 100 + requeued.len();
    let duplicates = b.duplicates;
    println!("poison: duplicates by relay logs {}; {b:?}", b.duplicates);
    figures(
        &format!("poison_{}", layout.0),
        relayed,
        duplicates,
        t.lost.len(),
    );
}

/// A queue key that holds a string, and 30 poison rows among 2,970 good ones, spread over three
/// batches; the uuids of the good rows and of the poison rows.
async fn insert_poison_among_good_rows(
    pool: &PgPool,
    ns: &Namespace,
    layout: TestLayout,
) -> (HashSet<String>, Vec<String>) {
    let mut con = ns.con().await;
    let _: () = redis::cmd("SET")
        .arg(layout.queue_key(ns, "poison"))
        .arg("x")
        .query_async(&mut con)
        .await
        .unwrap();
    // 30 poison rows among 2,970 good ones, spread over three batches.
    sqlx::query(
        "INSERT INTO pending_jobs (queue, job_type, payload)
         SELECT CASE WHEN i % 100 = 0 THEN 'poison' ELSE 'default' END, 'Bulk',
                convert_to('[' || i || ']', 'UTF8')
         FROM generate_series(1, 3000) AS i",
    )
    .execute(pool)
    .await
    .unwrap();
    let good: HashSet<String> =
        sqlx::query_scalar("SELECT uuid::text FROM pending_jobs WHERE queue = 'default'")
            .fetch_all(pool)
            .await
            .unwrap()
            .into_iter()
            .collect();
    let poison: Vec<String> =
        sqlx::query_scalar("SELECT uuid::text FROM pending_jobs WHERE queue = 'poison'")
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(poison.len(), 30);
    (good, poison)
}

/// Each refusal counts an attempt, records the error and pushes available_at back; after the
/// third the 30 poison rows are dead letters.
async fn wait_poison_dead_lettered_after_3_attempts(pool: &PgPool) {
    // Each refusal counts an attempt, records the error and pushes available_at back
    // (1 s doubling, with jitter: attempt 1 waits 0.5-1 s, attempt 2 waits 1-2 s).
    for attempts in [1, 2] {
        let p = pool;
        wait_until(
            &format!("a poison row waiting after attempt {attempts}"),
            Duration::from_secs(30),
            || async move {
                sqlx::query_scalar::<_, bool>(
                    "SELECT EXISTS (SELECT 1 FROM pending_jobs
                     WHERE queue = 'poison' AND attempts = $1 AND available_at > now()
                       AND last_error LIKE '%WRONGTYPE%')",
                )
                .bind(attempts)
                .fetch_one(p)
                .await
                .unwrap()
            },
        )
        .await;
    }
    let p = pool;
    wait_until("30 dead letters", Duration::from_secs(60), || async move {
        dead_count(p).await == 30
    })
    .await;
}

/// The dead letters are exactly the poison rows, with 3 attempts and the WRONGTYPE error, and
/// the refused jobs left nothing in Redis; the sorted poison uuids.
async fn assert_dead_letters_are_the_poison_rows(
    pool: &PgPool,
    ns: &Namespace,
    layout: TestLayout,
    poison: &[String],
) -> Vec<String> {
    let mut con = ns.con().await;
    let dead: Vec<(String, String, i32, Option<String>)> = sqlx::query_as(
        "SELECT uuid::text, queue, attempts, last_error FROM pending_jobs_dead ORDER BY id",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    for (uuid, queue, attempts, last_error) in &dead {
        assert_eq!(queue, "poison");
        assert_eq!(*attempts, 3, "{uuid}");
        let e = last_error.as_deref().unwrap_or("");
        assert!(
            e.contains("WRONGTYPE") && e.contains(&layout.queue_key(ns, "poison")),
            "{e}"
        );
    }
    let mut dead_uuids: Vec<String> = dead.into_iter().map(|d| d.0).collect();
    dead_uuids.sort();
    let mut want = poison.to_vec();
    want.sort();
    assert_eq!(dead_uuids, want);
    // The refused jobs left nothing behind: the key is untouched and no marker was written.
    let v: String = redis::cmd("GET")
        .arg(layout.queue_key(ns, "poison"))
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(v, "x");
    for u in poison {
        // GET or SISMEMBER, not EXISTS: the test must not add to the EXISTS count the figures
        // rest on.
        assert!(
            !layout.is_marked(ns, u).await,
            "marker written for refused job {u}"
        );
    }
    want
}

/// A row that can never become a job (the table lost its CHECK constraints) is dead-lettered
/// at its first attempt, and the rows around it flow.
#[sqlx::test]
async fn invalid_rows_are_dead_lettered_at_once(pool: PgPool) {
    let redis = RedisServer::start();
    let ns = Namespace::on(&redis.url());
    let db = database_url_of(&pool).await;
    sqlx::query("ALTER TABLE pending_jobs DROP CONSTRAINT pending_jobs_queue_check")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO pending_jobs (queue, job_type, payload)
         SELECT CASE WHEN i % 50 = 0 THEN 'no spaces allowed' ELSE 'default' END, 'Bulk',
                convert_to('job-' || i, 'UTF8')
         FROM generate_series(1, 500) AS i",
    )
    .execute(&pool)
    .await
    .unwrap();
    let mut logs = Logs::new();
    let mut relay = logs.start(&db, &redis.url(), &ns, &["--max-attempts", "5"]);
    wait_drained_to(&pool, 0).await;
    let dead: Vec<(String, i32, Option<String>)> =
        sqlx::query_as("SELECT queue, attempts, last_error FROM pending_jobs_dead")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(dead.len(), 10);
    for (queue, attempts, last_error) in dead {
        assert_eq!(queue, "no spaces allowed");
        assert_eq!(attempts, 1, "dead-lettered at the first attempt");
        assert!(last_error
            .unwrap_or_default()
            .contains("invalid job: queue"));
    }
    assert_eq!(ns.llen("queue:default").await, 490);
    let (code, _) = relay.terminate(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0));
}

/// A dead letter as the test wrote it, every column requeue must keep.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
struct JobColumns {
    uuid: uuid::Uuid,
    queue: String,
    job_type: String,
    payload: Vec<u8>,
    parent_uuid: Option<uuid::Uuid>,
    predecessor_uuid: Option<uuid::Uuid>,
    dead_parent: bool,
    run_at: Option<chrono::DateTime<chrono::Utc>>,
    headers: serde_json::Value,
    options: serde_json::Value,
    created_at: chrono::DateTime<chrono::Utc>,
}

const JOB_COLUMNS: &str = "uuid, queue, job_type, payload, parent_uuid, predecessor_uuid, \
                           dead_parent, run_at, headers, options, created_at";

async fn admin(db: &str, args: &[&str]) -> (String, String) {
    let (code, out, err) = run_relay(args, &[("DATABASE_URL", db)]).await;
    assert_eq!(code, 0, "jobrelay {args:?}\nstdout: {out}\nstderr: {err}");
    (out, err)
}

/// `status --json`'s backlog (its Redis side, read from the shared server, taken out: these
/// tests are about the outbox).
async fn status_json(db: &str) -> serde_json::Value {
    let (out, _) = admin(db, &["status", "--json"]).await;
    assert_eq!(out.lines().count(), 1, "one object: {out}");
    let mut v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let side = v.as_object_mut().unwrap().remove("redis");
    assert!(side.is_some_and(|s| s["queues"].is_array()), "{out}");
    v
}

#[sqlx::test]
async fn status_and_dead_letter_commands_end_to_end(pool: PgPool) {
    use serde_json::json;
    let db = database_url_of(&pool).await;

    // Empty: the exact object of docs/cli.md, with null for the age.
    assert_eq!(
        status_json(&db).await,
        json!({"pending": 0, "oldest_pending_age_seconds": null, "dead": 0, "queues": {},
               "held_keys": {"keys": 0, "rows": 0, "oldest_age_seconds": null, "first": []}})
    );

    insert_pending_and_dead_rows(&pool).await;
    assert_status_counts_each_queue(&db).await;
    assert_dead_letter_list_filters(&db).await;
    assert_requeue_by_id_restores_the_job(&pool, &db).await;

    // requeue --queue, and a selection that matches nothing.
    let (out, _) = admin(&db, &["dead-letter", "requeue", "--queue", "alpha"]).await;
    assert_eq!(out.trim(), "requeued 2 rows");
    let (out, _) = admin(&db, &["dead-letter", "requeue", "--id", "12345"]).await;
    assert_eq!(out.trim(), "requeued 0 rows");
    let s = status_json(&db).await;
    assert_eq!(
        (s["pending"].clone(), s["dead"].clone()),
        (json!(8), json!(0))
    );

    // purge --id, --queue, --all.
    sqlx::query(
        "INSERT INTO pending_jobs_dead (id, uuid, queue, job_type)
         SELECT i, gen_random_uuid(), CASE WHEN i <= 2 THEN 'x' ELSE 'y' END, 'T'
         FROM generate_series(1, 5) AS i",
    )
    .execute(&pool)
    .await
    .unwrap();
    let (out, _) = admin(&db, &["dead-letter", "purge", "--id", "1,5"]).await;
    assert_eq!(out.trim(), "purged 2 rows");
    let (out, _) = admin(&db, &["dead-letter", "purge", "--queue", "x"]).await;
    assert_eq!(out.trim(), "purged 1 rows");
    let (out, _) = admin(&db, &["dead-letter", "purge", "--all"]).await;
    assert_eq!(out.trim(), "purged 2 rows");
    assert_eq!(dead_count(&pool).await, 0);
    assert_eq!(status_json(&db).await["dead"], json!(0));

    // A selection is required.
    let (code, _, err) = run_relay(&["dead-letter", "purge"], &[("DATABASE_URL", &db)]).await;
    assert_eq!(code, 2, "{err}");
}

/// Pending: alpha x3 (the oldest 100 s old), beta x2. Dead: alpha x2, gamma x1, every column set.
async fn insert_pending_and_dead_rows(pool: &PgPool) {
    insert_rows(pool, 3, "alpha").await;
    insert_rows(pool, 2, "beta").await;
    sqlx::query(
        "UPDATE pending_jobs SET created_at = now() - interval '100 seconds'
         WHERE id = (SELECT min(id) FROM pending_jobs)",
    )
    .execute(pool)
    .await
    .unwrap();
    // Dead: alpha x2, gamma x1, every column set.
    sqlx::query(
        "INSERT INTO pending_jobs_dead (id, uuid, queue, job_type, payload, parent_uuid,
             predecessor_uuid, dead_parent, run_at, headers, options, created_at, attempts,
             available_at, last_error, dead_at)
         SELECT 9000 + i, gen_random_uuid(), q, 'Type' || i, decode('00ff0' || i, 'hex'),
                gen_random_uuid(), gen_random_uuid(), i % 2 = 1,
                '2030-01-02 03:04:05.678901+00'::timestamptz + i * interval '1 hour',
                jsonb_build_object('traceparent', 'tp-' || i),
                jsonb_build_object('retry', i, 'tags', jsonb_build_array('t' || i)),
                '2020-05-06 07:08:09.123456+00'::timestamptz + i * interval '1 day',
                7, now() + interval '1 hour', 'redis refused job: WRONGTYPE ' || i, now()
         FROM (VALUES (1, 'alpha'), (2, 'alpha'), (3, 'gamma')) AS v(i, q)",
    )
    .execute(pool)
    .await
    .unwrap();
}

/// `status --json`: exactly its five keys, the counts, the oldest age, each queue and the held
/// ordering keys (none: these rows have no key); `status`.
async fn assert_status_counts_each_queue(db: &str) {
    use serde_json::json;
    let s = status_json(db).await;
    let keys: Vec<&str> = s.as_object().unwrap().keys().map(|k| k.as_str()).collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        [
            "dead",
            "held_keys",
            "oldest_pending_age_seconds",
            "pending",
            "queues"
        ]
    );
    assert_eq!(s["held_keys"]["keys"], json!(0));
    assert_eq!(s["pending"], json!(5));
    assert_eq!(s["dead"], json!(3));
    let age = s["oldest_pending_age_seconds"].as_f64().expect("a number");
    assert!((100.0..1000.0).contains(&age), "{age}");
    assert_eq!(
        s["queues"],
        json!({
            "alpha": {"pending": 3, "dead": 2},
            "beta": {"pending": 2, "dead": 0},
            "gamma": {"pending": 0, "dead": 1},
        })
    );
    let (text, _) = admin(db, &["status"]).await;
    assert!(text.starts_with("pending 5  oldest "), "{text}");
}

/// list: one JSON object per line, oldest id first; --queue and --limit filter.
async fn assert_dead_letter_list_filters(db: &str) {
    use serde_json::json;
    let (out, err) = admin(db, &["dead-letter", "list", "--json"]).await;
    let listed: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ids: Vec<i64> = listed.iter().map(|v| v["id"].as_i64().unwrap()).collect();
    assert_eq!(ids, [9001, 9002, 9003]);
    assert!(err.contains("3 dead-lettered rows listed"), "{err}");
    let first = listed[0].as_object().unwrap();
    let mut fields: Vec<&str> = first.keys().map(|k| k.as_str()).collect();
    fields.sort();
    assert_eq!(
        fields,
        [
            "attempts",
            "created_at",
            "dead_at",
            "id",
            "job_type",
            "last_error",
            "payload",
            "payload_base64",
            "payload_bytes",
            "payload_truncated",
            "queue",
            "uuid"
        ]
    );
    assert_eq!(listed[0]["attempts"], json!(7));
    assert_eq!(
        listed[0]["last_error"],
        json!("redis refused job: WRONGTYPE 1")
    );
    let (out, err) = admin(db, &["dead-letter", "list", "--queue", "gamma", "--json"]).await;
    assert_eq!(out.lines().count(), 1);
    assert!(err.contains("1 dead-lettered rows listed"), "{err}");
    let (out, _) = admin(db, &["dead-letter", "list", "--limit", "2"]).await;
    assert_eq!(out.lines().count(), 2);
    assert!(out.starts_with("9001\t"), "{out}");
}

/// requeue --id: the job comes back whole, with attempts, available_at and last_error reset.
async fn assert_requeue_by_id_restores_the_job(pool: &PgPool, db: &str) {
    use serde_json::json;
    let before: JobColumns = sqlx::query_as(&format!(
        "SELECT {JOB_COLUMNS} FROM pending_jobs_dead WHERE id = 9003"
    ))
    .fetch_one(pool)
    .await
    .unwrap();
    let (out, _) = admin(db, &["dead-letter", "requeue", "--id", "9003"]).await;
    assert_eq!(out.trim(), "requeued 1 rows");
    let after: JobColumns = sqlx::query_as(&format!(
        "SELECT {JOB_COLUMNS} FROM pending_jobs WHERE uuid = $1"
    ))
    .bind(before.uuid)
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(after, before);
    let (attempts, due, last_error): (i32, bool, Option<String>) = sqlx::query_as(
        "SELECT attempts, available_at <= now(), last_error FROM pending_jobs WHERE uuid = $1",
    )
    .bind(before.uuid)
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!((attempts, due, last_error), (0, true, None));
    assert_eq!(
        status_json(db).await["queues"]["gamma"],
        json!({"pending": 1, "dead": 0})
    );
}

per_layout!(a_row_with_an_unknown_option_is_dead_lettered_naming_it_and_the_next_flows);
/// A row whose `options` name one the layout does not carry is dead-lettered at its first
/// attempt, `last_error` naming the option and the layout; the rows before and after it flow.
async fn a_row_with_an_unknown_option_is_dead_lettered_naming_it_and_the_next_flows(
    pool: PgPool,
    layout: TestLayout,
) {
    let redis = RedisServer::start();
    let ns = Namespace::on(&redis.url());
    let db = database_url_of(&pool).await;
    let option = layout.refused_option();
    let (bad,): (uuid::Uuid,) = sqlx::query_as(
        "WITH rows AS (
             INSERT INTO pending_jobs (queue, job_type, payload, options)
             SELECT 'default', 'Bulk', convert_to('[' || i || ']', 'UTF8'),
                    CASE WHEN i = 2 THEN jsonb_build_object($1::text, 1) ELSE '{}' END
             FROM generate_series(1, 3) AS i
             RETURNING uuid, options)
         SELECT uuid FROM rows WHERE options <> '{}'",
    )
    .bind(option)
    .fetch_one(&pool)
    .await
    .unwrap();
    let mut logs = Logs::new();
    let [flag, name] = layout.args();
    let mut relay = logs.start(&db, &redis.url(), &ns, &[flag, name]);
    wait_drained_to(&pool, 0).await;
    let dead: Vec<(uuid::Uuid, i32, Option<String>)> =
        sqlx::query_as("SELECT uuid, attempts, last_error FROM pending_jobs_dead")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    let (uuid, attempts, last_error) = &dead[0];
    assert_eq!(
        (*uuid, *attempts),
        (bad, 1),
        "dead-lettered at the first attempt"
    );
    let last_error = last_error.as_deref().unwrap_or_default();
    let layout_name = layout.0.as_str();
    assert!(
        last_error.starts_with(&format!(
            "job {bad} does not fit the {layout_name} layout: "
        )) && last_error.contains(&format!("option \"{option}\""))
            && last_error.contains(&format!("the {layout_name} layout;")),
        "{last_error}"
    );
    assert_eq!(layout.llen(&ns, "default").await, 2, "the others flow");
    let (code, _) = relay.terminate(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0));
}

/// A row refused for its payload (the sidekiq layout takes a JSON array of arguments):
/// dead-lettered at its first attempt, `dead-letter list` shows the payload as the layout
/// reads it (text and JSON, escaped to stay on its line); requeued unfixed it is dead-lettered
/// again after one attempt (docs/runbook.md#jobrelaydeadlettersgrowing), fixed with UPDATE and
/// requeued it runs.
#[sqlx::test]
async fn a_row_refused_for_its_payload_is_listed_with_it_fixed_and_requeued(pool: PgPool) {
    let ns = Namespace::new();
    let db = database_url_of(&pool).await;
    let env = [
        ("DATABASE_URL", db.as_str()),
        ("REDIS_URL", ns.url.as_str()),
        ("JOBRELAY_NAMESPACE", ns.prefix.as_str()),
        ("JOBRELAY_LAYOUT", "sidekiq"),
    ];
    // The sweep's summary line (it exits 1 when it left rows undelivered).
    let sweep = || async {
        let (_, out, err) = run_relay(&["--sweep", "--older-than", "0s"], &env).await;
        assert!(out.starts_with("sweep: claimed=1 "), "{out}{err}");
        out
    };
    sqlx::query(
        "INSERT INTO pending_jobs (queue, job_type, payload)
         VALUES ('billing', 'Charge', convert_to(E'invoice\t42\n', 'UTF8'))",
    )
    .execute(&pool)
    .await
    .unwrap();
    let dead = || async {
        sqlx::query_as::<_, (i64, i32, String)>(
            "SELECT id, attempts, last_error FROM pending_jobs_dead",
        )
        .fetch_all(&pool)
        .await
        .unwrap()
    };
    for round in ["first", "requeued unfixed"] {
        assert!(sweep().await.trim_end().ends_with(" dead_lettered=1"));
        let rows = dead().await;
        assert_eq!(rows.len(), 1, "{round}: {rows:?}");
        assert_eq!(rows[0].1, 1, "{round}: dead-lettered after one attempt");
        assert!(
            rows[0].2.contains("does not fit the sidekiq layout"),
            "{rows:?}"
        );
        if round == "first" {
            let (code, out, err) = run_relay(&["dead-letter", "requeue", "--all"], &env).await;
            assert_eq!((code, out.trim()), (0, "requeued 1 rows"), "{err}");
        }
    }
    let id = dead().await[0].0.to_string();

    let (code, out, err) = run_relay(&["dead-letter", "list"], &env).await;
    assert_eq!(code, 0, "{err}");
    let fields: Vec<&str> = out.trim_end_matches('\n').split('\t').collect();
    assert_eq!(fields.len(), 8, "one line, 8 fields: {out:?}");
    assert_eq!(fields[6], r"payload=invoice\t42\n", "{out:?}");
    let (code, out, err) = run_relay(&["dead-letter", "list", "--json"], &env).await;
    assert_eq!(code, 0, "{err}");
    let row: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(row["payload"], "invoice\t42\n", "{row}");
    assert_eq!(row["payload_bytes"], 11, "{row}");
    assert_eq!(row["payload_truncated"], false, "{row}");

    sqlx::query("UPDATE pending_jobs_dead SET payload = convert_to('[42]', 'UTF8') WHERE id = $1")
        .bind(dead().await[0].0)
        .execute(&pool)
        .await
        .unwrap();
    let (code, out, err) = run_relay(&["dead-letter", "list"], &env).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.split('\t').nth(6), Some("payload=[42]"), "{out}");
    let (code, out, err) = run_relay(&["dead-letter", "requeue", "--id", &id], &env).await;
    assert_eq!((code, out.trim()), (0, "requeued 1 rows"), "{err}");
    assert!(sweep().await.contains(" queued=1 "));
    assert!(dead().await.is_empty());
    let jobs: Vec<String> = ns.lrange("queue:billing").await;
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    let job: serde_json::Value = serde_json::from_str(&jobs[0]).unwrap();
    assert_eq!(
        (job["class"].as_str(), &job["args"]),
        (Some("Charge"), &serde_json::json!([42]))
    );
}

/// The log line of a batch's dead letters names each row, its uuid, id and reason, not only
/// the first one's error; at most 10 of them, then how many more (docs/metrics.md#logs).
#[sqlx::test]
async fn the_dead_letter_log_line_names_each_row_and_its_reason(pool: PgPool) {
    let ns = Namespace::new();
    let db = database_url_of(&pool).await;
    let env = [
        ("DATABASE_URL", db.as_str()),
        ("REDIS_URL", ns.url.as_str()),
        ("JOBRELAY_NAMESPACE", ns.prefix.as_str()),
        ("JOBRELAY_LAYOUT", "sidekiq"),
    ];
    // 12 rows the sidekiq layout refuses, for two reasons in turn.
    sqlx::query(
        "INSERT INTO pending_jobs (queue, job_type, payload)
         SELECT 'billing', 'Charge',
                convert_to(CASE WHEN i % 2 = 0 THEN '{\"a\": 1}' ELSE 'not json' END, 'UTF8')
         FROM generate_series(1, 12) AS i",
    )
    .execute(&pool)
    .await
    .unwrap();
    let rows: Vec<(i64, uuid::Uuid)> =
        sqlx::query_as("SELECT id, uuid FROM pending_jobs ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    let (_, out, err) = run_relay(
        &["--sweep", "--older-than", "0s", "--log-format", "json"],
        &env,
    )
    .await;
    assert!(out.contains(" dead_lettered=12"), "{out}{err}");
    let events: Vec<serde_json::Value> = err
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(|e: &serde_json::Value| e["message"] == "rows moved to the dead-letter table")
        .collect();
    assert_eq!(events.len(), 1, "{err}");
    assert_eq!(events[0]["rows"], 12, "{err}");
    let jobs = events[0]["jobs"]
        .as_str()
        .unwrap_or_else(|| panic!("{err}"));
    let entries: Vec<&str> = jobs.split("; ").collect();
    assert_eq!(entries.len(), 11, "{jobs}");
    for (i, (id, uuid)) in rows.iter().take(10).enumerate() {
        let entry = entries[i];
        assert!(entry.starts_with(&format!("{uuid} (id {id}): ")), "{entry}");
        let reason = if i % 2 == 1 {
            "an object, not an array"
        } else {
            "JSON"
        };
        assert!(
            entry.contains("does not fit the sidekiq layout") && entry.contains(reason),
            "{i}: {entry}"
        );
    }
    assert_eq!(entries[10], "and 2 more", "{jobs}");
}
