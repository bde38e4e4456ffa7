//! The producer side: the pending-job pattern for applications (docs/schema.md#producing-jobs).
//!
//! An application that must start a job when its data changes writes the job as a pending row
//! in the same Postgres transaction as the data. Either both commit or neither does; once
//! committed, the job reaches Redis at least once: through the relay, or at once through the
//! optional fast path, with the relay as the safety net.
//!
//! - [`JobBuilder`]: a job's fields and defaults; invalid input is refused when it is built,
//!   with [`crate::Error::InvalidJob`] naming the field.
//! - [`Producer`]: the settings shared with the relay (table, namespace, dedup TTL).
//! - [`connect_redis`]: a Redis connection for the fast path from a URL, so that the
//!   application needs no `redis` crate of its own (the one the library uses is
//!   [`crate::redis`]; its Postgres client is [`crate::sqlx`]).
//! - [`PendingJobs`]: the jobs of one transaction (the pattern's `JobScheduler`):
//!   [`add`](PendingJobs::add) / [`add_all`](PendingJobs::add_all),
//!   [`create_pending`](PendingJobs::create_pending) inside the transaction (one `INSERT` for
//!   any number of jobs), then after commit [`push_and_delete`](PendingJobs::push_and_delete),
//!   or [`push`](PendingJobs::push) and [`delete_pending`](PendingJobs::delete_pending).
//!
//! The Go `JobScheduler` it is modelled on maps as: `AddJob` → [`PendingJobs::add`], `AddJobs` →
//! [`PendingJobs::add_all`], `CreatePendingJobs(tx)` → [`PendingJobs::create_pending`],
//! `PushJobs` → [`PendingJobs::push`], `DeletePendingJobs` → [`PendingJobs::delete_pending`],
//! `PushJobsAndDeletePendingJobs` → [`PendingJobs::push_and_delete`]. The enqueue algorithm alone
//! is [`crate::Enqueuer`] ([`Producer::enqueuer`]).
//!
//! # Guarantees
//!
//! - The rows are invisible to the relay until the caller's transaction commits, and are
//!   rolled back with it: no row, no job.
//! - A committed job is delivered at least once, and the Redis dedup marker `jobs:<uuid>`
//!   absorbs the second push of a job (fast path and relay racing, a crash between push and
//!   delete) while it lives (`--dedup-ttl`, 15 minutes by default): in practice, once.
//! - A fast path that fails leaves the rows in the table, and the relay delivers them; a job
//!   Redis refuses keeps its row, and the relay retries it and finally dead-letters it.
//!
//! # Example
//!
//! ```no_run
//! use jobrelay::producer::{connect_redis, JobBuilder, Producer};
//! use jobrelay::sqlx;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = sqlx::PgPool::connect("postgres://127.0.0.1/app").await?;
//! let mut redis = connect_redis("redis://127.0.0.1:6379").await?;
//! let producer = Producer::new("app1:"); // the relay's --namespace: they must agree
//!
//! let mut jobs = producer.pending();
//! let mut tx = pool.begin().await?;
//! let thing: i64 = sqlx::query_scalar("INSERT INTO things (name) VALUES ($1) RETURNING id")
//!     .bind("x")
//!     .fetch_one(&mut *tx)
//!     .await?;
//! let uuid = jobs.add(
//!     JobBuilder::new("default", "ProcessThing").json(&serde_json::json!({ "id": thing })),
//! )?;
//! jobs.create_pending(&mut tx).await?;
//! tx.commit().await?;
//!
//! match jobs.push_and_delete(&mut redis, &pool).await {
//!     Ok(report) => println!("job {uuid}: {:?}", report.pushed),
//!     Err(e) => println!("{e}"), // the relay will deliver it
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Trace context
//!
//! With the cargo feature `otel`, [`JobBuilder::build`] adds the W3C `traceparent` (and
//! `tracestate`) header of the current OpenTelemetry span, so that consumers can continue the
//! trace. It needs only the `opentelemetry` API crate; the default build has no OpenTelemetry.

mod builder;
mod connect;
mod pending;
mod settings;
mod sql;
#[cfg(feature = "otel")]
mod trace;

pub use self::builder::{IntoJob, JobBuilder};
pub use self::connect::connect_redis;
pub use self::pending::{FastPathError, PendingJobs, PushReport, RowRef, Stage};
pub use self::settings::Producer;
pub use crate::broker::connection::RedisConnection;

/// The producer's statements on `table`: `[insert, claim, delete]` (for the plan tests).
#[doc(hidden)]
pub fn statements(table: &crate::TableName) -> [String; 3] {
    let sql = sql::Sql::new(table);
    [sql.insert, sql.claim, sql.delete]
}
