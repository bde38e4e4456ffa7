//! Creates a `things` row and the job that processes it in one transaction, then pushes the job
//! at once. Only jobrelay (without the daemon), serde_json and tokio in its Cargo.toml:
//! `cargo run --manifest-path examples/producer-crate/Cargo.toml`.

use jobrelay::producer::{connect_redis, JobBuilder, Producer};
use jobrelay::sqlx;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    // The relay's settings, read from the same variables, so that producer and relay agree.
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let database_url =
        env("DATABASE_URL").unwrap_or(jobrelay::defaults::DEFAULT_DATABASE_URL.into());
    let redis_url = env("REDIS_URL").unwrap_or(jobrelay::defaults::DEFAULT_REDIS_URL.into());
    let producer = Producer::new(env("JOBRELAY_NAMESPACE").unwrap_or_default());

    let pool = sqlx::PgPool::connect(&database_url).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS things \
         (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, name text NOT NULL)",
    )
    .execute(&pool)
    .await?;

    let mut jobs = producer.pending(); // the jobs of one transaction
    let mut tx = pool.begin().await?;
    let id: i64 = sqlx::query_scalar("INSERT INTO things (name) VALUES ($1) RETURNING id")
        .bind("a thing")
        .fetch_one(&mut *tx)
        .await?;
    jobs.add(JobBuilder::new("default", "ProcessThing").json(&serde_json::json!({ "id": id })))?;
    jobs.create_pending(&mut tx).await?; // one INSERT for any number of jobs
    tx.commit().await?; // the job exists from here on, not before

    // Optional fast path: push now and delete the row. On failure nothing is lost: the relay
    // delivers it.
    let mut redis = connect_redis(&redis_url).await?;
    match jobs.push_and_delete(&mut redis, &pool).await {
        Ok(report) => println!("{:?}", report.pushed),
        Err(e) => eprintln!("{e}; the relay will deliver it"),
    }
    Ok(())
}
