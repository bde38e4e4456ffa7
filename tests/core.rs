//! Issue 2 acceptance: the enqueue algorithm's branches, dedup, the relay loop, sweep.

mod common;

use std::time::Duration;

use common::*;
use sqlx::PgPool;

#[sqlx::test]
async fn smoke_plain_row_reaches_the_queue(pool: PgPool) {
    let ns = Namespace::new();
    insert_rows(&pool, 3, "default").await;
    let db = database_url_of(&pool).await;
    let (code, out, err) = run_relay(
        &["--sweep", "--older-than", "0s"],
        &[("DATABASE_URL", &db), ("REDIS_URL", &ns.url), ("JOBRELAY_NAMESPACE", &ns.prefix)],
    )
    .await;
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    assert_eq!(ns.llen("queue:default").await, 3);
    assert_eq!(pending_count(&pool).await, 0);
    let _ = Duration::ZERO;
}
