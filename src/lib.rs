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
//! From the top down; a module uses only those below it.
//!
//! - [`assembly`]: the daemon's relay in one call: the relay's claim loop with the broker's
//!   Redis sinks and probe plugged into its seam. The one module that names both sides.
//! - [`relay`]: the claim loop (claim, push through a [`sink::JobSink`], delete or hand back),
//!   claim slots, the sweep, health, the probe of Postgres, supervision, and
//!   [`relay::wakeup`] (LISTEN and the advisory wake-up lock). It names no Redis type and no
//!   layout: what a runner needs of the claim comes as a [`sink::ClaimNeeds`].
//! - [`producer`]: the pending-job API for applications (build jobs, write their rows in the
//!   caller's transaction, fast-path push after commit); [`sqlx`] and [`redis`] are the
//!   client crates it is built with, re-exported so that versions never need matching.
//! - [`broker`]: everything that talks to Redis: the connection, the enqueue algorithm
//!   (docs/layouts/algorithm.md), the layouts (one module per runner, [`LayoutKind::ALL`]:
//!   wire format, keys, Lua scripts, peek, configuration rules, claim needs), the Redis sink,
//!   probe and housekeeping.
//! - [`sink`]: the seam between the relay and where its jobs go ([`sink::JobSink`],
//!   [`sink::SinkProbe`], [`sink::ClaimNeeds`]).
//! - [`config`]: flags, environment, TOML, validation; [`http`]: `/metrics`, `/healthz`,
//!   `/readyz`; [`admin`]: `status`, `dead-letter`, `peek`.
//! - [`telemetry`]: metrics, logs, the events that both log and count, redaction.
//! - [`db`]: migrations and pools; [`table`]: outbox table names; [`report`]: what a batch
//!   or a sweep did.
//! - [`job`]: the job, its validation and outcomes; [`error`]: the one error type and its
//!   classes; [`proto`]: the protobuf wire format.
//! - The binary (`src/main.rs`, `src/commands/`, one file per command) uses only this
//!   library's public API, with the feature `daemon` (default).

#![warn(missing_docs, unreachable_pub)]

pub mod admin;
pub mod assembly;
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
pub mod report;
pub mod sink;
pub mod table;
pub mod telemetry;

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
