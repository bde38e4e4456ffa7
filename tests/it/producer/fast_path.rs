//! The fast path: push and delete without a relay, Redis down, racing a relay, per-job refusals,
//! a custom table, the conveyor layout.

use super::*;

/// With no relay running, the fast path delivers committed jobs and deletes their
/// rows; the bytes in Redis are those the relay would write (the row's created_at).
#[sqlx::test]
async fn fast_path_pushes_and_deletes_without_a_relay(pool: PgPool) {
    let ns = Namespace::new();
    let mut jobs = producer(&ns).pending();
    let parent = Uuid::new_v4();
    let mut tx = pool.begin().await.unwrap();
    let q = jobs
        .add(JobBuilder::new("default", "Now").payload(b"p".to_vec()))
        .unwrap();
    let s = jobs
        .add(JobBuilder::new("default", "Later").delay(Duration::from_secs(600)))
        .unwrap();
    let c = jobs
        .add(JobBuilder::new("default", "Child").parent(parent))
        .unwrap();
    let d = jobs
        .add(
            JobBuilder::new("other", "Orphan")
                .parent(parent)
                .dead_parent(true),
        )
        .unwrap();
    jobs.create_pending(&mut tx).await.unwrap();
    tx.commit().await.unwrap();
    let created: Vec<(Uuid, DateTime<Utc>)> =
        sqlx::query_as("SELECT uuid, created_at FROM pending_jobs ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();

    let mut con = ns.con().await;
    let report = jobs.push_and_delete(&mut con, &pool).await.unwrap();
    assert_eq!(
        report.pushed,
        vec![
            (q, Outcome::Queued),
            (s, Outcome::Scheduled),
            (c, Outcome::Children),
            (d, Outcome::Queued)
        ]
    );
    assert!(report.refused.is_empty() && report.skipped.is_empty());
    assert_eq!(report.deleted, 4);
    assert_eq!(pending_count(&pool).await, 0);

    assert_eq!(uuids_of(&ns.list_jobs("queue:default").await), vec![q]);
    assert_eq!(uuids_of(&ns.list_jobs("queue:other").await), vec![d]);
    assert_eq!(ns.scheduled().await.len(), 1);
    assert_eq!(
        uuids_of(&ns.list_jobs(&format!("jobs:{parent}:children")).await),
        vec![c]
    );
    assert_eq!(ns.marker_count().await, 4);
    for (uuid, created_at) in created {
        let raw: Vec<u8> = redis::cmd("GET")
            .arg(ns.key(&format!("jobs:{uuid}")))
            .query_async(&mut con)
            .await
            .unwrap();
        let job = decode(&raw);
        let ts = job.created_at.unwrap();
        assert_eq!(ts.seconds, created_at.timestamp());
        assert_eq!(ts.nanos as u32, created_at.timestamp_subsec_nanos());
    }

    // Again: nothing to do, nothing pushed twice.
    let report = jobs.push_and_delete(&mut con, &pool).await.unwrap();
    assert!(report.pushed.is_empty() && report.deleted == 0);
    assert_eq!(ns.llen("queue:default").await, 1);
}

/// Redis down during the fast path: an error that says the rows stay, the rows
/// stay, and a relay started later delivers each job exactly once.
#[sqlx::test]
async fn fast_path_with_redis_down_leaves_rows_for_the_relay(pool: PgPool) {
    let ns = Namespace::new();
    let mut server = RedisServer::start();
    let mut down = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    server.kill();

    let producer = producer(&ns).push_timeout(Duration::from_secs(2));
    let mut jobs = producer.pending();
    let mut tx = pool.begin().await.unwrap();
    let uuids = jobs
        .add_all((0..50).map(|i| JobBuilder::new("default", "Survive").json(&i)))
        .unwrap();
    jobs.create_pending(&mut tx).await.unwrap();
    tx.commit().await.unwrap();

    let e = jobs.push_and_delete(&mut down, &pool).await.unwrap_err();
    assert_eq!(e.stage, Stage::Push);
    assert_eq!(e.class(), ErrorClass::Transient);
    assert_eq!(e.rows_left.len(), 50);
    let msg = e.to_string();
    assert!(
        msg.contains("50 pending row(s) left for the relay"),
        "{msg}"
    );
    assert_eq!(pending_count(&pool).await, 50, "the rows stay");

    // The separate-steps API fails the same way, and deletes nothing it did not push.
    let e = jobs.push(&mut down).await.unwrap_err();
    assert_eq!(e.stage, Stage::Push);
    assert_eq!(jobs.delete_pending(&pool).await.unwrap(), 0);
    assert_eq!(pending_count(&pool).await, 50);

    let (code, out) = sweep(&pool, &ns, &[]).await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(pending_count(&pool).await, 0);
    let delivered = uuids_of(&ns.list_jobs("queue:default").await);
    assert_eq!(delivered, uuids, "each job once, in order");

    // A fast path retried now finds nothing pending and pushes nothing.
    let mut up = ns.con().await;
    let report = jobs.push_and_delete(&mut up, &pool).await.unwrap();
    assert!(report.pushed.is_empty());
    assert_eq!(report.skipped.len(), 50);
    assert_eq!(ns.llen("queue:default").await, 50);
}

/// The fast path racing a running relay daemon (woken by NOTIFY at each commit,
/// polling every 10 ms) on the same rows: each job exactly once in Redis. Even rounds use
/// `push_and_delete` (which skips the rows the relay holds), odd rounds `push` then
/// `delete_pending` (which push regardless, so the dedup marker settles the race).
#[sqlx::test]
async fn fast_path_racing_a_running_relay_delivers_each_job_once(pool: PgPool) {
    const ROUNDS: usize = 20;
    const PER_ROUND: usize = 200;
    let ns = Namespace::new();
    let db = database_url_of(&pool).await;
    let mut relay = RelayChild::start(
        &db,
        &ns.url,
        &ns.prefix,
        &[
            "--poll-interval",
            "10ms",
            "--workers",
            "2",
            "--batch-size",
            "50",
        ],
    );
    let producer = producer(&ns);
    let mut con = ns.con().await;
    let mut all = Vec::with_capacity(ROUNDS * PER_ROUND);
    let (mut by_fast_path, mut duplicates, mut skipped) = (0, 0, 0);
    for round in 0..ROUNDS {
        let mut jobs = producer.pending();
        let mut tx = pool.begin().await.unwrap();
        all.extend(
            jobs.add_all(
                (0..PER_ROUND)
                    .map(|i| JobBuilder::new("race", "Race").json(&serde_json::json!([round, i]))),
            )
            .unwrap(),
        );
        jobs.create_pending(&mut tx).await.unwrap();
        tx.commit().await.unwrap();
        // Odd rounds use the separate steps, which push whatever the relay is doing: there the
        // dedup marker is what keeps each job single.
        let report = if round % 2 == 0 {
            jobs.push_and_delete(&mut con, &pool).await.unwrap()
        } else {
            let report = jobs.push(&mut con).await.unwrap();
            jobs.delete_pending(&pool).await.unwrap();
            report
        };
        assert!(report.refused.is_empty(), "{:?}", report.refused);
        by_fast_path += report.count(Outcome::Queued);
        duplicates += report.count(Outcome::Duplicate);
        skipped += report.skipped.len();
        assert_eq!(report.pushed.len() + report.skipped.len(), PER_ROUND);
    }
    let total = ROUNDS * PER_ROUND;
    wait_until("every row relayed", DEADLINE, || async {
        pending_count(&pool).await == 0
    })
    .await;
    wait_until("every job in the queue", DEADLINE, || async {
        ns.llen("queue:race").await >= total
    })
    .await;
    relay.signal("TERM");
    assert_eq!(relay.wait(Duration::from_secs(30)).await, Some(0));

    let delivered = uuids_of(&ns.list_jobs("queue:race").await);
    assert_eq!(delivered.len(), total, "no job twice");
    let unique: HashSet<Uuid> = delivered.iter().copied().collect();
    assert_eq!(unique, all.iter().copied().collect::<HashSet<_>>());
    assert_eq!(ns.marker_count().await, total);
    println!(
        "race: {by_fast_path} jobs queued by the fast path ({duplicates} duplicates), \
         {skipped} left to the relay"
    );
}

/// A job the script refuses keeps its row (for the relay); the others are pushed and deleted.
#[sqlx::test]
async fn refused_jobs_keep_their_rows_and_the_others_are_deleted(pool: PgPool) {
    let ns = Namespace::new();
    let mut con = ns.con().await;
    let _: () = redis::cmd("SET")
        .arg(ns.key("queue:broken"))
        .arg("a string, not a list")
        .query_async(&mut con)
        .await
        .unwrap();
    let mut jobs = producer(&ns).pending();
    let mut tx = pool.begin().await.unwrap();
    let a = jobs.add(JobBuilder::new("default", "A")).unwrap();
    let b = jobs.add(JobBuilder::new("broken", "B")).unwrap();
    let c = jobs.add(JobBuilder::new("default", "C")).unwrap();
    jobs.create_pending(&mut tx).await.unwrap();
    tx.commit().await.unwrap();

    let report = jobs.push_and_delete(&mut con, &pool).await.unwrap();
    assert_eq!(
        report.pushed,
        vec![(a, Outcome::Queued), (c, Outcome::Queued)]
    );
    assert_eq!(report.refused.len(), 1);
    let (uuid, e) = &report.refused[0];
    assert_eq!(*uuid, b);
    assert_eq!(e.class(), ErrorClass::PerJob);
    assert!(e.to_string().contains("WRONGTYPE"), "{e}");
    assert_eq!(report.deleted, 2);
    let left: Vec<(Uuid, i32)> = sqlx::query_as("SELECT uuid, attempts FROM pending_jobs")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(left, vec![(b, 0)], "only the refused row stays, untouched");
    assert_eq!(
        jobs.rows().iter().map(|r| r.uuid).collect::<Vec<_>>(),
        vec![b]
    );

    // The relay takes over: it counts the refusal against the row ...
    let (_, out) = sweep(&pool, &ns, &[]).await;
    let attempts: i32 = sqlx::query_scalar("SELECT attempts FROM pending_jobs")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(attempts, 1, "{out}");
    // ... and delivers it once the key is fixed.
    let _: () = redis::cmd("DEL")
        .arg(ns.key("queue:broken"))
        .query_async(&mut con)
        .await
        .unwrap();
    sqlx::query("UPDATE pending_jobs SET available_at = now()")
        .execute(&pool)
        .await
        .unwrap();
    let (code, out) = sweep(&pool, &ns, &[]).await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(uuids_of(&ns.list_jobs("queue:broken").await), vec![b]);
    assert_eq!(pending_count(&pool).await, 0);
}

/// The pattern's separate steps: `push`, then `delete_pending` deletes only what was pushed.
#[sqlx::test]
async fn push_then_delete_pending_deletes_only_pushed_rows(pool: PgPool) {
    let ns = Namespace::new();
    let mut con = ns.con().await;
    let _: () = redis::cmd("SET")
        .arg(ns.key("queue:broken"))
        .arg("x")
        .query_async(&mut con)
        .await
        .unwrap();
    let mut jobs = producer(&ns).pending();
    let mut tx = pool.begin().await.unwrap();
    jobs.add(JobBuilder::new("default", "A")).unwrap();
    let b = jobs.add(JobBuilder::new("broken", "B")).unwrap();
    jobs.create_pending(&mut tx).await.unwrap();
    tx.commit().await.unwrap();

    assert_eq!(
        jobs.delete_pending(&pool).await.unwrap(),
        0,
        "nothing pushed yet"
    );
    let report = jobs.push(&mut con).await.unwrap();
    assert_eq!(report.pushed.len(), 1);
    assert_eq!(report.refused.len(), 1);
    let mut conn = pool.acquire().await.unwrap();
    assert_eq!(jobs.delete_pending(&mut *conn).await.unwrap(), 1);
    let left: Vec<Uuid> = sqlx::query_scalar("SELECT uuid FROM pending_jobs")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(left, vec![b]);
    assert_eq!(ns.llen("queue:default").await, 1);
    // A second push retries only the refused job.
    let report = jobs.push(&mut con).await.unwrap();
    assert!(report.pushed.is_empty() && report.refused.len() == 1);
}

/// `--table`: the producer writes to another outbox, and the relay and the fast path work on it.
#[sqlx::test]
async fn a_custom_table(pool: PgPool) {
    let ns = Namespace::new();
    sqlx::query("SELECT jobrelay_create_outbox('billing_jobs')")
        .execute(&pool)
        .await
        .unwrap();
    let producer = producer(&ns).table(TableName::parse("billing_jobs").unwrap());
    let mut con = ns.con().await;

    let mut fast = producer.pending();
    let mut tx = pool.begin().await.unwrap();
    let a = fast.add(JobBuilder::new("billing", "Invoice")).unwrap();
    fast.create_pending(&mut tx).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(count(&pool, "billing_jobs").await, 1);
    assert_eq!(pending_count(&pool).await, 0);
    let report = fast.push_and_delete(&mut con, &pool).await.unwrap();
    assert_eq!(report.deleted, 1);
    assert_eq!(count(&pool, "billing_jobs").await, 0);

    let mut slow = producer.pending();
    let mut tx = pool.begin().await.unwrap();
    let b = slow.add(JobBuilder::new("billing", "Refund")).unwrap();
    slow.create_pending(&mut tx).await.unwrap();
    tx.commit().await.unwrap();
    let (code, out) = sweep(&pool, &ns, &["--table", "billing_jobs"]).await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(count(&pool, "billing_jobs").await, 0);
    assert_eq!(uuids_of(&ns.list_jobs("queue:billing").await), vec![a, b]);
}

/// The fast-path futures are `Send`, so they can be awaited in spawned tasks and web handlers.
#[allow(dead_code)]
fn fast_path_futures_are_send(
    jobs: &mut jobrelay::producer::PendingJobs,
    pool: &PgPool,
    conn: &mut PgConnection,
    redis: &mut redis::aio::MultiplexedConnection,
) {
    fn is_send<T: Send>(_: T) {}
    is_send(jobs.create_pending(conn));
    is_send(jobs.push_and_delete(redis, pool));
    is_send(jobs.push_and_delete(redis, &mut *conn));
    is_send(jobs.push(redis));
    is_send(jobs.delete_pending(pool));
}

/// The fast path in the conveyor layout writes what the relay would: conveyor's keys and
/// `wire.Job`, a flow's children and heirs before their parent, and the relay's own markers.
#[sqlx::test]
async fn the_fast_path_writes_the_conveyor_layout(pool: PgPool) {
    use jobrelay::proto::wire;
    use prost::Message;
    let ns = Namespace::new();
    let producer = Producer::new(ns.prefix.clone()).layout(jobrelay::LayoutKind::Conveyor);
    assert_eq!(producer.enqueuer().layout(), jobrelay::LayoutKind::Conveyor);
    let mut jobs = producer.pending();
    let parent = Uuid::new_v4();
    // The parent first: the fast path still sends its child and heir before it.
    jobs.add(JobBuilder::new("shop.Pack", "shop.Pack").uuid(parent))
        .unwrap();
    let child = jobs
        .add(
            JobBuilder::new("shop.Item", "shop.Item")
                .parent(parent)
                .payload(b"i".to_vec()),
        )
        .unwrap();
    let heir = jobs
        .add(JobBuilder::new("shop.Ship", "shop.Ship").predecessor(parent))
        .unwrap();
    let mut tx = pool.begin().await.unwrap();
    jobs.create_pending(&mut tx).await.unwrap();
    tx.commit().await.unwrap();
    let mut con = ns.con().await;
    let report = jobs.push_and_delete(&mut con, &pool).await.unwrap();
    assert_eq!(report.count(Outcome::Queued), 1);
    assert_eq!(report.count(Outcome::Children), 1);
    assert_eq!(report.count(Outcome::OnComplete), 1);
    assert_eq!(count(&pool, "pending_jobs").await, 0);

    let ns = &ns;
    let only = |key: String| async move {
        let mut con = ns.con().await;
        let items: Vec<Vec<u8>> = redis::cmd("LRANGE")
            .arg(ns.key(&key))
            .arg(0)
            .arg(-1)
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(items.len(), 1, "{key}");
        wire::Job::decode(items[0].as_slice()).unwrap()
    };
    let queued = only("queue:shop.Pack".into()).await;
    assert_eq!(
        (queued.uuid, queued.r#type),
        (parent.to_string(), "shop.Pack".to_owned())
    );
    let held = only(format!("job:{parent}:children")).await;
    assert_eq!(
        (held.uuid, held.parent_uuid, held.payload),
        (child.to_string(), parent.to_string(), b"i".to_vec())
    );
    let released = only(format!("job:{parent}:onComplete")).await;
    assert_eq!(
        (released.uuid, released.predecessor_uuid),
        (heir.to_string(), parent.to_string())
    );
    let mut keys = ns.keys().await;
    keys.retain(|k| k.starts_with("jobrelay:job:"));
    assert_eq!(keys.len(), 3, "one marker per job, of the relay's own");
}
