//! The script alone, on the shared Redis under a namespace: the job hash, the id on the queue
//! (RPUSH: FIFO from the left, as RQ pops), `rq:queues`, the scheduled registry (score rounded
//! up), the markers (members of the marker sets, docs/layouts/markers.md#markers-as-sets), duplicates by
//! marker and by job hash, and refusals that write nothing.

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
    let uuids = [first.uuid, second.uuid, later.uuid];
    let sets = marks::assert_marks(&mut con, &ns.prefix, LayoutKind::Rq, &uuids, TTL).await;
    let mut want_keys = vec![
        format!("rq:job:{}", first.uuid),
        format!("rq:job:{}", second.uuid),
        format!("rq:job:{}", later.uuid),
        "rq:queue:mail.q".to_owned(),
        "rq:queues".to_owned(),
        "rq:scheduled:mail.q".to_owned(),
    ];
    want_keys.extend(sets.iter().map(|s| s[ns.prefix.len()..].to_owned()));
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
    let hash = job_hash(&ns, &first).await;
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
    assert_eq!(text("created_at"), utcformat(first.created_at));
    // Redis's clock at the call, formatted by the script.
    let enqueued =
        chrono::NaiveDateTime::parse_from_str(&text("enqueued_at"), "%Y-%m-%dT%H:%M:%S%.6fZ")
            .unwrap_or_else(|e| panic!("enqueued_at {:?}: {e}", text("enqueued_at")))
            .and_utc();
    let age = Utc::now() - enqueued;
    assert!(
        (-1..60).contains(&age.num_seconds()),
        "enqueued_at {enqueued} is not the call's time"
    );
    let second_has_meta: bool = redis::cmd("HEXISTS")
        .arg(ns.key(&format!("rq:job:{}", second.uuid)))
        .arg("meta")
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(!second_has_meta, "the first job's meta stayed behind");
    let later_hash = job_hash(&ns, &later).await;
    assert_eq!(later_hash["status"], b"scheduled");
    assert_eq!(
        later_hash["created_at"],
        utcformat(later.created_at).as_bytes()
    );
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
    let unmarked = marks::unmark(&mut con, &ns.prefix, LayoutKind::Rq, first.uuid).await;
    assert_eq!(unmarked, 1);
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
        .arg(ns.key(&format!("rq:job:{}", j.uuid)))
        .query_async(&mut con)
        .await
        .unwrap();
    let job_key_is_ours = key.ends_with(&j.uuid.to_string());
    assert_eq!(exists, i64::from(job_key_is_ours), "{key}: nothing written");
    let marked = marks::is_marked(&mut con, &ns.prefix, LayoutKind::Rq, j.uuid).await;
    assert!(!marked, "{key}: no marker");
    let _: () = redis::cmd("DEL")
        .arg(key)
        .query_async(&mut con)
        .await
        .unwrap();
}

/// A job whose `run_at` has passed is queued, its `created_at` and `enqueued_at` as a queued
/// job's (the run_at rides on the created_at argument).
#[tokio::test]
async fn a_job_due_already_is_queued_with_its_timestamps() {
    let ns = Namespace::new();
    let enqueuer = rq_enqueuer(&ns);
    let mut con = ns.con().await;
    let due = JobBuilder::new("mail.q", "app.tasks.send")
        .payload("[]")
        .run_at(Utc::now() - chrono::Duration::seconds(3600))
        .build()
        .unwrap();
    let results = enqueuer
        .enqueue_batch(&mut con, std::slice::from_ref(&due))
        .await
        .unwrap();
    assert_eq!(results[0].as_ref().unwrap(), &Outcome::Queued);
    let hash = job_hash(&ns, &due).await;
    assert_eq!(hash["status"], b"queued");
    assert_eq!(hash["created_at"], utcformat(due.created_at).as_bytes());
    assert!(hash["enqueued_at"].ends_with(b"Z"), "{hash:?}");
}

/// RQ's job hash `rq:job:<uuid>` of `j`, field by field.
async fn job_hash(ns: &Namespace, j: &Job) -> HashMap<String, Vec<u8>> {
    let mut con = ns.con().await;
    redis::cmd("HGETALL")
        .arg(ns.key(&format!("rq:job:{}", j.uuid)))
        .query_async(&mut con)
        .await
        .unwrap()
}

/// RQ's `utcformat` (`%Y-%m-%dT%H:%M:%S.%fZ`) as chrono writes it.
fn utcformat(t: chrono::DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

/// The script's own `utcformat` (enqueued_at, from Redis's TIME) against chrono's, at the
/// calendar's edges (year 1, the epoch, leap days, century years with and without one, year
/// 9999) and at 2,000 instants spread over the years a job can carry.
#[tokio::test]
async fn the_scripts_utcformat_writes_rqs_timestamps() {
    let ns = Namespace::new();
    let mut con = ns.con().await;
    let script = redis::Script::new(concat!(
        include_str!("../../../src/broker/layout/rq_utcformat.lua"),
        "local out = {} for i = 1, #ARGV, 2 do \
         out[#out + 1] = utcformat(tonumber(ARGV[i]), tonumber(ARGV[i + 1])) end return out"
    ));
    let mut instants: Vec<(i64, u32)> = [
        (-62_135_596_800, 0),       // 0001-01-01
        (0, 0),                     // 1970-01-01
        (-1, 999_999),              // 1969-12-31T23:59:59.999999
        (951_782_400, 1),           // 2000-02-29
        (4_107_542_400, 500_000),   // 2100-03-01 (2100 has no leap day)
        (1_709_164_799, 0),         // 2024-02-28T23:59:59
        (1_709_251_200, 0),         // 2024-03-01
        (253_402_300_799, 999_999), // 9999-12-31T23:59:59.999999
    ]
    .to_vec();
    let (first, last) = (-62_135_596_800i64, 253_402_300_799i64);
    let step = (last - first) / 2_000;
    instants
        .extend((0..2_000).map(|i| (first + i * step + i * 7_919, (i as u32 * 4_813) % 1_000_000)));
    let mut inv = script.prepare_invoke();
    for (s, us) in &instants {
        inv.arg(s).arg(us);
    }
    let got: Vec<String> = inv.invoke_async(&mut con).await.unwrap();
    for ((s, us), got) in instants.iter().zip(&got) {
        let t = chrono::DateTime::from_timestamp(*s, us * 1_000).unwrap();
        assert_eq!(got, &utcformat(t), "{s} s {us} us");
    }
    assert_eq!(got.len(), instants.len());
}
