//! The rq layout: with `--layout rq` the relay writes what RQ 2.x's client writes (the job hash
//! `rq:job:<uuid>`, the id on `rq:queue:<q>`, `rq:queues`, the scheduled registry), and a real,
//! unmodified `rq worker` (tests/it/common/rq.rs, JSON serializer, on a private redis-server)
//! runs each job exactly once, with its args, kwargs and headers (as the job's `meta`).
//!
//! - `proof`: the acceptance test; it starts the workers and checks everything against them
//!   and RQ's own API;
//! - `script`: the script alone (RQ's keys and a marker of its own), no worker;
//! - `descriptions`: the job hash's description and data are what RQ makes of them;
//! - `options`: the row's options (RQ's job options) reach the job as RQ's client writes them,
//!   and the worker obeys them;
//! - `cluster`: a Cluster URL is refused;
//! - `consumers`: the workers RQ records, as `jobrelay status` and `check` count them.
//!
//! The Python programs the tests run with RQ's own client are the `.py` files here.

mod cluster;
mod consumers;
mod descriptions;
mod options;
mod proof;
mod script;

use std::time::Duration;

use crate::common::exactly_once::*;
use crate::common::rq::RqApp;
use crate::common::*;
use jobrelay::producer::JobBuilder;
use jobrelay::{Enqueuer, LayoutKind, Outcome};
use serde_json::{json, Value};
use sqlx::PgPool;

/// The function every job names, and the one of the SQL example in docs/layouts/rq.md.
const FUNC: &str = "jobs.record";
const DOC_FUNC: &str = "app.tasks.send_welcome";

/// A payload of its own for job `i`: args alone (an array) or args and kwargs (an object),
/// with strings, quotes, unicode, nesting, large and fractional numbers, and long values (for
/// the description's cut).
fn payload(i: usize) -> String {
    match i % 5 {
        0 => format!("[{i}, \"job {i}\", null, true]"),
        1 => format!(
            r#"{{"args": [{i}, 2.50, -17, 12345678901234567, 1e16, 1e-5], "kwargs": {{"name": "z\u00fcrich \"{i}\"", "n": {{"deep": [1, [2, [3]]]}}}}}}"#
        ),
        2 => format!(r#"{{"kwargs": {{"only": {i}, "it's": "quote'd", "z": "a\tb\\c"}}}}"#),
        3 => format!(r#"[[{i}], {{"x": 1e3, "y": false}}, "\ud83d\ude00 {i}", "it's \"both\""]"#),
        _ => format!(
            r#"{{"args": ["{}"], "kwargs": {{"long": [{}], "b": 0.1}}}}"#,
            "w".repeat(80 + i % 7),
            (0..40)
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// What RQ's API says of the queues and their registries, as JSON: per queue `count`
/// (`Queue.count`), `scheduled`, `finished`, `failed`, `deferred` (the registries' `count`).
fn rq_api(app: &RqApp) -> Value {
    serde_json::from_str(&app.python(include_str!("api.py"))).unwrap()
}

/// The dedup TTL of [`rq_enqueuer`].
const TTL: Duration = Duration::from_secs(60);

/// An enqueuer of the rq layout under `ns`, with a one-minute dedup TTL.
fn rq_enqueuer(ns: &Namespace) -> Enqueuer {
    Enqueuer::new(ns.prefix.clone(), TTL).with_layout(LayoutKind::Rq)
}
