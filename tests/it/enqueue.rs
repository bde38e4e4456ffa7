//! The enqueue algorithm against Redis (docs/layouts/algorithm.md#the-enqueue-algorithm): every branch
//! and their combinations, a mixed batch in id order, the namespace on every key, dedup markers
//! and their TTL. Each test relays in-process (or with the binary) and decodes what landed.

use std::time::Duration;

use crate::common::batch::*;
use crate::common::*;
use jobrelay::proto::v1;
use jobrelay::Outcome;
use sqlx::PgPool;
use uuid::Uuid;

/// Where a job must land.
#[derive(Debug, Clone, Copy)]
enum Lands {
    Queue,
    Scheduled,
    Children,
    OnComplete,
}

/// Inserts `new`, relays it in-process, and checks: the outcome, the one key the job landed in
/// (with the marker's exact bytes), every field of the decoded job, the `active` set for a
/// dead parent (`active`), that no other key was written and that the row is gone.
async fn branch(pool: PgPool, new: NewRow, lands: Lands, active: bool) {
    let ns = Namespace::new();
    let row = insert_job(&pool, &new).await;
    let report = drain(&batcher(&pool, &ns, TTL, 10).await).await;

    let outcome = match lands {
        Lands::Queue => Outcome::Queued,
        Lands::Scheduled => Outcome::Scheduled,
        Lands::Children => Outcome::Children,
        Lands::OnComplete => Outcome::OnComplete,
    };
    assert_eq!(report.claimed, 1, "{report}");
    assert_eq!(report.outcome(outcome), 1, "outcome {outcome}: {report}");
    assert_eq!(report.delivered(), 1, "{report}");
    assert_eq!(pending_count(&pool).await, 0, "row deleted");

    let dest = match lands {
        Lands::Queue => format!("queue:{}", row.queue),
        Lands::Scheduled => "scheduled".to_owned(),
        Lands::Children => format!("jobs:{}:children", new.parent.unwrap()),
        Lands::OnComplete => format!("jobs:{}:onComplete", new.pred.unwrap()),
    };
    let mut expected_keys = vec![marker(row.uuid), dest.clone()];
    if active {
        expected_keys.push(format!("jobs:{}:active", new.parent.unwrap()));
    }
    assert_eq!(ns.keys().await, sorted(&expected_keys), "keys written");

    let marked = get_raw(&ns, &marker(row.uuid)).await.expect("marker set");
    assert_job_is_row(&decode(&marked), &row);
    let stored = match lands {
        Lands::Scheduled => {
            let members = scheduled_raw(&ns).await;
            assert_eq!(members.len(), 1);
            let (bytes, score) = members.into_iter().next().unwrap();
            let run_at = row.run_at.expect("scheduled rows have run_at");
            let want =
                run_at.timestamp() as f64 + f64::from(run_at.timestamp_subsec_micros()) / 1e6;
            assert!(
                (score - want).abs() < 5e-7,
                "score {score} is run_at {run_at} as epoch seconds with the fraction ({want})"
            );
            bytes
        }
        _ => {
            let items = list_raw(&ns, &dest).await;
            assert_eq!(items.len(), 1, "one job in {dest}");
            items.into_iter().next().unwrap()
        }
    };
    assert_eq!(stored, marked, "the marker holds the same marshalled job");
    assert_job_is_row(&decode(&stored), &row);

    if active {
        let key = format!("jobs:{}:active", new.parent.unwrap());
        assert_eq!(
            smembers(&ns, &key).await,
            vec![row.uuid.to_string()],
            "{key}"
        );
    }
    assert!(pttl(&ns, &marker(row.uuid)).await > 0, "marker expires");
}

#[sqlx::test]
async fn plain_row_is_queued(pool: PgPool) {
    branch(pool, NewRow::default(), Lands::Queue, false).await;
}

#[sqlx::test]
async fn future_run_at_is_scheduled_with_fractional_score(pool: PgPool) {
    let new = NewRow {
        run_at: Some(at(3600)),
        ..NewRow::default()
    };
    branch(pool, new, Lands::Scheduled, false).await;
}

