//! The sidekiq layout: with `--layout sidekiq` the relay writes what Sidekiq's own client
//! writes, and the real, unmodified Sidekiq worker (Debian's `ruby-sidekiq`) runs it, exactly
//! once, with its arguments, no earlier than `run_at`; Sidekiq's API sees the jobs as its own.
//!
//! - `consumers`: the Redis side (waiting jobs, consumers) as the metrics, the log, `status`
//!   and `check` tell it;
//! - `options`: the row's job options, obeyed by the worker and stored as Sidekiq's client
//!   stores them;
//! - `proof`: the acceptance test, against a private redis-server and the worker of
//!   tests/it/common/sidekiq.rs;
//! - `script`: the enqueue script alone, on the shared Redis.

mod consumers;
mod options;
mod proof;
mod script;

use std::time::Duration;

use crate::common::exactly_once::*;
use crate::common::*;
use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use uuid::Uuid;

/// The jid of a relayed job: its uuid's 32 hex digits.
fn jid(u: Uuid) -> String {
    u.simple().to_string()
}
