//! The celery layout's call is a transaction: the messages are LPUSHed natively, then the
//! script takes the duplicates' messages back out by their place
//! (docs/layouts/celery.md#how-the-celery-layout-pushes).

use jobrelay::Job;

use super::*;

/// A job of `TASK` on `queue` with the argument `i`.
fn job(queue: &str, i: i32) -> Job {
    JobBuilder::new(queue, TASK)
        .args_kwargs(&[i], &BTreeMap::<String, i32>::new())
        .build()
        .unwrap()
}

fn id(j: &Job) -> String {
    j.uuid.to_string()
}

/// The messages of `list` from the right (the end BRPOP pops): the task ids, or the raw
/// message where it is not one of kombu's.
async fn ids(ns: &Namespace, list: &str) -> Vec<String> {
    let raw: Vec<String> = ns.lrange(list).await;
    raw.iter()
        .rev()
        .map(|m| match serde_json::from_str::<Value>(m) {
            Ok(msg) => msg["headers"]["id"].as_str().unwrap().to_owned(),
            Err(_) => m.clone(),
        })
        .collect()
}

/// Against lists that already hold messages, a call mixing new jobs, replays of an earlier
/// call and a uuid twice over three lists leaves each uuid once, in the order a worker's BRPOP
/// meets them.
#[tokio::test]
async fn a_call_takes_its_duplicates_back_out_and_keeps_the_order() {
    let ns = Namespace::new();
    let enqueuer = celery_enqueuer(&ns);
    let mut con = ns.con().await;
    for list in ["a", "b"] {
        let _: () = redis::cmd("LPUSH")
            .arg(ns.key(list))
            .arg(format!("older message of {list}"))
            .query_async(&mut con)
            .await
            .unwrap();
    }
    let first: Vec<_> = (0..6).map(|i| job(["a", "b"][i as usize % 2], i)).collect();
    let results = enqueuer.enqueue_batch(&mut con, &first).await.unwrap();
    assert!(
        results.iter().all(|r| matches!(r, Ok(Outcome::Queued))),
        "{results:?}"
    );
    let (n1, n2, n3) = (job("a", 10), job("c", 11), job("b", 12));
    let second = vec![
        first[1].clone(),
        n1.clone(),
        first[3].clone(),
        n1.clone(),
        first[0].clone(),
        n2.clone(),
        first[5].clone(),
        n3.clone(),
        first[4].clone(),
    ];
    let results = enqueuer.enqueue_batch(&mut con, &second).await.unwrap();
    let outcomes: Vec<_> = results.iter().map(|r| r.as_ref().ok().copied()).collect();
    use Outcome::{Duplicate as D, Queued as Q};
    assert_eq!(
        outcomes,
        [D, Q, D, D, D, Q, D, Q, D].map(Some).to_vec(),
        "{results:?}"
    );
    // The older message, then the jobs in the order they were first sent.
    assert_eq!(
        ids(&ns, "a").await,
        vec![
            "older message of a".to_owned(),
            id(&first[0]),
            id(&first[2]),
            id(&first[4]),
            id(&n1)
        ]
    );
    assert_eq!(
        ids(&ns, "b").await,
        vec![
            "older message of b".to_owned(),
            id(&first[1]),
            id(&first[3]),
            id(&first[5]),
            id(&n3)
        ]
    );
    assert_eq!(ids(&ns, "c").await, vec![id(&n2)]);
}

/// A list key of another type refuses the jobs bound for it (no marker, nothing pushed); the
/// call's other jobs go out, their duplicates taken back out as before.
#[tokio::test]
async fn a_list_key_of_another_type_refuses_only_its_jobs() {
    let ns = Namespace::new();
    let enqueuer = celery_enqueuer(&ns);
    let mut con = ns.con().await;
    let n2 = job("c", 11);
    let queued = enqueuer.enqueue(&mut con, &n2).await.unwrap();
    assert_eq!(queued, Outcome::Queued, "a job queued before the call");
    let _: () = redis::cmd("SET")
        .arg(ns.key("d"))
        .arg("not a list")
        .query_async(&mut con)
        .await
        .unwrap();
    let (r1, r2) = (job("d", 20), job("c", 21));
    let third = vec![r1.clone(), n2.clone(), r2.clone(), r1.clone()];
    let results = enqueuer.enqueue_batch(&mut con, &third).await.unwrap();
    assert!(
        matches!(&results[0], Err(Error::Refused { message, .. }) if message.contains("WRONGTYPE")),
        "{results:?}"
    );
    assert!(matches!(results[1], Ok(Outcome::Duplicate)), "{results:?}");
    assert!(matches!(results[2], Ok(Outcome::Queued)), "{results:?}");
    assert!(
        matches!(results[3], Err(Error::Refused { .. })),
        "{results:?}"
    );
    assert_eq!(ids(&ns, "c").await, vec![id(&n2), id(&r2)]);
    let marker: bool = redis::cmd("EXISTS")
        .arg(enqueuer.marker_key(r1.uuid).expect("a marker key"))
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(!marker, "no marker for a refused job");
    let value: String = redis::cmd("GET")
        .arg(ns.key("d"))
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(value, "not a list");
}
