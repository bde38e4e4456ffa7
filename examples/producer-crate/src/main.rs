//! Writes one job's row in the caller's transaction and pushes it after the commit, using only
//! the library: `cargo run --manifest-path examples/producer-crate/Cargo.toml`.

use jobrelay::producer::{JobBuilder, Producer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let database_url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| jobrelay::defaults::DEFAULT_DATABASE_URL.to_owned());
    let redis_url = std::env::var("REDIS_URL")
        .unwrap_or_else(|_| jobrelay::defaults::DEFAULT_REDIS_URL.to_owned());
    let pool = sqlx::PgPool::connect(&database_url).await?;
    let producer = Producer::new("example:");
    let mut jobs = producer.pending();
    jobs.add(JobBuilder::new("default", "SendWelcomeEmail").payload(b"user 42".to_vec()))?;
    let mut tx = pool.begin().await?;
    jobs.create_pending(&mut tx).await?;
    tx.commit().await?;
    let mut redis = redis::Client::open(redis_url)?
        .get_multiplexed_async_connection()
        .await?;
    let report = jobs.push_and_delete(&mut redis, &pool).await?;
    println!("{report:?}");
    Ok(())
}
