//! The producer library (docs/schema.md#producing-jobs) against real Postgres and Redis.
//!
//! - building jobs: defaults, every field, refusals naming the field;
//! - rows written in the caller's transaction: rolled back, no row and no job; committed, the
//!   relay delivers them; many jobs, one INSERT statement (proved by a statement-level trigger
//!   and by counting the Execute messages on the wire);
//! - the fast path: push and delete without a relay; with Redis down (error, rows kept, the
//!   relay delivers each job once); racing a running relay (each job once); per-job refusals
//!   (only those rows stay); a custom `--table`;
//! - `connect_redis`: the fast path's connection from a URL;
//! - the examples: `examples/things.rs` (its `run`) and `examples/plain_sql.sql` (via psql).

mod builder;
mod connect;
mod examples;
mod fast_path;
mod transaction;

#[allow(dead_code)]
#[path = "../../../examples/things.rs"]
mod things_example;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::child::RelayChild;
use crate::common::redis_server::RedisServer;
use crate::common::*;
use chrono::{DateTime, Utc};
use jobrelay::producer::{JobBuilder, Producer, Stage};
use jobrelay::{Error, ErrorClass, Outcome, TableName};
use sqlx::{Connection, PgConnection, PgPool};
use uuid::Uuid;

const DEADLINE: Duration = Duration::from_secs(60);

fn producer(ns: &Namespace) -> Producer {
    Producer::new(ns.prefix.clone())
}

async fn count(pool: &PgPool, table: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
        .fetch_one(pool)
        .await
        .unwrap()
}

/// `jobrelay --sweep --older-than 0s` against the test database and `ns`; returns stdout.
async fn sweep(pool: &PgPool, ns: &Namespace, extra: &[&str]) -> (i32, String) {
    let db = database_url_of(pool).await;
    let mut args = vec!["--sweep", "--older-than", "0s"];
    args.extend_from_slice(extra);
    let (code, out, err) = run_relay(
        &args,
        &[
            ("DATABASE_URL", &db),
            ("REDIS_URL", &ns.url),
            ("JOBRELAY_NAMESPACE", &ns.prefix),
        ],
    )
    .await;
    (code, format!("stdout: {out}\nstderr: {err}"))
}

fn uuids_of(jobs: &[jobrelay::proto::v1::Job]) -> Vec<Uuid> {
    jobs.iter().map(|j| j.uuid.parse().unwrap()).collect()
}

fn field_of(e: Error) -> &'static str {
    match e {
        Error::InvalidJob { field, .. } => field,
        other => panic!("expected InvalidJob, got {other:?}"),
    }
}