#[sqlx::test]
async fn past_run_at_is_queued_and_keeps_run_at(pool: PgPool) {
    let new = NewRow {
        run_at: Some(at(-3600)),
        ..NewRow::default()
    };
    branch(pool, new, Lands::Queue, false).await;
}

#[sqlx::test]
async fn live_parent_holds_the_child(pool: PgPool) {
    let new = NewRow {
        parent: Some(Uuid::new_v4()),
        ..NewRow::default()
    };
    branch(pool, new, Lands::Children, false).await;
}

#[sqlx::test]
async fn live_parent_wins_over_predecessor_and_run_at(pool: PgPool) {
    let new = NewRow {
        parent: Some(Uuid::new_v4()),
        pred: Some(Uuid::new_v4()),
        run_at: Some(at(3600)),
        ..NewRow::default()
    };
    branch(pool, new, Lands::Children, false).await;
}

#[sqlx::test]
async fn predecessor_only_goes_on_complete(pool: PgPool) {
    let new = NewRow {
        pred: Some(Uuid::new_v4()),
        ..NewRow::default()
    };
    branch(pool, new, Lands::OnComplete, false).await;
}

#[sqlx::test]
async fn predecessor_wins_over_future_run_at(pool: PgPool) {
    let new = NewRow {
        pred: Some(Uuid::new_v4()),
        run_at: Some(at(3600)),
        ..NewRow::default()
    };
    branch(pool, new, Lands::OnComplete, false).await;
}

#[sqlx::test]
async fn dead_parent_queues_and_marks_active(pool: PgPool) {
    let new = NewRow {
        parent: Some(Uuid::new_v4()),
        dead_parent: true,
        ..NewRow::default()
    };
    branch(pool, new, Lands::Queue, true).await;
}

#[sqlx::test]
async fn dead_parent_skips_the_predecessor(pool: PgPool) {
    let new = NewRow {
        parent: Some(Uuid::new_v4()),
        pred: Some(Uuid::new_v4()),
        dead_parent: true,
        ..NewRow::default()
    };
    branch(pool, new, Lands::Queue, true).await;
}

#[sqlx::test]
async fn dead_parent_with_future_run_at_is_only_scheduled(pool: PgPool) {
    let new = NewRow {
        parent: Some(Uuid::new_v4()),
        dead_parent: true,
        run_at: Some(at(3600)),
        ..NewRow::default()
    };
    branch(pool, new, Lands::Scheduled, false).await;
}

#[sqlx::test]
async fn dead_parent_with_past_run_at_queues_and_marks_active(pool: PgPool) {
    let new = NewRow {
        parent: Some(Uuid::new_v4()),
        dead_parent: true,
        run_at: Some(at(-60)),
        ..NewRow::default()
    };
    branch(pool, new, Lands::Queue, true).await;
}

#[sqlx::test]
async fn dead_parent_flag_without_parent_skips_predecessor(pool: PgPool) {
    let new = NewRow {
        pred: Some(Uuid::new_v4()),
        dead_parent: true,
        ..NewRow::default()
    };
    branch(pool, new, Lands::Queue, false).await;
}

