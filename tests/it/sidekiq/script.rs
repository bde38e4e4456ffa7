//! The enqueue script alone (docs/layouts/sidekiq.md), on the shared Redis under a namespace.

use std::collections::BTreeMap;

use super::*;
use jobrelay::{Enqueuer, Error, Job, LayoutKind, Outcome};
use redis::aio::MultiplexedConnection;

fn job(queue: &str, payload: &str) -> Job {
    Job {
        uuid: Uuid::new_v4(),
        queue: queue.into(),
        job_type: "HardJob".into(),
        payload: payload.as_bytes().to_vec(),
        parent_uuid: None,
        predecessor_uuid: None,
        dead_parent: false,
        run_at: None,
        created_at: DateTime::from_timestamp(1_700_000_000, 123_456_000).unwrap(),
        headers: BTreeMap::from([("wrapped".to_owned(), "ChargeJob".to_owned())]),
        options: Default::default(),
        ordering_key: None,
    }
}

fn sidekiq_enqueuer(ns: &Namespace) -> Enqueuer {
    Enqueuer::new(ns.prefix.clone(), Duration::from_secs(60)).with_layout(LayoutKind::Sidekiq)
}

/// The list `key` of the namespace, each member as JSON.
async fn list(ns: &Namespace, key: &str) -> Vec<Value> {
    let raw: Vec<String> = ns.lrange(key).await;
    raw.iter()
        .map(|s| serde_json::from_str::<Value>(s).unwrap())
        .collect()
}

/// Sends a job due now, one due in an hour, one whose run_at has passed, the first again and a
/// flow's job in one batch: queued, scheduled, queued, a duplicate (the same uuid twice in a
/// batch), and refused before anything is sent (unfit). Returns the connection, the first three
/// jobs, and the epoch seconds just before and after the call.
async fn send_a_batch(ns: &Namespace) -> (MultiplexedConnection, [Job; 3], f64, f64) {
    let mut con = ns.con().await;
    let plain = job("q1", "[1]");
    let mut future = job("q1", "[2]");
    future.run_at =
        Some(DateTime::from_timestamp(Utc::now().timestamp() + 3600, 250_000_000).unwrap());
    let mut past = job("q2", "[3]");
    past.run_at = Some(DateTime::from_timestamp(1_600_000_000, 0).unwrap());
    let mut flow = job("q1", "[4]");
    flow.predecessor_uuid = Some(plain.uuid);
    let batch = [
        plain.clone(),
        future.clone(),
        past.clone(),
        plain.clone(),
        flow,
    ];
    let before = epoch(Utc::now()) - 1.0;
    let results = sidekiq_enqueuer(ns)
        .enqueue_batch(&mut con, &batch)
        .await
        .unwrap();
    let after = epoch(Utc::now()) + 1.0;
    assert!(matches!(results[0], Ok(Outcome::Queued)), "{results:?}");
    assert!(matches!(results[1], Ok(Outcome::Scheduled)), "{results:?}");
    assert!(matches!(results[2], Ok(Outcome::Queued)), "{results:?}");
    assert!(matches!(results[3], Ok(Outcome::Duplicate)), "{results:?}");
    match &results[4] {
        Err(Error::Unfit { layout, reason, .. }) => {
            assert_eq!(*layout, LayoutKind::Sidekiq.as_str());
            assert!(reason.0.contains("no flows"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    (con, [plain, future, past], before, after)
}

/// `queue:<q>` and `queues` for a job without `run_at` or with one that has passed (which gets
/// Redis's time as `enqueued_at`), `schedule` scored with `run_at` for a future one, all under
/// the namespace; the marker `jobrelay:sidekiq:<uuid>` with the TTL.
#[tokio::test]
async fn the_script_writes_sidekiqs_keys() {
    let ns = Namespace::new();
    let (mut con, [plain, future, past], before, after) = send_a_batch(&ns).await;
    let q1 = list(&ns, "queue:q1").await;
    assert_eq!(q1.len(), 1);
    assert_eq!(q1[0]["jid"], jid(plain.uuid));
    assert_eq!(q1[0]["args"], json!([1]));
    assert_eq!(q1[0]["wrapped"], "ChargeJob");
    assert_eq!(q1[0]["created_at"], json!(1_700_000_000.123456));
    let enqueued = q1[0]["enqueued_at"].as_f64().unwrap();
    assert!(before < enqueued && enqueued < after, "{enqueued}");
    let q2 = list(&ns, "queue:q2").await;
    assert_eq!(q2.len(), 1);
    assert_eq!(q2[0]["jid"], jid(past.uuid));
    let enqueued = q2[0]["enqueued_at"].as_f64().unwrap();
    assert!(
        before < enqueued && enqueued < after,
        "past run_at: Redis's time {enqueued}"
    );
    let mut queues: Vec<String> = redis::cmd("SMEMBERS")
        .arg(ns.key("queues"))
        .query_async(&mut con)
        .await
        .unwrap();
    queues.sort();
    assert_eq!(queues, ["q1", "q2"]);
    let scheduled: Vec<(String, f64)> = ns.zrange("schedule").await;
    assert_eq!(scheduled.len(), 1);
    let member: Value = serde_json::from_str(&scheduled[0].0).unwrap();
    assert_eq!(member["jid"], jid(future.uuid));
    assert!(member.get("enqueued_at").is_none(), "{member}");
    assert!((scheduled[0].1 - epoch(future.run_at.unwrap())).abs() < 1e-5);

    let marker = format!("jobrelay:sidekiq:{}", plain.uuid);
    let (value, ttl) = ns.get_and_pttl(&marker).await;
    assert_eq!(serde_json::from_str::<Value>(&value).unwrap(), q1[0]);
    assert!(ttl > 50_000 && ttl <= 60_000, "{ttl}");
}

/// Pushed again: duplicates, nothing written.
#[tokio::test]
async fn a_second_push_is_a_duplicate() {
    let ns = Namespace::new();
    let (mut con, [plain, future, _], ..) = send_a_batch(&ns).await;
    let again = sidekiq_enqueuer(&ns)
        .enqueue_batch(&mut con, &[plain, future])
        .await
        .unwrap();
    assert!(
        again.iter().all(|r| matches!(r, Ok(Outcome::Duplicate))),
        "{again:?}"
    );
    assert_eq!(list(&ns, "queue:q1").await.len(), 1);
}

/// `queues` of another type: the job is refused, nothing written, no marker.
#[tokio::test]
async fn a_key_of_another_type_refuses_the_job_without_writing() {
    let ns = Namespace::new();
    let mut con = ns.con().await;
    let _: () = redis::cmd("SET")
        .arg(ns.key("queues"))
        .arg("x")
        .query_async(&mut con)
        .await
        .unwrap();
    let other = job("q3", "[5]");
    match sidekiq_enqueuer(&ns).enqueue(&mut con, &other).await {
        Err(Error::Refused { message, .. }) => {
            assert!(
                message.contains("queues holds a string, not a set"),
                "{message}"
            )
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(list(&ns, "queue:q3").await.len(), 0);
    let marker_left: bool = redis::cmd("EXISTS")
        .arg(ns.key(&format!("jobrelay:sidekiq:{}", other.uuid)))
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(!marker_left);
}
