//! The pending-job pattern's scenario, end to end: create a `things` row and its
//! `ProcessThing` job in one transaction, commit, then push the job at once (the fast path).
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \
//! REDIS_URL=redis://127.0.0.1:6379 JOBRELAY_NAMESPACE=example: \
//!     cargo run --example things
//! ```
//!
//! It applies jobrelay's migrations and creates its own `things` table if missing. If the push
//! fails (Redis down), the row stays in `pending_jobs` and a relay delivers the job later:
//! `jobrelay --sweep --older-than 0s`, or the daemon.

use jobrelay::producer::{JobBuilder, Producer, PushReport};
use jobrelay::TableName;
use sqlx::postgres::PgPoolOptions;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What the example did.
#[derive(Debug)]
pub struct Created {
    /// The new `things` row.
    pub thing_id: i64,
    /// The uuid of its `ProcessThing` job.
    pub job_uuid: uuid::Uuid,
    /// The fast path's report, or why it failed (the relay then delivers the job).
    pub fast_path: Result<PushReport, BoxError>,
}

/// Runs the scenario against `database_url` and `redis_url`, with Redis keys under
/// `namespace` (the relay's `--namespace`).
pub async fn run(
    database_url: &str,
    redis_url: &str,
    namespace: &str,
) -> Result<Created, BoxError> {
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(database_url)
        .await?;
    jobrelay::db::migrate(&pool, &TableName::default()).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS things (
             id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
             name       text NOT NULL,
             created_at timestamptz NOT NULL DEFAULT now())",
    )
    .execute(&pool)
    .await?;

    let producer = Producer::new(namespace);
    let mut jobs = producer.pending();

    // One transaction: the application's own write and the job's pending row.
    let mut tx = pool.begin().await?;
    let thing_id: i64 = sqlx::query_scalar("INSERT INTO things (name) VALUES ($1) RETURNING id")
        .bind("a thing")
        .fetch_one(&mut *tx)
        .await?;
    let job_uuid = jobs.add(
        JobBuilder::new("default", "ProcessThing")
            .json(&serde_json::json!({ "thing_id": thing_id })),
    )?;
    jobs.create_pending(&mut tx).await?;
    tx.commit().await?;

    // Committed: push now. A failure loses nothing; the row waits for the relay.
    let redis = redis::Client::open(redis_url)?;
    let fast_path = match redis.get_multiplexed_async_connection().await {
        Ok(mut con) => jobs
            .push_and_delete(&mut con, &pool)
            .await
            .map_err(BoxError::from),
        Err(e) => Err(e.into()),
    };
    pool.close().await;
    Ok(Created {
        thing_id,
        job_uuid,
        fast_path,
    })
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| default.to_owned())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let database_url = env_or(
        "DATABASE_URL",
        "postgres://postgres@127.0.0.1:5432/postgres",
    );
    let redis_url = env_or("REDIS_URL", "redis://127.0.0.1:6379");
    let namespace = env_or("JOBRELAY_NAMESPACE", "example:");
    let created = run(&database_url, &redis_url, &namespace).await?;
    println!(
        "thing {} created with job {}",
        created.thing_id, created.job_uuid
    );
    match created.fast_path {
        Ok(report) => {
            for (uuid, outcome) in &report.pushed {
                let deleted = report.deleted;
                println!("job {uuid}: {outcome} under {namespace:?}; {deleted} row(s) deleted");
            }
            for (uuid, e) in &report.refused {
                println!("job {uuid} refused by redis ({e}); its row stays for the relay");
            }
        }
        Err(e) => println!(
            "fast path failed ({e}); the row stays for the relay \
             (`jobrelay --sweep --older-than 0s`, or the daemon)"
        ),
    }
    Ok(())
}
