//! The script alone, on the shared Redis under a namespace: the job hash, the id on the queue
//! (RPUSH: FIFO from the left, as RQ pops), `rq:queues`, the scheduled registry (score rounded
//! up), the marker `<ns>jobrelay:rq:<uuid>` (queue key, dedup TTL), duplicates by marker and by
//! job hash, and refusals that write nothing.

use std::collections::HashMap;

use super::*;
use chrono::Utc;
use jobrelay::{Error, Job};

/// Job `n` of `app.tasks.send` on `mail.q`; the first has headers (RQ's meta), the others none.
fn job(n: i32) -> Job {
    let b =
        JobBuilder::new("mail.q", "app.tasks.send").args_kwargs(&(n, "x"), &json!({"k": [true]}));
    let b = if n == 1 {
        b.header("traceparent", TRACEPARENT)
    } else {
        b
    };
    b.build().unwrap()
}

/// What [`enqueue_four`] enqueued: the first job, the second, the one due in an hour.
struct Enqueued {
    ns: Namespace,
    enqueuer: Enqueuer,
    jobs: [Job; 3],
}

/// Enqueues jobs 1 and 2 (the first with headers, the second none: the script's field table
/// for queued jobs is reused from job to job), the first again, and one due in an hour.
async fn enqueue_four() -> Enqueued {
    let ns = Namespace::new();
    let enqueuer = rq_enqueuer(&ns);
    let mut con = ns.con().await;
    let (first, second) = (job(1), job(2));
    let later = JobBuilder::new("mail.q", "app.tasks.send")
        .payload("[]")
        .run_at(Utc::now() + chrono::Duration::seconds(3600))
        .build()
        .unwrap();
    let jobs = [first.clone(), second.clone(), first.clone(), later.clone()];
    let results = enqueuer.enqueue_batch(&mut con, &jobs).await.unwrap();
    let outcomes: Vec<Outcome> = results.into_iter().map(|r| r.unwrap()).collect();
    assert_eq!(
        outcomes,
        vec![
            Outcome::Queued,
            Outcome::Queued,
            Outcome::Duplicate,
            Outcome::Scheduled
        ]
    );
    Enqueued {
        ns,
        enqueuer,
        jobs: [first, second, later],
    }
}

/// The keys, the ids on the queue in order, `rq:queues`, the scheduled registry, the marker.
#[tokio::test]
async fn the_script_writes_rqs_keys_and_a_marker_of_its_own() {
    let Enqueued {
        ns,
        jobs: [first, second, later],
        ..
    } = enqueue_four().await;
    let mut con = ns.con().await;
    let mut want_keys = vec![
        format!("jobrelay:rq:{}", first.uuid),
        format!("jobrelay:rq:{}", second.uuid),
        format!("jobrelay:rq:{}", later.uuid),
        format!("rq:job:{}", first.uuid),
        format!("rq:job:{}", second.uuid),
        format!("rq:job:{}", later.uuid),
        "rq:queue:mail.q".to_owned(),
        "rq:queues".to_owned(),
        "rq:scheduled:mail.q".to_owned(),
    ];
    want_keys.sort();
    assert_eq!(ns.keys().await, want_keys);
    let ids: Vec<String> = ns.lrange("rq:queue:mail.q").await;
    assert_eq!(ids, vec![first.uuid.to_string(), second.uuid.to_string()]);
    let queues: Vec<String> = redis::cmd("SMEMBERS")
        .arg(ns.key("rq:queues"))
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(queues, vec![ns.key("rq:queue:mail.q")]);
    let scheduled: Vec<(String, f64)> = ns.zrange("rq:scheduled:mail.q").await;
    let ceil = (later.run_at.unwrap().timestamp_micros() as f64 / 1e6).ceil();
    assert_eq!(scheduled, vec![(later.uuid.to_string(), ceil)]);
    let (value, ttl) = ns
        .get_and_pttl(&format!("jobrelay:rq:{}", first.uuid))
        .await;
    assert_eq!(value, ns.key("rq:queue:mail.q"));
    assert!((50_000..=60_000).contains(&ttl), "{ttl}");
}

