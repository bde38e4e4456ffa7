//! A relay on a `redis+cluster://` URL, against a private 3-master Redis Cluster: the drain
//! goes on through a migration of the namespace's hash slot to another node (its keys moved
//! in batches while the relay pushes, as `redis-cli --cluster reshard` moves them), and every
//! job arrives exactly once, in each layout that runs on a Cluster (jobrelay, conveyor, and
//! bullmq, whose markers are members of sets: its calls declare a key that never exists, so
//! that they wait for the slot's move as the others' new marker keys make them). A namespace
//! that cannot be one slot is refused at start.

use super::*;
use crate::common::cluster::Cluster;
use crate::common::layouts::TestLayout;
use jobrelay::LayoutKind;

/// The uuids in list `key`, read through a cluster connection.
async fn cluster_list_uuids(cluster: &Cluster, layout: TestLayout, key: &str) -> Vec<String> {
    let mut con = cluster.con().await;
    let raw: Vec<Vec<u8>> = redis::cmd("LRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .query_async(&mut con)
        .await
        .unwrap();
    raw.iter().map(|b| layout.uuid_of(b)).collect()
}

async fn drain_through_a_slot_migration(pool: &PgPool, kind: LayoutKind) {
    let (test_layout, layout) = (TestLayout(kind), kind.as_str());
    const ROWS: i64 = 20_000;
    let cluster = Cluster::start().await;
    let prefix = format!("{{t{}}}:", uuid::Uuid::new_v4().simple());
    let ns = Namespace::on(&cluster.nodes[0].url()).with_prefix(&prefix);
    let queue = test_layout.queue_key(&ns, "default");
    let slot = cluster.slot_of(&queue).await;
    let from = cluster.owner_of(slot).await;
    let to = (from + 1) % cluster.nodes.len();
    let db = database_url_of(pool).await;
    // `check` sees a writable primary for the namespace's slot.
    let (code, out, err) = run_relay(
        &["check"],
        &[
            ("DATABASE_URL", db.as_str()),
            ("REDIS_URL", &cluster.url()),
            ("JOBRELAY_NAMESPACE", &prefix),
            ("JOBRELAY_LAYOUT", layout),
        ],
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("redis: ok"), "{out}");
    let inserted = insert_bulk(pool, ROWS).await;
    let mut logs = Logs::new();
    let mut relay = logs.start(&db, &cluster.url(), &ns, &["--layout", layout]);

    wait_drained_to(pool, ROWS - 3_000).await;
    let at_start = pending_count(pool).await;
    let migrating = Instant::now();
    let moved = cluster
        .migrate_slot(slot, from, to, 10, Duration::from_millis(1))
        .await;
    let at_end = pending_count(pool).await;
    println!(
        "{layout}: slot {slot} moved from node {from} to node {to}: {moved} keys in {:?}; \
         pending {at_start} -> {at_end}",
        migrating.elapsed()
    );
    assert_eq!(cluster.owner_of(slot).await, to);
    assert!(moved >= 1_000, "the slot held the relay's keys");
    assert!(at_end > 0, "the drain went on after the migration");

    wait_drained_to(pool, 0).await;
    assert!(relay.running());
    let (code, _) = relay.terminate(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0));
    // Everything on the new owner: nothing was left behind on the old one.
    let left: Vec<String> = cluster
        .node_cmd(from, &["CLUSTER", "GETKEYSINSLOT", &slot.to_string(), "10"])
        .await
        .unwrap();
    assert!(left.is_empty(), "keys left on the old owner: {left:?}");
    let in_redis = cluster_list_uuids(&cluster, test_layout, &queue).await;
    let t = tally(&inserted, &in_redis, &HashSet::new());
    t.assert_exactly_once();
    assert_eq!(t.relayed, ROWS as usize);
    assert_eq!(max_attempts_pending(pool).await, 0);
    assert_eq!(dead_count(pool).await, 0);
    let lines = log_lines(&logs.files());
    let b = Batches::of(&lines);
    assert_eq!(b.delivered(), ROWS as u64, "{b:?}");
    assert_eq!(b.refused + b.dead_lettered, 0, "{b:?}");
    let refused_while_moving = lines
        .iter()
        .filter(|l| message(l) == "batch rolled back; backing off")
        .count();
    println!("{layout}: {refused_while_moving} batches rolled back while the slot moved; {b:?}");
    figures(
        &format!("cluster_migration_{layout}"),
        t.relayed,
        b.duplicates,
        t.lost.len(),
    );
}

#[sqlx::test]
async fn cluster_drain_through_a_slot_migration_jobrelay_layout(pool: PgPool) {
    drain_through_a_slot_migration(&pool, LayoutKind::Jobrelay).await;
}

#[sqlx::test]
async fn cluster_drain_through_a_slot_migration_conveyor_layout(pool: PgPool) {
    drain_through_a_slot_migration(&pool, LayoutKind::Conveyor).await;
}

#[sqlx::test]
async fn cluster_drain_through_a_slot_migration_bullmq_layout(pool: PgPool) {
    drain_through_a_slot_migration(&pool, LayoutKind::Bullmq).await;
}

/// A namespace without a hash tag would spread a script call's keys over many slots: refused
/// at start, one line naming --namespace, exit 2, before anything connects.
#[tokio::test]
async fn a_cluster_namespace_without_a_hash_tag_is_refused_at_start() {
    let nowhere = format!("redis+cluster://127.0.0.1:{}", free_port());
    for (ns, layout) in [
        ("app:", "jobrelay"),
        ("", "jobrelay"),
        ("{}app:", "jobrelay"),
        ("conv:", "conveyor"),
    ] {
        let (code, out, err) = run_relay(
            &["check"],
            &[
                ("DATABASE_URL", "postgres://nobody@127.0.0.1:1/x"),
                ("REDIS_URL", &nowhere),
                ("JOBRELAY_NAMESPACE", ns),
                ("JOBRELAY_LAYOUT", layout),
            ],
        )
        .await;
        assert_eq!(code, 2, "{ns:?}: {out}{err}");
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "one line: {err}");
        assert!(
            lines[0].contains("namespace") && lines[0].contains("hash tag"),
            "{err}"
        );
    }
}
