//! The celery layout: with `--layout celery` the relay writes kombu's message envelope (task
//! protocol 2, JSON) onto the queues' lists, and a real, unmodified Celery worker
//! (tests/it/common/celery.rs, on a private redis-server) runs each job exactly once, with its
//! args, kwargs and headers.
//!
//! - `proof`: the acceptance test; it starts one worker (Celery starts slowly) and checks
//!   everything against it;
//! - `script`: the script alone (kombu's list and a marker of its own) and the fast path;
//! - `options`: the task options celery's `apply_async` takes reach the message as its client
//!   writes them, and the worker obeys them;
//! - `order`: a call takes its duplicates back out and keeps the order BRPOP meets;
//! - `repr`: argsrepr and kwargsrepr are celery's own;
//! - `claims`: a row not yet due does not keep the workers claiming;
//! - `cluster`: a Cluster URL is refused;
//! - `consumers`: the workers Redis shows, as `jobrelay status` and `check` count them.
//!
//! The Python programs the tests run with celery's own client are the `.py` files here.

mod claims;
mod cluster;
mod consumers;
mod options;
mod order;
mod proof;
mod repr;
mod script;

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::exactly_once::*;
use crate::common::*;
use jobrelay::producer::JobBuilder;
use jobrelay::{Enqueuer, Error, LayoutKind, Outcome};
use serde_json::{json, Value};
use sqlx::PgPool;

/// The task every job names, and the one of the SQL example in docs/layouts/celery.md.
const TASK: &str = "jobs.record";
const DOC_TASK: &str = "app.tasks.send_welcome";

/// A payload of its own for job `i`: args alone (an array) or args and kwargs (an object),
/// with strings, unicode, nesting, large and fractional numbers.
fn payload(i: usize) -> String {
    match i % 4 {
        0 => format!("[{i}, \"job {i}\", null, true]"),
        1 => format!(
            r#"{{"args": [{i}, 2.50, -17, 12345678901234567], "kwargs": {{"name": "z\u00fcrich \"{i}\"", "n": {{"deep": [1, [2, [3]]]}}}}}}"#
        ),
        2 => format!(r#"{{"kwargs": {{"only": {i}, "it's": "quote'd"}}}}"#),
        _ => format!(r#"[[{i}], {{"x": 1e3}}, "\ud83d\ude00 {i}"]"#),
    }
}

/// An enqueuer of the celery layout under `ns`, with a one-minute dedup TTL.
fn celery_enqueuer(ns: &Namespace) -> Enqueuer {
    Enqueuer::new(ns.prefix.clone(), Duration::from_secs(60)).with_layout(LayoutKind::Celery)
}