/// The job hashes: RQ's fields, a meta only where the job has headers, none of a queued job's
/// on a scheduled one.
#[tokio::test]
async fn the_job_hashes_hold_what_rq_reads() {
    let Enqueued {
        ns,
        jobs: [first, second, later],
        ..
    } = enqueue_four().await;
    let mut con = ns.con().await;
    let hash: HashMap<String, Vec<u8>> = redis::cmd("HGETALL")
        .arg(ns.key(&format!("rq:job:{}", first.uuid)))
        .query_async(&mut con)
        .await
        .unwrap();
    let text = |k: &str| String::from_utf8(hash[k].clone()).unwrap();
    assert_eq!(text("status"), "queued");
    assert_eq!(text("origin"), "mail.q");
    assert_eq!(text("timeout"), "180");
    assert_eq!(text("description"), "app.tasks.send(1, 'x', k=[True])");
    assert_eq!(
        text("meta"),
        format!("{{\"traceparent\": \"{TRACEPARENT}\"}}")
    );
    assert_eq!(hash["data"][..2], [0x78, 0x01], "a zlib stream");
    assert!(
        text("enqueued_at").ends_with('Z'),
        "{}",
        text("enqueued_at")
    );
    let second_has_meta: bool = redis::cmd("HEXISTS")
        .arg(ns.key(&format!("rq:job:{}", second.uuid)))
        .arg("meta")
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(!second_has_meta, "the first job's meta stayed behind");
    let later_hash: HashMap<String, Vec<u8>> = redis::cmd("HGETALL")
        .arg(ns.key(&format!("rq:job:{}", later.uuid)))
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(later_hash["status"], b"scheduled");
    assert!(!later_hash.contains_key("enqueued_at"));
    assert!(!later_hash.contains_key("meta"));
}

/// Without its marker, RQ's job hash of the same id makes a job a duplicate.
#[tokio::test]
async fn without_its_marker_rqs_job_hash_makes_a_job_a_duplicate() {
    let Enqueued {
        ns,
        enqueuer,
        jobs: [first, ..],
    } = enqueue_four().await;
    let mut con = ns.con().await;
    let _: () = redis::cmd("DEL")
        .arg(ns.key(&format!("jobrelay:rq:{}", first.uuid)))
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(
        enqueuer.enqueue(&mut con, &first).await.unwrap(),
        Outcome::Duplicate
    );
}

/// A key of another type: the queue's list, rq:queues, or the job's own key refuses the job,
/// writing nothing; once it is gone the job is queued.
#[tokio::test]
async fn a_key_of_another_type_refuses_the_job_and_nothing_is_written() {
    let ns = Namespace::new();
    let enqueuer = rq_enqueuer(&ns);
    let (third, fourth) = (job(3), job(4));
    for (key, j) in [
        (ns.key("rq:queue:mail.q"), &third),
        (ns.key("rq:queues"), &third),
        (ns.key(&format!("rq:job:{}", fourth.uuid)), &fourth),
    ] {
        refused_by(&ns, &enqueuer, &key, j).await;
    }
    let mut con = ns.con().await;
    assert_eq!(
        enqueuer.enqueue(&mut con, &third).await.unwrap(),
        Outcome::Queued
    );
}

/// With a string at `key`, `j` is refused (WRONGTYPE, naming the key) and nothing of it is
/// written; then the key is deleted.
async fn refused_by(ns: &Namespace, enqueuer: &Enqueuer, key: &str, j: &Job) {
    let mut con = ns.con().await;
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg("x")
        .query_async(&mut con)
        .await
        .unwrap();
    match enqueuer.enqueue(&mut con, j).await {
        Err(Error::Refused { message, .. }) => {
            assert!(
                message.contains("WRONGTYPE") && message.contains(key),
                "{message}"
            )
        }
        other => panic!("{key}: {other:?}"),
    }
    let exists: i64 = redis::cmd("EXISTS")
        .arg(ns.key(&format!("jobrelay:rq:{}", j.uuid)))
        .arg(ns.key(&format!("rq:job:{}", j.uuid)))
        .query_async(&mut con)
        .await
        .unwrap();
    let job_key_is_ours = key.ends_with(&j.uuid.to_string());
    assert_eq!(exists, i64::from(job_key_is_ours), "{key}: nothing written");
    let _: () = redis::cmd("DEL")
        .arg(key)
        .query_async(&mut con)
        .await
        .unwrap();
}