/// One batch mixing plain and routed jobs over two queues, in one script call: each job lands
/// where its branch says, a queue fed by both kinds gets them in id order, and a uuid repeated
/// within the batch is a duplicate.
#[sqlx::test]
async fn a_mixed_batch_lands_every_job_in_id_order(pool: PgPool) {
    let ns = Namespace::new();
    let parent = Uuid::new_v4();
    let pred = Uuid::new_v4();
    let twice = Uuid::new_v4();
    // queue, parent, predecessor, dead_parent, run_at (seconds from now), payload
    type Spec = (
        &'static str,
        Option<Uuid>,
        Option<Uuid>,
        bool,
        Option<i64>,
        &'static str,
    );
    let rows: [Spec; 12] = [
        ("a", None, None, false, None, "1"),
        ("b", None, None, false, None, "2"),
        ("a", Some(parent), None, true, None, "3"),
        ("a", None, Some(pred), false, None, "4"),
        ("a", None, None, false, Some(-60), "5"),
        ("b", None, None, false, Some(3600), "6"),
        ("a", Some(parent), None, false, None, "7"),
        ("a", None, None, false, None, "8"),
        ("b", None, None, true, None, "9"),
        ("b", None, None, false, None, "10"),
        ("a", None, None, false, Some(3600), "11"),
        ("a", None, Some(pred), false, None, "12"),
    ];
    let mut uuids = Vec::new();
    for (i, (queue, parent, pred, dead, run_at, payload)) in rows.into_iter().enumerate() {
        // Rows 10 and 11 share a uuid: the second (with a route) is a duplicate of the first.
        let uuid = if i == 9 || i == 10 {
            twice
        } else {
            Uuid::new_v4()
        };
        uuids.push(uuid);
        insert_job(
            &pool,
            &NewRow {
                uuid: Some(uuid),
                queue: Some(queue),
                payload: Some(payload.as_bytes().to_vec()),
                parent,
                pred,
                dead_parent: dead,
                run_at: run_at.map(at),
            },
        )
        .await;
    }
    let report = drain(&batcher(&pool, &ns, TTL, 100).await).await;
    assert_eq!(report.claimed, 12, "{report}");
    assert_eq!(report.outcome(Outcome::Queued), 7, "{report}");
    assert_eq!(report.outcome(Outcome::Scheduled), 1, "{report}");
    assert_eq!(report.outcome(Outcome::Children), 1, "{report}");
    assert_eq!(report.outcome(Outcome::OnComplete), 2, "{report}");
    assert_eq!(report.outcome(Outcome::Duplicate), 1, "{report}");
    assert_eq!(pending_count(&pool).await, 0);

    let payloads = |jobs: Vec<v1::Job>| -> Vec<String> {
        jobs.into_iter()
            .map(|j| String::from_utf8(j.payload).unwrap())
            .collect()
    };
    assert_eq!(
        payloads(ns.list_jobs("queue:a").await),
        ["1", "3", "5", "8"]
    );
    assert_eq!(payloads(ns.list_jobs("queue:b").await), ["2", "9", "10"]);
    assert_eq!(
        payloads(ns.list_jobs(&format!("jobs:{parent}:children")).await),
        ["7"]
    );
    assert_eq!(
        payloads(ns.list_jobs(&format!("jobs:{pred}:onComplete")).await),
        ["4", "12"]
    );
    let scheduled = scheduled_raw(&ns).await;
    assert_eq!(scheduled.len(), 1);
    assert_eq!(decode(&scheduled[0].0).payload, b"6");
    assert_eq!(
        smembers(&ns, &format!("jobs:{parent}:active")).await,
        vec![uuids[2].to_string()]
    );
    for (i, uuid) in uuids.iter().enumerate() {
        let marked = get_raw(&ns, &marker(*uuid)).await.expect("marker set");
        let want = if i == 10 { "10" } else { rows[i].5 };
        assert_eq!(
            decode(&marked).payload,
            want.as_bytes(),
            "marker of row {i}"
        );
    }
}

#[sqlx::test]
async fn namespace_prefixes_every_key(pool: PgPool) {
    // The branch tests see only their own prefix; check that nothing went unprefixed.
    let ns = Namespace::new();
    let parent = Uuid::new_v4();
    let row = insert_job(
        &pool,
        &NewRow {
            parent: Some(parent),
            dead_parent: true,
            queue: Some("nsq"),
            ..NewRow::default()
        },
    )
    .await;
    drain(&batcher(&pool, &ns, TTL, 10).await).await;
    let mut con = ns.con().await;
    for key in [
        marker(row.uuid),
        "queue:nsq".to_owned(),
        format!("jobs:{parent}:active"),
    ] {
        let n: i64 = redis::cmd("EXISTS")
            .arg(&key)
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(n, 0, "unprefixed {key} written");
        let n: i64 = redis::cmd("EXISTS")
            .arg(ns.key(&key))
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(n, 1, "prefixed {key} written");
    }
}

