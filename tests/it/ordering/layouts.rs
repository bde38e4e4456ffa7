//! Every layout keeps each key's order in its runner's own queue: 2 relays of 2 workers drain
//! 4,000 rows over 40 keys committed by 4 producers meanwhile; each key's jobs are in its
//! queue list in `id` order, as the runner's workers take them (RQ's from the head, the
//! others' from the tail), each once.

use super::*;
use crate::common::child::RelayChild;
use crate::common::layouts::per_layout;

const QUEUES: [&str; 2] = ["p0", "p1"];
const ROWS: usize = 4_000;

async fn each_key_in_order_in_the_runner_s_queue(pool: PgPool, layout: TestLayout) {
    let ns = Namespace::new();
    let db = database_url_of(&pool).await;
    let mut args = vec!["--workers", "2", "--batch-size", "100"];
    args.extend(layout.args());
    let relays: Vec<RelayChild> = (0..2)
        .map(|_| RelayChild::start(&db, &ns.url, &ns.prefix, &args))
        .collect();
    let written = produce(&pool, ROWS, 40, 4, &QUEUES).await;
    let mut con = ns.con().await;
    wait_drained(
        &pool,
        &mut con,
        layout,
        &ns,
        &QUEUES,
        ROWS,
        Duration::from_secs(120),
    )
    .await;
    let (jobs, keys) = Ledger::new(&written)
        .check(&mut con, layout, &ns, &QUEUES)
        .await;
    assert_eq!((jobs, keys), (ROWS, 40));
    drop(relays);
}

per_layout!(each_key_in_order_in_the_runner_s_queue);
