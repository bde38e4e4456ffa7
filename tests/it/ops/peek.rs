//! `jobrelay peek` (docs/cli.md#jobrelay-peek): rows relayed for real, then looked at in every
//! layout, a queue's jobs next-first, the scheduled ones earliest-first, the jobs held for a
//! job; decoded, as text and JSON, and nothing in Redis moved.

use super::*;
use jobrelay::LayoutKind;
use serde_json::{json, Value};

/// The relay's and `peek`'s environment for `layout` under `ns`.
fn env_of<'a>(ns: &'a Namespace, layout: TestLayout, db: &'a str) -> [(&'a str, &'a str); 4] {
    [
        ("DATABASE_URL", db),
        ("REDIS_URL", &ns.url),
        ("JOBRELAY_NAMESPACE", &ns.prefix),
        ("JOBRELAY_LAYOUT", layout.0.as_str()),
    ]
}

/// Relays every claimable row once.
async fn sweep(env: &[(&str, &str)]) {
    let (code, out, err) = run_relay(&["--sweep", "--older-than", "0s"], env).await;
    assert_eq!(code, 0, "{out}\n{err}");
}

/// `peek --json ...`: the exit code, one JSON object per line of stdout, stderr.
async fn peek_json(args: &[&str], env: &[(&str, &str)]) -> (i32, Vec<Value>, String) {
    let args = [&["peek", "--json"][..], args].concat();
    let (code, out, err) = run_relay(&args, env).await;
    let lines = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (code, lines, err)
}

/// What a job decoded by `peek` says its arguments are (rows of `insert_rows`: `[i]`).
fn args_of(layout: TestLayout, job: &Value) -> Value {
    match layout.0 {
        LayoutKind::Jobrelay | LayoutKind::Conveyor => {
            serde_json::from_str(job["payload"].as_str().expect("a text payload")).unwrap()
        }
        LayoutKind::Sidekiq | LayoutKind::Celery => job["args"].clone(),
        LayoutKind::Bullmq => job["data"].clone(),
        // The JSON serializer's [func_name, instance, args, kwargs].
        LayoutKind::Rq => job["data"][2].clone(),
    }
}

/// Every key of `ns` with its `DUMP`: what a read-only command must leave unchanged.
async fn snapshot(ns: &Namespace) -> Vec<(String, Vec<u8>)> {
    let mut con = ns.con().await;
    let mut out = Vec::new();
    for key in ns.keys().await {
        let dump: Vec<u8> = redis::cmd("DUMP")
            .arg(ns.key(&key))
            .query_async(&mut con)
            .await
            .unwrap();
        out.push((key, dump));
    }
    out
}

async fn uuids_in_id_order(pool: &PgPool) -> Vec<String> {
    let ids: Vec<uuid::Uuid> = sqlx::query_scalar("SELECT uuid FROM pending_jobs ORDER BY id")
        .fetch_all(pool)
        .await
        .unwrap();
    ids.iter().map(|u| u.to_string()).collect()
}

/// Three jobs relayed to a queue: `peek --queue` shows them next-to-run first, decoded
/// (`--limit` cuts), in text and JSON, and every key is as it was.
async fn peek_shows_a_queue_next_first_and_moves_nothing(pool: PgPool, layout: TestLayout) {
    let (ns, db) = (Namespace::new(), database_url_of(&pool).await);
    let env = env_of(&ns, layout, &db);
    insert_rows(&pool, 3, "peekq").await;
    let uuids = uuids_in_id_order(&pool).await;
    sweep(&env).await;
    let before = snapshot(&ns).await;

    let (code, jobs, err) = peek_json(&["--queue", "peekq", "--limit", "2"], &env).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(jobs.len(), 2, "{jobs:?}");
    for (i, job) in jobs.iter().enumerate() {
        assert_eq!(job["position"], i + 1, "{job}");
        assert_eq!(job["uuid"], uuids[i], "{job}");
        assert_eq!(job["queue"], "peekq", "{job}");
        assert_eq!(job["key"], layout.queue_key(&ns, "peekq"), "{job}");
        assert_eq!(args_of(layout, &job["job"]), json!([i + 1]), "{job}");
    }
    let key = layout.queue_key(&ns, "peekq");
    assert_eq!(err.trim(), format!("2 of 3 jobs in {key} shown"));

    let (code, text, _) = run_relay(&["peek", "--queue", "peekq"], &env).await;
    assert_eq!(code, 0);
    let blocks: Vec<&str> = text
        .split_inclusive('\n')
        .filter(|l| l.starts_with('#'))
        .collect();
    assert_eq!(blocks.len(), 3, "{text}");
    for (i, header) in blocks.iter().enumerate() {
        assert_eq!(header.trim(), format!("#{} {key} job {}", i + 1, uuids[i]));
    }
    assert_eq!(snapshot(&ns).await, before, "peek wrote to Redis");
}