#[sqlx::test]
async fn relayed_uuid_is_a_duplicate_and_its_row_is_deleted(pool: PgPool) {
    let ns = Namespace::new();
    let b = batcher(&pool, &ns, TTL, 10).await;
    let first = insert_job(&pool, &NewRow::default()).await;
    let r = drain(&b).await;
    assert_eq!(r.outcome(Outcome::Queued), 1, "{r}");
    let keys_before = ns.keys().await;
    let marker_before = get_raw(&ns, &marker(first.uuid)).await.unwrap();

    // The same uuid again (as after a crash between push and delete), even with other content.
    insert_job(
        &pool,
        &NewRow {
            uuid: Some(first.uuid),
            queue: Some("elsewhere"),
            payload: Some(b"second copy".to_vec()),
            ..NewRow::default()
        },
    )
    .await;
    let r = drain(&b).await;
    assert_eq!(
        (r.claimed, r.outcome(Outcome::Duplicate), r.delivered()),
        (1, 1, 1),
        "{r}"
    );
    assert_eq!(pending_count(&pool).await, 0, "duplicate row deleted");
    assert_eq!(ns.keys().await, keys_before, "no new key");
    let queued = list_raw(&ns, "queue:billing").await;
    assert_eq!(queued.len(), 1, "still one job");
    assert_job_is_row(&decode(&queued[0]), &first);
    assert_eq!(
        get_raw(&ns, &marker(first.uuid)).await.unwrap(),
        marker_before
    );

    // Two rows of one batch with the same uuid: one job.
    let u = Uuid::new_v4();
    for _ in 0..2 {
        insert_job(
            &pool,
            &NewRow {
                uuid: Some(u),
                ..NewRow::default()
            },
        )
        .await;
    }
    let r = drain(&b).await;
    assert_eq!(
        (
            r.claimed,
            r.outcome(Outcome::Queued),
            r.outcome(Outcome::Duplicate)
        ),
        (2, 1, 1)
    );
    assert_eq!(ns.llen("queue:billing").await, 2);
    assert_eq!(pending_count(&pool).await, 0);
}

#[sqlx::test]
async fn marker_carries_the_configured_ttl(pool: PgPool) {
    let ns = Namespace::new();
    let row = insert_job(&pool, &NewRow::default()).await;
    drain(&batcher(&pool, &ns, TTL, 10).await).await;
    let ttl = pttl(&ns, &marker(row.uuid)).await;
    let max = TTL.as_millis() as i64;
    assert!(
        ttl <= max && ttl > max - 30_000,
        "PTTL {ttl} close to {max}"
    );

    let row = insert_job(&pool, &NewRow::default()).await;
    drain(&batcher(&pool, &ns, Duration::ZERO, 10).await).await;
    assert_eq!(
        pttl(&ns, &marker(row.uuid)).await,
        -1,
        "dedup TTL 0: no expiry"
    );
}

/// With `--dedup-ttl 0` the script writes markers with variadic MSETs in chunks: in one call
/// that spans several chunks every marker holds its own job and never expires. (The library
/// call, not the relay: the relay's job-by-job fallback would hide a call that Redis refused.)
#[tokio::test]
async fn markers_without_ttl_hold_their_jobs_across_chunks() {
    let ns = Namespace::new();
    let jobs: Vec<jobrelay::Job> = (0..1_000)
        .map(|i| {
            jobrelay::producer::JobBuilder::new("nottl", "Bulk")
                .payload(format!("job-{i}"))
                .build()
                .unwrap()
        })
        .collect();
    let mut con = ns.con().await;
    let results = jobrelay::Enqueuer::new(ns.prefix.clone(), Duration::ZERO)
        .enqueue_batch(&mut con, &jobs)
        .await
        .expect("one call for the whole batch");
    assert!(results.iter().all(|r| matches!(r, Ok(Outcome::Queued))));
    for job in &jobs {
        let key = ns.key(&format!("jobs:{}", job.uuid));
        let (raw, ttl): (Vec<u8>, i64) = redis::pipe()
            .cmd("GET")
            .arg(&key)
            .cmd("PTTL")
            .arg(&key)
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(decode(&raw).payload, job.payload, "{key} holds its own job");
        assert_eq!(ttl, -1, "{key} never expires");
    }
}

