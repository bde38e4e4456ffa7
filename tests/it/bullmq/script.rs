//! The script alone, on a private Redis, against BullMQ's own `Queue.add` of the same jobs in
//! a sibling queue: the same hash fields, events, id counter, marker and delayed score; dedup
//! by the marker and by BullMQ's own hash; refusals; paused queues.

use std::collections::HashMap;

use super::*;
use jobrelay::{Error, Job};
use redis::aio::MultiplexedConnection;

/// The dedup TTL of [`bullmq_enqueuer`].
const TTL: Duration = Duration::from_secs(60);

/// The same two jobs written by the script into `mine` and by BullMQ's `Queue.add` into `own`.
struct Added {
    /// The private Redis: bind it (`server: _server`) to keep it running.
    server: RedisServer,
    con: redis::Connection,
    acon: MultiplexedConnection,
    enqueuer: Enqueuer,
    /// `send`, due now, and `later`, delayed by an hour.
    now_job: Job,
    later_job: Job,
    /// When the script ran (epoch ms), before and after.
    before: i64,
    after: i64,
}

/// The script enqueues `send`, `later` and `send` again (a duplicate), then `Queue.add` adds
/// the same two jobs with the same ids.
async fn added_both_ways() -> Added {
    let (redis, con, mut acon) = private_redis().await;
    let enqueuer = bullmq_enqueuer();
    let now_job = JobBuilder::new("mine", "send")
        .payload(r#"{"to":"a@b.c","n":[1,2.5]}"#)
        .header("traceparent", "00-ab-cd-01")
        .build()
        .unwrap();
    let later_job = JobBuilder::new("mine", "later")
        .payload("[1]")
        .delay(Duration::from_secs(3600))
        .build()
        .unwrap();
    let before = Utc::now().timestamp_millis();
    let batch = [now_job.clone(), later_job.clone(), now_job.clone()];
    let results = enqueuer.enqueue_batch(&mut acon, &batch).await.unwrap();
    let after = Utc::now().timestamp_millis();
    assert!(matches!(results[0], Ok(Outcome::Queued)), "{results:?}");
    assert!(matches!(results[1], Ok(Outcome::Scheduled)), "{results:?}");
    assert!(matches!(results[2], Ok(Outcome::Duplicate)), "{results:?}");
    let delay = later_job.run_at.unwrap().timestamp_millis() - Utc::now().timestamp_millis();
    let script = scripts::js(
        &[
            ("A", json!(now_job.uuid.to_string())),
            ("B", json!(later_job.uuid.to_string())),
            ("DELAY", json!(delay)),
        ],
        include_str!("add_own.js"),
    );
    BullmqWorker::start(redis.port, PREFIX, &[])
        .await
        .node(&script);
    Added {
        server: redis,
        con,
        acon,
        enqueuer,
        now_job,
        later_job,
        before,
        after,
    }
}

/// A private Redis, a connection and an async one to it.
async fn private_redis() -> (RedisServer, redis::Connection, MultiplexedConnection) {
    let redis = RedisServer::start();
    let client = redis::Client::open(redis.url().as_str()).unwrap();
    let acon = client.get_multiplexed_async_connection().await.unwrap();
    let con = redis.con();
    (redis, con, acon)
}

fn bullmq_enqueuer() -> Enqueuer {
    Enqueuer::new(NS.to_owned(), TTL).with_layout(LayoutKind::Bullmq)
}

/// `HGETALL` of `key` as a map.
fn hash(con: &mut redis::Connection, key: &str) -> HashMap<String, String> {
    redis::cmd("HGETALL").arg(key).query(con).unwrap()
}

/// The events stream at `key`: each entry's fields (event, job id, ...), without the ids.
fn stream(con: &mut redis::Connection, key: &str) -> Vec<Vec<String>> {
    let v: Vec<(String, Vec<String>)> = redis::cmd("XRANGE")
        .arg(key)
        .arg("-")
        .arg("+")
        .query(con)
        .unwrap();
    v.into_iter().map(|(_, f)| f).collect()
}

/// The job hashes: the same fields and values but for the moment and delay of the add.
#[tokio::test]
async fn the_job_hashes_are_what_queue_add_writes() {
    let Added {
        mut con,
        now_job,
        later_job,
        before,
        after,
        server: _server,
        ..
    } = added_both_ways().await;
    for (job, delayed) in [(&now_job, false), (&later_job, true)] {
        let mut mine = hash(&mut con, &format!("{NS}mine:{}", job.uuid));
        let mut own = hash(&mut con, &format!("{NS}own:{}", job.uuid));
        let ts: i64 = mine["timestamp"].parse().unwrap();
        assert!((before - 5..=after + 5).contains(&ts), "timestamp {ts}");
        if delayed {
            let d: i64 = mine["delay"].parse().unwrap();
            assert_eq!(
                ts + d,
                (job.run_at.unwrap().timestamp_micros() + 999) / 1000,
                "timestamp + delay = run_at (ms, rounded up)"
            );
            let opts: Value = serde_json::from_str(&mine["opts"]).unwrap();
            assert_eq!(
                opts,
                json!({"jobId": job.uuid.to_string(), "delay": d, "attempts": 0})
            );
            let own_opts: Value = serde_json::from_str(&own["opts"]).unwrap();
            assert_eq!(
                own_opts.as_object().unwrap().keys().collect::<Vec<_>>(),
                opts.as_object().unwrap().keys().collect::<Vec<_>>()
            );
            for h in [&mut mine, &mut own] {
                h.remove("delay");
                h.remove("opts");
            }
        }
        for h in [&mut mine, &mut own] {
            h.remove("timestamp");
        }
        assert_eq!(mine, own, "the job hash of {}", job.uuid);
    }
}

/// The id counter counts custom ids too; the meta hash has BullMQ's event limit; the wait list
/// holds the job due now; the events are the same entries, but for the delayed event's due
/// time.
#[tokio::test]
async fn the_id_counter_meta_wait_list_and_events_are_what_queue_add_writes() {
    let Added {
        mut con,
        now_job,
        server: _server,
        ..
    } = added_both_ways().await;
    for q in ["mine", "own"] {
        let id: i64 = redis::cmd("GET")
            .arg(format!("{NS}{q}:id"))
            .query(&mut con)
            .unwrap();
        assert_eq!(id, 2, "{q}:id");
        let meta = hash(&mut con, &format!("{NS}{q}:meta"));
        assert_eq!(meta["opts.maxLenEvents"], "10000");
        let wait: Vec<String> = redis::cmd("LRANGE")
            .arg(format!("{NS}{q}:wait"))
            .arg(0)
            .arg(-1)
            .query(&mut con)
            .unwrap();
        assert_eq!(wait, vec![now_job.uuid.to_string()], "{q}:wait");
    }
    let strip = |mut s: Vec<Vec<String>>| {
        for e in &mut s {
            if e[1] == "delayed" {
                e.truncate(4);
            }
        }
        s
    };
    assert_eq!(
        strip(stream(&mut con, &format!("{NS}mine:events"))),
        strip(stream(&mut con, &format!("{NS}own:events")))
    );
}

/// The delayed set's score: the due millisecond times 0x1000; the marker: 0 for waiting jobs,
/// the next due time for delayed ones; jobrelay's markers are in its marker sets.
#[tokio::test]
async fn the_delayed_set_and_the_markers_hold_what_bullmq_reads() {
    let Added {
        mut con,
        mut acon,
        now_job,
        later_job,
        server: _server,
        ..
    } = added_both_ways().await;
    let zrange = |con: &mut redis::Connection, key: &str| -> Vec<(String, f64)> {
        redis::cmd("ZRANGE")
            .arg(format!("{NS}{key}"))
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query(con)
            .unwrap()
    };
    let due_ms = (later_job.run_at.unwrap().timestamp_micros() + 999) / 1000;
    assert_eq!(
        zrange(&mut con, "mine:delayed"),
        vec![(later_job.uuid.to_string(), (due_ms * 4096) as f64)]
    );
    assert_eq!(
        zrange(&mut con, "mine:marker"),
        vec![("0".to_owned(), 0.0), ("1".to_owned(), due_ms as f64)]
    );
    let uuids = [now_job.uuid, later_job.uuid];
    marks::assert_marks(&mut acon, NS, LayoutKind::Bullmq, &uuids, TTL).await;
}

/// A job BullMQ already holds (its hash exists, no marker of ours): a duplicate, nothing
/// written, as BullMQ's own add.
#[tokio::test]
async fn a_job_bullmq_already_holds_is_a_duplicate() {
    let Added {
        mut con,
        mut acon,
        enqueuer,
        now_job,
        server: _server,
        ..
    } = added_both_ways().await;
    let theirs = JobBuilder::new("own", "send")
        .uuid(now_job.uuid)
        .payload("{}")
        .build()
        .unwrap();
    let r = enqueuer.enqueue(&mut acon, &theirs).await.unwrap();
    assert_eq!(r, Outcome::Duplicate);
    let own_wait: i64 = redis::cmd("LLEN")
        .arg(format!("{NS}own:wait"))
        .query(&mut con)
        .unwrap();
    assert_eq!(own_wait, 1, "nothing pushed");
}

/// A key of another type refuses the job and writes nothing for it; so does an id counter that
/// is not an integer (INCRBY would fail mid-call), and for a job of a priority the prioritized
/// set's and its counter's (INCR).
#[tokio::test]
async fn keys_bullmq_could_not_use_refuse_the_job_and_nothing_is_written() {
    let (_redis, mut con, mut acon) = private_redis().await;
    let enqueuer = bullmq_enqueuer();
    for (queue, key, value, says, priority) in [
        (
            "bad",
            "bad:events",
            "x",
            &["WRONGTYPE", "bad:events"][..],
            0,
        ),
        ("badid", "badid:id", "x1", &["not an integer"][..], 0),
        (
            "badp",
            "badp:prioritized",
            "x",
            &["WRONGTYPE", "badp:prioritized"][..],
            3,
        ),
        (
            "badpc",
            "badpc:pc",
            "x1",
            &["badpc:pc", "not an integer (BullMQ's priority counter)"][..],
            3,
        ),
    ] {
        let _: () = redis::cmd("SET")
            .arg(format!("{NS}{key}"))
            .arg(value)
            .query(&mut con)
            .unwrap();
        let mut bad = JobBuilder::new(queue, "send").payload("{}");
        if priority > 0 {
            bad = bad.option("priority", priority);
        }
        let bad = bad.build().unwrap();
        match enqueuer.enqueue(&mut acon, &bad).await {
            Err(Error::Refused { message, .. }) => {
                assert!(says.iter().all(|s| message.contains(s)), "{message}")
            }
            other => panic!("{other:?}"),
        }
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("*{queue}*"))
            .query(&mut con)
            .unwrap();
        assert_eq!(keys, vec![format!("{NS}{key}")], "nothing written");
        let marked = marks::is_marked(&mut acon, NS, LayoutKind::Bullmq, bad.uuid).await;
        assert!(!marked);
    }
}

