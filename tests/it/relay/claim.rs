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

/// Claims start above a trailing mark (docs/guarantees.md#where-a-claim-looks): a row that
/// commits long after higher ids were claimed lies below it, and the catch-up finds it,
/// within its bound, once.
#[sqlx::test]
async fn a_row_committed_long_after_higher_ids_is_found_once_by_the_catch_up(pool: PgPool) {
    use jobrelay::relay::cursor::{FIRST_CATCH_UP, TRAIL};
    let ns = Namespace::new();
    let b = batcher(&pool, &ns, Duration::from_secs(900), 100).await;

    // A producer's transaction takes the lowest id and stays open.
    let late = Uuid::new_v4();
    let mut tx = pool.begin().await.unwrap();
    let late_id: i64 = sqlx::query_scalar(
        "INSERT INTO pending_jobs (uuid, queue, job_type) VALUES ($1, 'late', 'Late') RETURNING id",
    )
    .bind(late)
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    // Others commit higher ids and are claimed, until the mark has passed the open row.
    wait_until(
        "the mark passes the uncommitted row",
        TRAIL * 10,
        || async {
            insert_rows(&pool, 3, "early").await;
            b.run_once(None).await.unwrap();
            b.cursor().mark().is_some_and(|m| m > late_id)
        },
    )
    .await;
    tx.commit().await.unwrap();
    let committed = std::time::Instant::now();
    wait_until("the late row relayed", FIRST_CATCH_UP * 5, || async {
        b.run_once(None).await.unwrap();
        ns.llen("queue:late").await > 0
    })
    .await;
    assert!(committed.elapsed() <= FIRST_CATCH_UP * 5);
    drain(&b).await;
    assert_eq!(queue_uuids(&ns, "queue:late").await, vec![late.to_string()]);
    assert_eq!(pending_count(&pool).await, 0);
}

/// While a long transaction holds the xmin horizon, claims still start near the newest rows:
/// the dead index entries of the rows claimed before are below the mark.
#[sqlx::test]
async fn claims_walk_no_dead_rows_below_the_mark_while_the_horizon_is_held(pool: PgPool) {
    let ns = Namespace::new();
    let b = batcher(&pool, &ns, Duration::from_secs(900), 1000).await;
    let mut holder = pool.acquire().await.unwrap().detach();
    sqlx::raw_sql("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1")
        .execute(&mut holder)
        .await
        .unwrap();
    // 50,000 rows claimed and deleted: their dead tuples stay while the horizon is held.
    for _ in 0..50 {
        insert_rows(&pool, 1000, "q").await;
        assert_eq!(b.run_once(None).await.unwrap().claimed, 1000);
    }
    wait_until(
        "the mark passes the dead rows",
        Duration::from_secs(10),
        || async {
            insert_rows(&pool, 10, "q").await;
            b.run_once(None).await.unwrap();
            b.cursor().mark().is_some_and(|m| m > 50_000)
        },
    )
    .await;
    // A plain claim (the catch-up was just done or is not due) reads index entries above the
    // mark only; the table's index holds more than 50,000.
    insert_rows(&pool, 10, "q").await;
    let mark = b.cursor().mark().unwrap();
    let mut conn = pool.acquire().await.unwrap();
    sqlx::raw_sql(jobrelay::relay::queries::BEGIN)
        .execute(&mut *conn)
        .await
        .unwrap();
    let (plan,): (serde_json::Value,) = sqlx::query_as(&format!(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {}",
        queries().claim
    ))
    .bind(1000_i64)
    .bind(None::<f64>)
    .bind(8_388_608_i64)
    .bind(8_388_608_i64)
    .bind(0_i32)
    .bind(mark + 1)
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await.unwrap();
    let hits = plan[0]["Plan"]["Shared Hit Blocks"].as_f64().unwrap()
        + plan[0]["Plan"]["Shared Read Blocks"].as_f64().unwrap();
    // From the lowest id the same claim visits every dead tuple's heap page (thousands of
    // buffers); above the mark, a few hundred at most.
    assert!(hits < 1_000.0, "{hits} buffers: {plan:#}");
    let (from_bottom,): (serde_json::Value,) = {
        sqlx::raw_sql(jobrelay::relay::queries::BEGIN)
            .execute(&mut *conn)
            .await
            .unwrap();
        let r = sqlx::query_as(&format!(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {}",
            queries().claim
        ))
        .bind(1000_i64)
        .bind(None::<f64>)
        .bind(8_388_608_i64)
        .bind(8_388_608_i64)
        .bind(0_i32)
        .bind(i64::MIN)
        .fetch_one(&mut *conn)
        .await
        .unwrap();
        sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await.unwrap();
        r
    };
    let bottom_hits = from_bottom[0]["Plan"]["Shared Hit Blocks"]
        .as_f64()
        .unwrap();
    assert!(
        bottom_hits > 10.0 * hits,
        "from the bottom {bottom_hits} buffers, from the mark {hits}"
    );
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut holder)
        .await
        .unwrap();
    drop(conn);
    drain(&b).await;
    assert_eq!(pending_count(&pool).await, 0);
}
