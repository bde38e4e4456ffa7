//! The bullmq layout on a Redis Cluster.

use super::*;
use crate::common::cluster::Cluster;
use crate::common::http_relay::HttpRelay;

/// With BullMQ's prefix in a hash tag (`{bull}`, the relay's namespace `{bull}:`): every key of
/// the layout is in that one slot, and a BullMQ worker on ioredis's Cluster client runs the
/// relayed jobs, a delayed one too, once each with their data.
#[sqlx::test]
async fn a_bullmq_worker_on_a_redis_cluster_runs_relayed_jobs(pool: PgPool) {
    let cluster = Cluster::start().await;
    let _relay = HttpRelay::start(&pool, &cluster.url(), "{bull}:", &["--layout", "bullmq"]).await;
    let mut rows: Vec<Row> = (0..200).map(|i| Row::spread(i, NAME, payload(i))).collect();
    rows.push(Row {
        run_at: Some(Utc::now() + chrono::Duration::seconds(2)),
        ..Row::new("a", NAME, "{\"delayed\":true}")
    });
    insert(&pool, &rows).await;
    relayed(&pool, "the rows relayed").await;
    let slot = cluster.slot_of("{bull}:a:wait").await;
    for key in [
        "{bull}:b:events",
        "{bull}:c:meta",
        "{bull}:d:id",
        "{bull}:jobrelay:bullmq:marks:absent",
    ] {
        assert_eq!(cluster.slot_of(key).await, slot, "{key}");
    }
    let worker = BullmqWorker::start_on_cluster(cluster.nodes[0].port, "{bull}", &QUEUES).await;
    let runs = worker.wait_runs(rows.len(), Duration::from_secs(30)).await;
    let by_id = RunsById::new(&runs, |r| r.id.as_str());
    for r in &rows {
        let got = by_id.once(&r.uuid.to_string());
        assert_eq!(got.data, r.payload);
        if let Some(at) = r.run_at {
            assert!(got.at >= epoch(at), "ran before run_at");
        }
    }
    assert_eq!(runs.len(), rows.len());
}

/// While the namespace's slot migrates, a call is refused before it touches anything, even where
/// its wait list has moved and the node it is asked on (the target) would serve each key alone:
/// it declares a key that exists on neither node. Here the uuid's marker set is still on the
/// source; a call run on the target would find no marker and queue the job a second time.
#[tokio::test]
async fn a_call_while_the_slot_migrates_is_refused_before_it_reads_a_marker() {
    let cluster = Cluster::start().await;
    let ns = "{bullmig}:";
    let enqueuer =
        Enqueuer::new(ns.to_owned(), Duration::from_secs(60)).with_layout(LayoutKind::Bullmq);
    let mut con = cluster.con().await;
    let job = JobBuilder::new("a", "send").payload("{}").build().unwrap();
    assert_eq!(
        enqueuer.enqueue(&mut con, &job).await.unwrap(),
        Outcome::Queued
    );
    let wait = format!("{ns}a:wait");
    let slot = cluster.slot_of(&wait).await;
    let from = cluster.owner_of(slot).await;
    let to = (from + 1) % cluster.nodes.len();
    cluster.begin_migration(slot, from, to).await;
    cluster
        .migrate_keys(from, to, std::slice::from_ref(&wait))
        .await;
    // Refused (TRYAGAIN), or retried by the client until the relay's push timeout would end it.
    let again =
        tokio::time::timeout(Duration::from_secs(5), enqueuer.enqueue(&mut con, &job)).await;
    assert!(
        !matches!(again, Ok(Ok(_))),
        "the call ran while its slot migrated: {again:?}"
    );
    let on_target: Vec<String> = cluster
        .node_cmd(to, &["CLUSTER", "GETKEYSINSLOT", &slot.to_string(), "100"])
        .await
        .unwrap();
    assert_eq!(
        on_target,
        vec![wait.clone()],
        "nothing written on the target"
    );
    let rest: Vec<String> = cluster
        .node_cmd(
            from,
            &["CLUSTER", "GETKEYSINSLOT", &slot.to_string(), "100"],
        )
        .await
        .unwrap();
    cluster.migrate_keys(from, to, &rest).await;
    cluster.end_migration(slot, from, to).await;
    let mut con = cluster.con().await;
    assert_eq!(
        enqueuer.enqueue(&mut con, &job).await.unwrap(),
        Outcome::Duplicate
    );
    let queued: i64 = redis::cmd("LLEN")
        .arg(&wait)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(queued, 1, "the job is queued once");
}
