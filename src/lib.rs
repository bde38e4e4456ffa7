//! # jobrelay
//!
//! A transactional-outbox relay for the pending-job pattern. An application writes a
//! `pending_jobs` row in the same Postgres transaction as its own data; the relay claims
//! committed rows with `SELECT ... FOR UPDATE SKIP LOCKED`, runs the Redis enqueue algorithm,
//! and deletes the rows only after Redis acknowledged the write: at least once, and exactly once
//! per uuid while its Redis-side dedup marker (`jobs:<uuid>`) lives (docs/guarantees.md#delivery).
//!
//! # Layout
//!
//! - [`job`]: the job and its validation; [`proto`]: its protobuf wire format.
//! - [`broker`]: everything that talks to Redis, the jobs' broker: the connection, the enqueue algorithm
//!   (docs/layouts/algorithm.md#the-enqueue-algorithm) and its layouts (`jobrelay`, `conveyor`, `sidekiq`, each
//!   with its wire format, keys and Lua script), the relay's Redis sink, the probe.
//! - [`relay`]: the claim loop, claim slots, the sweep, the sink seam, health, supervision,
//!   the daemon's assembly; [`wakeup`]: LISTEN and the advisory wake-up lock.
//! - [`producer`]: the pending-job API for applications (build jobs, write their rows in the
//!   caller's transaction, fast-path push after commit); [`sqlx`] and [`redis`] are the
//!   client crates it is built with, re-exported so that versions never need matching.
//! - [`config`]: flags, environment, TOML, validation; [`table`]: outbox table names.
//! - [`db`]: migrations and pools; [`admin`]: `status` and `dead-letter`.
//! - [`telemetry`]: metrics, logs, redaction; [`http`]: `/metrics`, `/healthz`, `/readyz`.
//! - The binary (`src/main.rs`, `src/commands/`, one file per command) uses only this
//!   library's public API, with the feature `daemon` (default).

#![warn(missing_docs, unreachable_pub)]

pub mod admin;
pub(crate) mod backoff;
pub mod broker;
pub(crate) mod columns;
#[cfg(feature = "daemon")]
pub mod config;
pub mod db;
pub mod defaults;
pub mod error;
#[cfg(feature = "daemon")]
pub mod http;
pub mod job;
mod pg_timestamp;
pub mod producer;
pub mod proto;
pub mod relay;
pub mod table;
pub mod telemetry;
pub mod wakeup;

pub use crate::broker::enqueue::{Enqueuer, Outcome};
pub use crate::broker::layout::LayoutKind;
pub use crate::error::{Error, ErrorClass, Result};
pub use crate::job::Job;
pub use crate::table::TableName;
/// The `sqlx` crate this library is built with: the producer writes its rows through an
/// `sqlx::PgConnection` of this version (`jobrelay::sqlx::PgPool::connect(url)`).
pub use ::sqlx;
/// The `redis` crate (redis-rs) this library is built with, for an application that makes its
/// own connections to pass to the producer: its types then match the library's. Most need only
/// [`producer::connect_redis`].
pub use redis;
