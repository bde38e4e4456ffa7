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
        "{bull}:jobrelay:bullmq:x",
    ] {
        assert_eq!(cluster.slot_of(key).await, slot, "{key}");
    }
    let worker = BullmqWorker::start_on_cluster(cluster.nodes[0].port, "{bull}", &QUEUES);
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
