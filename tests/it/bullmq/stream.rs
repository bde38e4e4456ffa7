//! The events stream, trimmed as BullMQ trims it.

use super::*;

/// With `opts.maxLenEvents` at 150 (what a `Queue` with `streams.events.maxLen: 150` writes
/// into its meta hash), 300 jobs relayed in one call leave the stream as long as 300
/// `Queue.add`s leave BullMQ's own, give or take one stream node (an approximate trim drops
/// whole nodes; the entries' ids differ).
#[tokio::test]
async fn the_events_stream_is_trimmed_as_queue_add_trims_it() {
    const JOBS: usize = 300;
    const MAX_EVENTS: usize = 150;
    let redis = RedisServer::start();
    let url = redis.url();
    let mut con = redis.con();
    for q in ["mine", "own"] {
        let _: () = redis::cmd("HSET")
            .arg(format!("{NS}{q}:meta"))
            .arg("opts.maxLenEvents")
            .arg(MAX_EVENTS)
            .query(&mut con)
            .unwrap();
    }
    let jobs: Vec<_> = (0..JOBS)
        .map(|i| {
            JobBuilder::new("mine", NAME)
                .payload(format!("{{\"i\":{i}}}"))
                .build()
                .unwrap()
        })
        .collect();
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut acon = client.get_multiplexed_async_connection().await.unwrap();
    let enqueuer =
        Enqueuer::new(NS.to_owned(), Duration::from_secs(60)).with_layout(LayoutKind::Bullmq);
    let results = enqueuer.enqueue_batch(&mut acon, &jobs).await.unwrap();
    assert!(results.iter().all(|r| matches!(r, Ok(Outcome::Queued))));
    let node = BullmqWorker::start(port_of(&url), PREFIX, &[]).await;
    node.node(&scripts::js(
        &[
            ("MAX_EVENTS", json!(MAX_EVENTS)),
            ("JOBS", json!(JOBS)),
            ("NAME", json!(NAME)),
        ],
        include_str!("trim_baseline.js"),
    ));
    let len = |con: &mut redis::Connection, q: &str| -> usize {
        redis::cmd("XLEN")
            .arg(format!("{NS}{q}:events"))
            .query(con)
            .unwrap()
    };
    let (mine, own) = (len(&mut con, "mine"), len(&mut con, "own"));
    // Trimmed: at least maxLenEvents entries, less than one node (100 entries) more.
    for (q, n) in [("mine", mine), ("own", own)] {
        assert!(
            (MAX_EVENTS..MAX_EVENTS + 100).contains(&n),
            "{q}:events holds {n} of {} entries",
            2 * JOBS
        );
    }
    assert!(mine.abs_diff(own) < 100, "mine {mine}, BullMQ's own {own}");
    // The newest entry is the last job's `waiting`, as BullMQ's.
    let last: Vec<(String, Vec<String>)> = redis::cmd("XREVRANGE")
        .arg(format!("{NS}mine:events"))
        .arg("+")
        .arg("-")
        .arg("COUNT")
        .arg(1)
        .query(&mut con)
        .unwrap();
    let id = jobs[JOBS - 1].uuid.to_string();
    assert_eq!(last[0].1, ["event", "waiting", "jobId", id.as_str()]);
}
