//! The enqueuer keeps a key's order inside one push, in every layout: once a job of a key is
//! refused, before it is sent or by the script, the key's later jobs of the push are held (not
//! sent; inside the call, by the script), whatever queue they are bound for, and other keys'
//! jobs go.

use super::*;
use crate::common::layouts::per_layout;
use jobrelay::producer::JobBuilder;
use jobrelay::{Enqueuer, Error, Outcome};

fn keyed(queue: &str, key: &str) -> jobrelay::Job {
    JobBuilder::new(queue, "app.tasks.ordered")
        .payload(b"[]".to_vec())
        .ordering_key(key)
        .build()
        .unwrap()
}

async fn a_refused_job_holds_the_later_jobs_of_its_key_in_every_queue(
    _pool: PgPool,
    layout: TestLayout,
) {
    let ns = Namespace::new();
    let mut con = ns.con().await;
    let enqueuer = Enqueuer::new(ns.prefix.clone(), Duration::from_secs(60)).with_layout(layout.0);
    // `bad` holds a string: the script refuses its jobs (WRONGTYPE).
    let _: () = redis::cmd("SET")
        .arg(enqueuer.queue_key("bad"))
        .arg("not a list")
        .query_async(&mut con)
        .await
        .unwrap();
    let mut too_large = keyed("good", "c");
    too_large.payload = format!("[\"{}\"]", "x".repeat(2048)).into_bytes();
    let jobs = vec![
        keyed("good", "a"), // 0: goes
        keyed("bad", "a"),  // 1: refused by the script
        keyed("good", "a"), // 2: held (bound elsewhere than 1: a call of its own)
        keyed("good", "b"), // 3: goes
        too_large,          // 4: refused before it is sent
        keyed("good", "c"), // 5: held
        keyed("good", "a"), // 6: held
        keyed("good", "b"), // 7: goes
    ];
    let results = enqueuer
        .clone()
        .with_limits(1024, 1 << 20)
        .enqueue_batch(&mut con, &jobs)
        .await
        .unwrap();
    let held_behind = |i: usize| match &results[i] {
        Err(Error::Held { uuid, key, behind }) => {
            assert_eq!(*uuid, jobs[i].uuid);
            assert_eq!(Some(key.as_str()), jobs[i].ordering_key.as_deref());
            Some(*behind)
        }
        _ => None,
    };
    assert!(
        matches!(results[0], Ok(Outcome::Queued)),
        "{:?}",
        results[0]
    );
    assert!(
        matches!(results[1], Err(Error::Refused { .. })),
        "{:?}",
        results[1]
    );
    assert_eq!(held_behind(2), Some(jobs[1].uuid), "{:?}", results[2]);
    assert!(
        matches!(results[3], Ok(Outcome::Queued)),
        "{:?}",
        results[3]
    );
    assert!(
        matches!(results[4], Err(Error::TooLarge { .. })),
        "{:?}",
        results[4]
    );
    assert_eq!(held_behind(5), Some(jobs[4].uuid), "{:?}", results[5]);
    assert_eq!(held_behind(6), Some(jobs[1].uuid), "{:?}", results[6]);
    assert!(
        matches!(results[7], Ok(Outcome::Queued)),
        "{:?}",
        results[7]
    );
    let mut queued: Vec<Vec<u8>> = redis::cmd("LRANGE")
        .arg(enqueuer.queue_key("good"))
        .arg(0)
        .arg(-1)
        .query_async(&mut con)
        .await
        .unwrap();
    if layout.0 != LayoutKind::Rq {
        queued.reverse();
    }
    let queued: Vec<String> = queued.iter().map(|m| layout.uuid_of(m)).collect();
    let expected: Vec<String> = [0, 3, 7]
        .iter()
        .map(|&i| jobs[i].uuid.to_string())
        .collect();
    assert_eq!(
        queued, expected,
        "only the jobs no earlier job of their key held back"
    );
}

per_layout!(a_refused_job_holds_the_later_jobs_of_its_key_in_every_queue);
