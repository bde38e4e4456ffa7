//! Settling a batch: rows stay until Redis acknowledged their jobs (delete-after-ack,
//! docs/guarantees.md#the-relay-step), through a sink that acknowledges half and then fails.

use crate::common::batch::*;
use crate::common::*;
use chrono::{DateTime, Utc};
use jobrelay::broker::enqueue::JobResult;
use jobrelay::relay::{Batcher, JobSink};
use jobrelay::{Enqueuer, Error, ErrorClass, Job, Outcome};
use sqlx::PgPool;
use uuid::Uuid;

/// Pushes the first half of a batch for real, then fails the push as a whole (transient).
struct HalfThenFail {
    enqueuer: Enqueuer,
    con: redis::aio::MultiplexedConnection,
}

impl JobSink for HalfThenFail {
    async fn push(&self, jobs: &[Job]) -> jobrelay::Result<Vec<JobResult>> {
        let mut con = self.con.clone();
        let half = &jobs[..jobs.len() / 2];
        let results = self.enqueuer.enqueue_batch(&mut con, half).await?;
        assert!(results.iter().all(|r| matches!(r, Ok(Outcome::Queued))));
        Err(Error::Redis(redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "injected: connection reset after half the batch",
        ))))
    }
}

#[sqlx::test]
async fn rows_stay_until_redis_acknowledges(pool: PgPool) {
    let ns = Namespace::new();
    const N: usize = 10;
    for i in 0..N {
        insert_job(
            &pool,
            &NewRow {
                payload: Some(format!("job-{i}").into_bytes()),
                ..NewRow::default()
            },
        )
        .await;
    }
    let before: Vec<(i64, Uuid, i32, DateTime<Utc>)> =
        sqlx::query_as("SELECT id, uuid, attempts, available_at FROM pending_jobs ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();

    let failing = Batcher::new(
        pool.clone(),
        queries(),
        settings(N),
        HalfThenFail {
            enqueuer: Enqueuer::new(ns.prefix.clone(), TTL),
            con: ns.con().await,
        },
    );
    let err = failing.run_once(None).await.expect_err("the push failed");
    assert_eq!(err.class(), ErrorClass::Transient, "{err}");

    // Half of the jobs did reach Redis, yet every row is still there, untouched.
    assert_eq!(
        ns.llen("queue:billing").await,
        N / 2,
        "the sink pushed half for real"
    );
    let after: Vec<(i64, Uuid, i32, DateTime<Utc>)> =
        sqlx::query_as("SELECT id, uuid, attempts, available_at FROM pending_jobs ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        after, before,
        "rows kept with attempts and available_at unchanged"
    );
    let errors: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pending_jobs WHERE last_error IS NOT NULL")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(errors, 0);

    // The real sink delivers each exactly once: the first half turns into duplicates.
    let r = drain(&batcher(&pool, &ns, TTL, N).await).await;
    assert_eq!(r.claimed, N as u64, "{r}");
    assert_eq!(r.outcome(Outcome::Duplicate), (N / 2) as u64, "{r}");
    assert_eq!(r.outcome(Outcome::Queued), (N - N / 2) as u64, "{r}");
    assert_eq!(pending_count(&pool).await, 0);
    let got = queue_uuids(&ns, "queue:billing").await;
    let want: Vec<String> = before.iter().map(|(_, u, _, _)| u.to_string()).collect();
    assert_eq!(got, want, "each job exactly once, in id order");
}

/// The hand-back of a refused row fails (here a constraint the re-inserted row breaks; a full
/// tablespace in `ops::postgres_states`): the batch is rolled back and the rows Redis
/// acknowledged are deleted on their own, the refused one stays pending as it was. Once the
/// hand-back can be written, it is, as before.
#[sqlx::test]
async fn a_failed_hand_back_keeps_the_refused_row_and_settles_the_rest(pool: PgPool) {
    let ns = Namespace::new();
    const N: usize = 10;
    insert_job(
        &pool,
        &NewRow {
            queue: Some("poison"),
            ..NewRow::default()
        },
    )
    .await;
    for i in 1..N {
        insert_job(
            &pool,
            &NewRow {
                payload: Some(format!("job-{i}").into_bytes()),
                ..NewRow::default()
            },
        )
        .await;
    }
    let mut con = ns.con().await;
    let _: () = redis::cmd("SET")
        .arg(ns.key("queue:poison"))
        .arg("not a list")
        .query_async(&mut con)
        .await
        .unwrap();
    sqlx::query(
        "ALTER TABLE pending_jobs ADD CONSTRAINT no_hand_back CHECK (attempts = 0) NOT VALID",
    )
    .execute(&pool)
    .await
    .unwrap();

    let b = batcher(&pool, &ns, TTL, N).await;
    let r = b
        .run_once(None)
        .await
        .expect("the acknowledged rows settle");
    assert_eq!(r.claimed, N as u64, "{r}");
    assert_eq!(r.outcome(Outcome::Queued), (N - 1) as u64, "{r}");
    assert_eq!((r.refused, r.kept, r.handed_back), (1, 1, 0), "{r:?}");
    let cut = r
        .unsettled
        .as_ref()
        .expect("the hand-back failure is reported");
    assert_eq!(cut.dependency, jobrelay::error::Dependency::Postgres);
    assert!(cut.error.contains("no_hand_back"), "{}", cut.error);
    assert!(r.interrupted.is_none());
    let left: Vec<(String, i32, Option<String>)> =
        sqlx::query_as("SELECT queue, attempts, last_error FROM pending_jobs")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(left, [("poison".to_owned(), 0, None)], "pending as it was");
    assert_eq!(ns.llen("queue:billing").await, N - 1);

    // Once the row can be written back, it is: attempts + 1, with the refusal.
    sqlx::query("ALTER TABLE pending_jobs DROP CONSTRAINT no_hand_back")
        .execute(&pool)
        .await
        .unwrap();
    let r = b.run_once(None).await.unwrap();
    assert_eq!((r.claimed, r.refused, r.handed_back), (1, 1, 1), "{r:?}");
    assert!(r.unsettled.is_none());
    let (attempts, error): (i32, String) =
        sqlx::query_as("SELECT attempts, last_error FROM pending_jobs")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(attempts, 1);
    assert!(error.contains("WRONGTYPE"), "{error}");
    assert_eq!(
        ns.llen("queue:billing").await,
        N - 1,
        "nothing pushed twice"
    );
}