per_layout!(peek_shows_a_queue_next_first_and_moves_nothing);

#[sqlx::test]
async fn peek_shows_a_conveyor_queue(pool: PgPool) {
    peek_shows_a_queue_next_first_and_moves_nothing(pool, TestLayout(LayoutKind::Conveyor)).await
}

/// Jobs relayed with a future `run_at`: `peek --scheduled` shows them earliest first with when
/// they are due, `--queue` picks one queue's out of a shared set; a layout whose scheduled
/// jobs live per queue wants `--queue`, and celery has none (exit 2, one line).
async fn peek_shows_scheduled_jobs_earliest_first(pool: PgPool, layout: TestLayout) {
    let (ns, db) = (Namespace::new(), database_url_of(&pool).await);
    let env = env_of(&ns, layout, &db);
    let mut due = Vec::new();
    for (queue, minutes) in [("peekq", 120), ("peekq", 60), ("other", 30)] {
        due.push(
            sqlx::query_as::<_, (String, chrono::DateTime<chrono::Utc>)>(
                "INSERT INTO pending_jobs (queue, job_type, payload, run_at)
                 VALUES ($1, 'Later', convert_to('[0]', 'UTF8'), now() + make_interval(mins => $2))
                 RETURNING uuid::text, run_at",
            )
            .bind(queue)
            .bind(minutes)
            .fetch_one(&pool)
            .await
            .unwrap(),
        );
    }
    sweep(&env).await;
    let (code, jobs, err) = peek_json(&["--scheduled", "--queue", "peekq"], &env).await;
    if layout.0 == LayoutKind::Celery {
        assert_eq!((code, jobs.len()), (2, 0), "{err}");
        assert!(
            err.starts_with("jobrelay: the celery layout has no scheduled set"),
            "{err}"
        );
        return;
    }
    assert_eq!(code, 0, "{err}");
    let shared = !matches!(layout.0, LayoutKind::Bullmq | LayoutKind::Rq);
    let summary = if shared {
        "2 jobs of queue peekq shown (3 in "
    } else {
        "2 of 2 jobs in "
    };
    assert!(err.starts_with(summary), "{err}");
    let uuids: Vec<&Value> = jobs.iter().map(|j| &j["uuid"]).collect();
    assert_eq!(uuids, [&json!(due[1].0), &json!(due[0].0)], "{jobs:?}");
    for (job, (_, run_at)) in jobs.iter().zip([&due[1], &due[0]]) {
        let shown: chrono::DateTime<chrono::Utc> = job["due"].as_str().unwrap().parse().unwrap();
        // Whole seconds in the conveyor and rq layouts, milliseconds in bullmq's.
        assert!((shown - *run_at).num_milliseconds().abs() <= 1000, "{job}");
        assert_eq!(job["queue"], "peekq", "{job}");
    }
    let (code, all, err) = peek_json(&["--scheduled"], &env).await;
    if !shared {
        assert_eq!(code, 2, "{err}");
        assert!(err.contains("--scheduled needs --queue"), "{err}");
    } else {
        assert_eq!(code, 0, "{err}");
        let queues: Vec<&Value> = all.iter().map(|j| &j["queue"]).collect();
        assert_eq!(queues, [&json!("other"), &json!("peekq"), &json!("peekq")]);
        assert!(err.starts_with("3 of 3 jobs in "), "{err}");
    }
}

per_layout!(peek_shows_scheduled_jobs_earliest_first);

#[sqlx::test]
async fn peek_shows_conveyors_scheduled_jobs(pool: PgPool) {
    peek_shows_scheduled_jobs_earliest_first(pool, TestLayout(LayoutKind::Conveyor)).await
}