#[sqlx::test]
async fn binary_dedup_ttl_flag_sets_the_marker_ttl(pool: PgPool) {
    let ns = Namespace::new();
    let db = database_url_of(&pool).await;
    let env = relay_env(&db, &ns);
    let row = insert_job(&pool, &NewRow::default()).await;
    let (code, out, err) = run_relay(
        &["--sweep", "--older-than", "0s", "--dedup-ttl", "7m"],
        &env,
    )
    .await;
    assert_eq!(code, 0, "{out}\n{err}");
    let ttl = pttl(&ns, &marker(row.uuid)).await;
    assert!(
        ttl <= 420_000 && ttl > 420_000 - 30_000,
        "PTTL {ttl} close to 7m"
    );

    let row = insert_job(&pool, &NewRow::default()).await;
    let (code, out, err) =
        run_relay(&["--sweep", "--older-than", "0s", "--dedup-ttl", "0"], &env).await;
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(
        pttl(&ns, &marker(row.uuid)).await,
        -1,
        "--dedup-ttl 0: no expiry"
    );

    // The default is 15 minutes.
    let row = insert_job(&pool, &NewRow::default()).await;
    let (code, out, err) = run_relay(&["--sweep", "--older-than", "0s"], &env).await;
    assert_eq!(code, 0, "{out}\n{err}");
    let ttl = pttl(&ns, &marker(row.uuid)).await;
    assert!(
        ttl <= 900_000 && ttl > 900_000 - 30_000,
        "PTTL {ttl} close to 15m"
    );
}

/// Conveyor layout, the script alone: a job is late when the job it names has finished, also
/// when that one was itself a child (its marker then records where it went and its route).
#[tokio::test]
async fn conveyor_a_grandchild_of_finished_jobs_is_late() {
    use jobrelay::producer::JobBuilder;
    use jobrelay::{Enqueuer, LayoutKind};
    let ns = Namespace::new();
    let enqueuer =
        Enqueuer::new(ns.prefix.clone(), Duration::from_secs(60)).with_layout(LayoutKind::Conveyor);
    let mut con = ns.con().await;
    let pusher = con.clone();
    let job = |queue: &str| JobBuilder::new(queue, queue);
    let grand = job("g.Grand").build().unwrap();
    let parent = job("g.Parent").parent(grand.uuid).build().unwrap();
    let child = job("g.Child").parent(parent.uuid).build().unwrap();
    let push = |j: &jobrelay::Job| {
        let (e, j) = (enqueuer.clone(), j.clone());
        let mut con = pusher.clone();
        async move { e.enqueue(&mut con, &j).await.unwrap() }
    };
    assert_eq!(push(&grand).await, Outcome::Queued);
    // The grandparent waits in its queue: the parent goes into its children list.
    assert_eq!(push(&parent).await, Outcome::Children);
    // Both ran and closed (as conveyor leaves it: popped, lists drained, records deleted).
    let _: () = redis::pipe()
        .del(ns.key("queue:g.Grand"))
        .del(ns.key(&format!("job:{}:children", grand.uuid)))
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(push(&child).await, Outcome::Late, "its parent has finished");
    assert_eq!(
        the_one_queued(&ns, "queue:g.Child").await,
        (child.uuid.to_string(), String::new())
    );

    // While the parent still waits in its grandparent's children list, a child is not late.
    let (grand, parent) = (job("h.Grand").build().unwrap(), job("h.Parent"));
    let parent = parent.parent(grand.uuid).build().unwrap();
    push(&grand).await;
    push(&parent).await;
    let child = job("h.Child").parent(parent.uuid).build().unwrap();
    assert_eq!(push(&child).await, Outcome::Children);
}