/// A paused queue: the job waits without the workers' marker (BullMQ 6); a paused queue of
/// BullMQ 5 (its meta's version) gets it in its paused list.
#[tokio::test]
async fn a_paused_queue_gets_the_job_where_its_bullmq_version_looks() {
    let (_redis, mut con, mut acon) = private_redis().await;
    let enqueuer = bullmq_enqueuer();
    for (q, version, list) in [
        ("p6", "bullmq:6.7.0", "wait"),
        ("p5", "bullmq:5.60.0", "paused"),
    ] {
        let _: () = redis::cmd("HSET")
            .arg(format!("{NS}{q}:meta"))
            .arg("paused")
            .arg(1)
            .arg("version")
            .arg(version)
            .query(&mut con)
            .unwrap();
        let job = JobBuilder::new(q, "send").payload("{}").build().unwrap();
        assert_eq!(
            enqueuer.enqueue(&mut acon, &job).await.unwrap(),
            Outcome::Queued
        );
        let items: Vec<String> = redis::cmd("LRANGE")
            .arg(format!("{NS}{q}:{list}"))
            .arg(0)
            .arg(-1)
            .query(&mut con)
            .unwrap();
        assert_eq!(items, vec![job.uuid.to_string()], "{q}:{list}");
        let marked: bool = redis::cmd("EXISTS")
            .arg(format!("{NS}{q}:marker"))
            .query(&mut con)
            .unwrap();
        assert!(!marked, "no marker for paused {q}");
    }
}
