//! jobrelay's integration tests, one crate with a module per capability:
//!
//! - `enqueue`: the enqueue algorithm against Redis (every branch, dedup markers, namespace);
//! - `relay`: the claim loop (claim, settle, workers, sweep, limits, hostile rows, supervision);
//! - `wakeup`: NOTIFY and the advisory wake-up lock;
//! - `marks`: dedup markers as members of sets (the bullmq and rq layouts);
//! - `faults`: process deaths, Redis and Postgres outages, rows that fail (the suites that hold
//!   for every layout run once per layout: `common::layouts::per_layout!`);
//! - `producer`, `producer_only`: the producer library and its dependency footprint;
//! - `conveyor`: the conveyor layout, checked by a Rust port of conveyor's consumer;
//! - `consumer`: the jobrelay layout's reference consumer (docs/consumer.md), in Python;
//! - `sidekiq`: the sidekiq layout, checked by the real Sidekiq worker and API;
//! - `celery`: the celery layout, checked by a real Celery worker;
//! - `bullmq`: the bullmq layout, checked by a real BullMQ `Worker`, `QueueEvents` and its API;
//! - `rq`: the rq layout, checked by real RQ workers and RQ's API;
//! - `config`: flags, environment, files, validation;
//! - `ordering`: per-key order (`ordering_key`) across a fleet, through faults, per layout;
//! - `ops`: metrics, probes, TLS, secrets, `check`, roles, deploy files, the HTTP listener;
//! - `bench`: the benchmark programs run tiny so that they cannot rot;
//! - `docs`: every code block of the README and docs/ (docs/layouts/ too) runs (or compiles,
//!   parses), every link resolves, and the README's test command is the one CI runs.
//!
//! Shared helpers live in `common`. Tests need `DATABASE_URL` (for `#[sqlx::test]`) and the
//! shared Redis (`REDIS_URL`, default 127.0.0.1:6379); waits are bounded by deadlines.
//! `#[sqlx::test]` keeps its bookkeeping (the schema `_sqlx_test`) in the database
//! `DATABASE_URL` names and never drops it: name one of the suite's own (`script/test` creates
//! `jobrelay_test`), never a database others share.

mod common;

mod bench;
mod bullmq;
mod celery;
mod config;
mod consumer;
mod conveyor;
mod docs;
mod enqueue;
mod faults;
mod marks;
mod ops;
mod ordering;
mod producer;
mod producer_only;
mod relay;
mod rq;
mod sidekiq;
mod wakeup;
