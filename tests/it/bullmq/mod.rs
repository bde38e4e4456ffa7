//! The bullmq layout: with `--layout bullmq` the relay writes what BullMQ's `Queue.add` writes
//! (job hash, `id` counter, wait list, delayed set, marker, events stream), and a real,
//! unmodified BullMQ `Worker` (tests/it/common/bullmq.rs, on a private redis-server) runs each
//! job exactly once with its data, while `QueueEvents` and `Queue.getJobCounts` see the jobs as
//! their own.
//!
//! - `proof`: the acceptance test, everything checked against the worker;
//! - `script`: the script's keys held to what BullMQ's own `Queue.add` writes beside them,
//!   duplicates, refusals, paused queues;
//! - `stream`: the events stream trimmed as `Queue.add` trims it;
//! - `cluster`: on a Redis Cluster;
//! - `consumers`: the Redis side's count of a queue's workers, held to `Queue.getWorkers()`.
//!
//! The Node programs the tests run with BullMQ's own client are the `.js` files here.

mod cluster;
mod consumers;
mod options;
mod proof;
mod script;
mod stream;

use std::time::Duration;

use crate::common::bullmq::BullmqWorker;
use crate::common::exactly_once::*;
use crate::common::redis_server::RedisServer;
use crate::common::scripts;
use crate::common::*;
use chrono::Utc;
use jobrelay::producer::JobBuilder;
use jobrelay::{Enqueuer, LayoutKind, Outcome};
use serde_json::{json, Value};
use sqlx::PgPool;

/// The name every job has.
const NAME: &str = "record";
/// BullMQ's default prefix, and the relay's namespace for it.
const PREFIX: &str = "bull";
const NS: &str = "bull:";

/// A payload of its own for job `i`, written as `JSON.stringify` writes it (so that the data a
/// worker sees, stringified again, must equal it byte for byte): objects, arrays, strings with
/// unicode and escapes, nesting, fractions, large integers, a bare string and a number.
fn payload(i: usize) -> String {
    match i % 6 {
        0 => format!(r#"{{"i":{i},"s":"job {i}","n":null,"t":true}}"#),
        1 => format!(r#"[{i},2.5,-17,9007199254740991,"z√ºrich \"{i}\""]"#),
        2 => format!(r#"{{"deep":{{"a":[1,[2,[3,{{"b":"{i}"}}]]]}},"e":{{}},"l":[]}}"#),
        3 => format!(r#""a bare string {i} \\ \n 😀""#),
        4 => format!("{i}"),
        _ => format!(r#"{{"tab":"\t","q":"'","u":"\u0001","k{i}":-0.125}}"#),
    }
}

fn port_of(url: &str) -> u16 {
    url.rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .unwrap_or_else(|| panic!("a port in {url}"))
}

/// `Queue.getJobCounts()` of each queue, as JSON.
fn job_counts(worker: &BullmqWorker, queues: &[&str]) -> Value {
    let script = scripts::js(&[("QUEUES", json!(queues))], include_str!("job_counts.js"));
    serde_json::from_str(worker.node(&script).trim()).unwrap()
}
