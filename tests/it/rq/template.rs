//! The job hash's template (rq.lua): a job's hash starts as a COPY of a template of the fields
//! every job of its kind shares, unless the server refuses COPY or DEL, when the hash is written
//! whole. Either way the hash is the same and has no TTL, and no template stays behind.

use std::collections::BTreeMap;

use super::*;
use crate::common::redis_server::RedisServer;
use chrono::Utc;
use jobrelay::Job;

/// A job with headers (RQ's meta), one without, and one due in an hour.
fn jobs() -> Vec<Job> {
    let queued = |n: i32| {
        JobBuilder::new("mail.q", "app.tasks.send").args_kwargs(&(n, "x"), &json!({"k": [true]}))
    };
    vec![
        queued(1)
            .header("traceparent", TRACEPARENT)
            .build()
            .unwrap(),
        queued(2).build().unwrap(),
        JobBuilder::new("mail.q", "app.tasks.send")
            .payload("[3]")
            .run_at(Utc::now() + chrono::Duration::seconds(3600))
            .build()
            .unwrap(),
    ]
}

type Hash = BTreeMap<String, Vec<u8>>;

/// Enqueues `jobs` under `prefix` as `user` (password `pw`; None: the default user) and returns
/// their hashes, `enqueued_at` left out (Redis's clock at the call), after checking that none has
/// a TTL and that nothing but RQ's keys and the markers is left under the prefix.
async fn hashes_written_as(
    redis: &RedisServer,
    user: Option<&str>,
    prefix: &str,
    jobs: &[Job],
) -> Vec<Hash> {
    let url = match user {
        Some(u) => format!("redis://{u}:pw@127.0.0.1:{}", redis.port),
        None => redis.url(),
    };
    let mut con = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let enqueuer =
        Enqueuer::new(prefix.to_owned(), Duration::from_secs(60)).with_layout(LayoutKind::Rq);
    let outcomes: Vec<Outcome> = enqueuer
        .enqueue_batch(&mut con, jobs)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(
        outcomes,
        [Outcome::Queued, Outcome::Queued, Outcome::Scheduled],
        "{user:?}"
    );
    let mut admin = redis.con();
    let mut out = Vec::new();
    for j in jobs {
        let key = format!("{prefix}rq:job:{}", j.uuid);
        let mut hash: Hash = redis::cmd("HGETALL").arg(&key).query(&mut admin).unwrap();
        let ttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut admin).unwrap();
        assert_eq!(ttl, -1, "{user:?}: {key} has a TTL");
        hash.remove("enqueued_at");
        out.push(hash);
    }
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query(&mut admin)
        .unwrap();
    keys.sort();
    let mut expected: Vec<String> = jobs
        .iter()
        .flat_map(|j| {
            [
                format!("{prefix}rq:job:{}", j.uuid),
                format!("{prefix}jobrelay:rq:{}", j.uuid),
            ]
        })
        .chain(
            ["rq:queue:mail.q", "rq:queues", "rq:scheduled:mail.q"].map(|k| format!("{prefix}{k}")),
        )
        .collect();
    expected.sort();
    assert_eq!(
        keys, expected,
        "{user:?}: RQ's keys and the markers, nothing else"
    );
    out
}

#[tokio::test]
async fn the_hash_is_the_same_with_copy_or_del_refused_and_no_template_stays() {
    let redis = RedisServer::start();
    for (user, denied) in [("nocopy", "-copy"), ("nodel", "-del")] {
        let _: () = redis::cmd("ACL")
            .arg(&["SETUSER", user, "on", ">pw", "~*", "+@all", denied][..])
            .query(&mut redis.con())
            .unwrap();
    }
    let jobs = jobs();
    let with_copy = hashes_written_as(&redis, None, "a:", &jobs).await;
    assert_eq!(
        with_copy[0]["meta"],
        format!("{{\"traceparent\": \"{TRACEPARENT}\"}}").into_bytes()
    );
    assert!(
        !with_copy[1].contains_key("meta"),
        "the first job's meta stayed behind"
    );
    assert_eq!(with_copy[2]["status"], b"scheduled");
    assert_eq!(with_copy[0].len(), 15, "{:?}", with_copy[0].keys());
    for (user, prefix) in [("nocopy", "b:"), ("nodel", "c:")] {
        let whole = hashes_written_as(&redis, Some(user), prefix, &jobs).await;
        assert_eq!(whole, with_copy, "{user}");
    }
    let copies: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut redis.con())
        .unwrap();
    assert!(
        copies.contains("cmdstat_copy:calls="),
        "the template was used: {copies}"
    );
}
