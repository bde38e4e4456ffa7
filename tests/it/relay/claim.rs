//! The claim: only committed rows are relayed, one worker delivers in id order, and the smallest
//! end-to-end path (one plain row to its queue).

use std::time::Duration;

use crate::common::batch::*;
use crate::common::child::RelayChild;
use crate::common::*;
use sqlx::PgPool;
use uuid::Uuid;

#[sqlx::test]
async fn rolled_back_rows_never_reach_redis(pool: PgPool) {
    let ns = Namespace::new();
    let child = idle_daemon(&pool, &ns).await;

    let ghost = Uuid::new_v4();
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("INSERT INTO pending_jobs (uuid, queue, job_type) VALUES ($1, 'billing', 'Ghost')")
        .bind(ghost)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();

    let sentinel = insert_job(&pool, &NewRow::default()).await;
    wait_until("sentinel relayed", Duration::from_secs(5), || async {
        ns.llen("queue:billing").await == 1
    })
    .await;
    stop(child).await;
    assert_eq!(
        queue_uuids(&ns, "queue:billing").await,
        vec![sentinel.uuid.to_string()]
    );
    assert_eq!(
        get_raw(&ns, &marker(ghost)).await,
        None,
        "no marker for the rolled-back row"
    );
    assert_eq!(
        ns.marker_count().await,
        2,
        "markers: the first row and the sentinel"
    );
    assert_eq!(pending_count(&pool).await, 0);
}

#[sqlx::test]
async fn one_worker_delivers_in_id_order(pool: PgPool) {
    let ns = Namespace::new();
    // Ids are a permutation of 1..=100 inserted out of order, so the table's physical order is
    // not the id order: only an ORDER BY id claim (and an ordered push) delivers in id order.
    sqlx::query(
        "INSERT INTO pending_jobs (id, queue, job_type, payload)
         SELECT (i * 37) % 101, 'ordered', 'Step', convert_to(lpad(((i * 37) % 101)::text, 3, '0'), 'UTF8')
         FROM generate_series(1, 100) AS i",
    )
    .execute(&pool)
    .await
    .unwrap();
    let physical: Vec<i64> = sqlx::query_scalar("SELECT id FROM pending_jobs")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert!(
        physical.windows(2).any(|w| w[0] > w[1]),
        "heap order differs from id order"
    );

    let db = database_url_of(&pool).await;
    let child = RelayChild::start(
        &db,
        &ns.url,
        &ns.prefix,
        &["--workers", "1", "--batch-size", "7"],
    );
    wait_until("all relayed", Duration::from_secs(30), || async {
        ns.llen("queue:ordered").await == 100
    })
    .await;
    stop(child).await;
    let payloads: Vec<String> = ns
        .list_jobs("queue:ordered")
        .await
        .into_iter()
        .map(|j| String::from_utf8(j.payload).unwrap())
        .collect();
    let want: Vec<String> = (1..=100).map(|i| format!("{i:03}")).collect();
    assert_eq!(payloads, want, "BRPOP order is id order");
    assert_eq!(pending_count(&pool).await, 0);
}

#[sqlx::test]
async fn smoke_plain_row_reaches_the_queue(pool: PgPool) {
    let ns = Namespace::new();
    insert_rows(&pool, 3, "default").await;
    let db = database_url_of(&pool).await;
    let (code, out, err) =
        run_relay(&["--sweep", "--older-than", "0s"], &relay_env(&db, &ns)).await;
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    assert_eq!(ns.llen("queue:default").await, 3);
    assert_eq!(pending_count(&pool).await, 0);
}