/// In the layouts with flows, the children and heirs held for a job; elsewhere a usage error.
/// A list element that is not a job is shown as such, not fatal.
#[sqlx::test]
async fn peek_shows_the_jobs_held_for_a_job(pool: PgPool) {
    let db = database_url_of(&pool).await;
    for kind in [LayoutKind::Jobrelay, LayoutKind::Conveyor] {
        let (ns, layout) = (Namespace::new(), TestLayout(kind));
        let env = env_of(&ns, layout, &db);
        let parent = uuid::Uuid::new_v4();
        sqlx::query(
            "INSERT INTO pending_jobs (queue, job_type, payload, parent_uuid, predecessor_uuid)
             VALUES ('q', 'Child', '\\x01', $1, NULL), ('q', 'Heir', '\\xff', NULL, $1)",
        )
        .bind(parent)
        .execute(&pool)
        .await
        .unwrap();
        sweep(&env).await;
        let p = parent.to_string();
        let (code, children, err) = peek_json(&["--children-of", &p], &env).await;
        assert_eq!((code, children.len()), (0, 1), "{err}");
        let type_field = if kind == LayoutKind::Jobrelay {
            "job_type"
        } else {
            "type"
        };
        assert_eq!(children[0]["job"][type_field], "Child", "{children:?}");
        assert_eq!(children[0]["job"]["parent_uuid"], p);
        let (code, heirs, err) = peek_json(&["--on-complete-of", &p], &env).await;
        assert_eq!((code, heirs.len()), (0, 1), "{err}");
        assert_eq!(heirs[0]["job"]["payload_base64"], "/w==", "{heirs:?}");

        let mut con = ns.con().await;
        let junk = layout.queue_key(&ns, "junk");
        let _: () = redis::cmd("LPUSH")
            .arg(&junk)
            .arg(b"\xff\xff".as_slice())
            .query_async(&mut con)
            .await
            .unwrap();
        let (code, jobs, err) = peek_json(&["--queue", "junk"], &env).await;
        assert_eq!((code, jobs.len()), (0, 1), "{err}");
        assert!(jobs[0]["job"]["undecodable"].is_string(), "{jobs:?}");
    }
    let ns = Namespace::new();
    let env = env_of(&ns, TestLayout(LayoutKind::Sidekiq), &db);
    let u = uuid::Uuid::new_v4().to_string();
    let (code, _, err) = peek_json(&["--children-of", &u], &env).await;
    assert_eq!(code, 2, "{err}");
    assert_eq!(
        err.trim(),
        "jobrelay: the sidekiq layout has no flows: no job holds children or heirs"
    );
}

/// Jobs of the sidekiq layout peeked without `--layout` (the jobrelay layout reads the same
/// `queue:<q>` key): not a block of "undecodable" protobuf errors but one line naming the
/// `--layout` to pass, exit 2; with it, the jobs. A key holding no layout's jobs is still shown
/// entry by entry as undecodable.
#[sqlx::test]
async fn peek_names_the_layout_of_another_layouts_jobs(pool: PgPool) {
    let (ns, db) = (Namespace::new(), database_url_of(&pool).await);
    let sidekiq = env_of(&ns, TestLayout(LayoutKind::Sidekiq), &db);
    insert_rows(&pool, 2, "other").await;
    sweep(&sidekiq).await;
    let default = [sidekiq[0], sidekiq[1], sidekiq[2]];
    let key = ns.key("queue:other");

    let (code, out, err) = run_relay(&["peek", "--queue", "other"], &default).await;
    assert_eq!((code, out.as_str()), (2, ""), "{out}{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with(&format!(
            "jobrelay: the jobs in {key} are not the jobrelay layout's (not a jobrelay.v1.Job: "
        )) && err
            .trim_end()
            .ends_with("; they decode as the sidekiq layout's: pass --layout sidekiq"),
        "{err}"
    );
    let (code, jobs, err) = peek_json(&["--queue", "other", "--layout", "sidekiq"], &default).await;
    assert_eq!((code, jobs.len()), (0, 2), "{err}");

    let mut con = ns.con().await;
    let _: () = redis::cmd("LPUSH")
        .arg(ns.key("queue:junk"))
        .arg(b"\x0f\xff".as_slice())
        .query_async(&mut con)
        .await
        .unwrap();
    let (code, jobs, err) = peek_json(&["--queue", "junk"], &default).await;
    assert_eq!((code, jobs.len()), (0, 1), "{err}");
    assert!(jobs[0]["job"]["undecodable"].is_string(), "{jobs:?}");
}