/// The uuid and parent of the one job (conveyor's wire format) on the list `key`.
async fn the_one_queued(ns: &Namespace, key: &str) -> (String, String) {
    let queued: Vec<Vec<u8>> = ns.lrange(key).await;
    assert_eq!(queued.len(), 1, "{key}");
    let job = <jobrelay::proto::wire::Job as prost::Message>::decode(queued[0].as_slice()).unwrap();
    (job.uuid, job.parent_uuid)
}

/// How many running parents the conveyor layout's repair watches.
async fn watched(ns: &Namespace) -> usize {
    let mut con = ns.con().await;
    redis::cmd("ZCARD")
        .arg(ns.key("jobrelay:watch"))
        .query_async(&mut con)
        .await
        .unwrap()
}

/// Conveyor layout, the housekeeping script alone: a child pushed into the children list of a
/// running parent is watched; while the parent's record exists it stays, and once a close
/// that raced the push has deleted the record (lists drained before the push landed), the
/// repair sets it free as a job of its own, once.
#[tokio::test]
async fn conveyor_repair_frees_a_child_stranded_by_a_racing_close() {
    use jobrelay::producer::JobBuilder;
    use jobrelay::{Enqueuer, LayoutKind};
    let ns = Namespace::new();
    let enqueuer =
        Enqueuer::new(ns.prefix.clone(), Duration::from_secs(60)).with_layout(LayoutKind::Conveyor);
    let mut con = ns.con().await;
    let parent = JobBuilder::new("r.Parent", "r.Parent").build().unwrap();
    let child = JobBuilder::new("r.Child", "r.Child")
        .parent(parent.uuid)
        .build()
        .unwrap();
    assert_eq!(
        enqueuer.enqueue(&mut con, &parent).await.unwrap(),
        Outcome::Queued
    );
    // The parent runs: conveyor popped it and keeps its record.
    let record = ns.key(&format!("job:{}", parent.uuid));
    let _: () = redis::pipe()
        .del(ns.key("queue:r.Parent"))
        .set(&record, "running")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(
        enqueuer.enqueue(&mut con, &child).await.unwrap(),
        Outcome::Children
    );
    let children = ns.key(&format!("job:{}:children", parent.uuid));
    assert_eq!(ns.llen(&format!("job:{}:children", parent.uuid)).await, 1);
    assert_eq!(watched(&ns).await, 1, "the running parent is watched");

    // Still running: nothing is set free, the parent stays watched.
    let freed = enqueuer
        .repair(&mut con, Duration::ZERO, 100)
        .await
        .unwrap();
    assert_eq!(freed, 0);
    assert_eq!(ns.llen(&format!("job:{}:children", parent.uuid)).await, 1);

    // The close raced the push: it drained the (then empty) lists and deleted the record.
    let _: () = redis::cmd("DEL")
        .arg(&record)
        .query_async(&mut con)
        .await
        .unwrap();
    let freed = enqueuer
        .repair(&mut con, Duration::ZERO, 100)
        .await
        .unwrap();
    assert_eq!(freed, 1);
    let exists: bool = redis::cmd("EXISTS")
        .arg(&children)
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(!exists, "the children list is empty");
    assert_eq!(
        the_one_queued(&ns, "queue:r.Child").await,
        (child.uuid.to_string(), String::new()),
        "set free as a job of its own"
    );
    assert_eq!(watched(&ns).await, 0, "no longer watched");
    // The marker now says it went to its queue: a replay is a duplicate, a second repair
    // frees nothing.
    let marker: Vec<u8> = redis::cmd("GET")
        .arg(ns.key(&format!("jobrelay:job:{}", child.uuid)))
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(marker[0], b'q');
    assert_eq!(
        enqueuer.enqueue(&mut con, &child).await.unwrap(),
        Outcome::Duplicate
    );
    assert_eq!(
        enqueuer
            .repair(&mut con, Duration::ZERO, 100)
            .await
            .unwrap(),
        0
    );
}
