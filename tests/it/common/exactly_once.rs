//! What the four proofs with real workers (sidekiq, celery, bullmq, rq: "1,000 jobs in 10
//! transactions over 4 queues run exactly once") share: the rows and their insertion, the
//! documented SQL, the dead letters, the runs counted against the rows' uuids, and the delays
//! of scheduled jobs against the runner's own scheduling. What each runner checks of its jobs
//! (arguments, names, headers, its API) stays in its own tests.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use sqlx::PgPool;
use uuid::Uuid;

use super::{pending_count, wait_until};

/// The queues the backlog is spread over, one row in four each.
pub const QUEUES: [&str; 4] = ["a", "b", "c", "d"];
/// The backlog: this many rows, in transactions of [`PER_TRANSACTION`].
pub const BACKLOG: usize = 1000;
pub const PER_TRANSACTION: usize = 100;
/// Scheduled rows, and as many jobs the runner's own client schedules for the same moment.
pub const DELAYED: usize = 20;
/// The W3C trace context some rows carry in their headers.
pub const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
/// Relayed rows inserted again after their jobs ran.
pub const REPLAYED: usize = 50;

/// One row to insert into `pending_jobs`.
#[derive(Debug, Clone)]
pub struct Row {
    pub uuid: Uuid,
    pub queue: &'static str,
    pub job_type: &'static str,
    pub payload: String,
    pub headers: Value,
    pub run_at: Option<DateTime<Utc>>,
    pub parent: Option<Uuid>,
    pub predecessor: Option<Uuid>,
}

impl Row {
    /// A row of its own (a fresh uuid), no headers, due now, in no flow.
    pub fn new(queue: &'static str, job_type: &'static str, payload: impl Into<String>) -> Row {
        Row {
            uuid: Uuid::new_v4(),
            queue,
            job_type,
            payload: payload.into(),
            headers: json!({}),
            run_at: None,
            parent: None,
            predecessor: None,
        }
    }

    /// Row `i` of a backlog: on queue `QUEUES[i % 4]`.
    pub fn spread(i: usize, job_type: &'static str, payload: impl Into<String>) -> Row {
        Row::new(QUEUES[i % QUEUES.len()], job_type, payload)
    }
}

/// The args and kwargs a worker must receive for a payload of the celery and rq layouts: an
/// array is the args alone, an object may hold `args` and `kwargs`.
pub fn args_and_kwargs(payload: &str) -> (Value, Value) {
    let v: Value = serde_json::from_str(payload).unwrap();
    match v {
        Value::Array(_) => (v, json!({})),
        Value::Object(mut o) => (
            o.remove("args").unwrap_or(json!([])),
            o.remove("kwargs").unwrap_or(json!({})),
        ),
        other => panic!("not a fitting payload: {other}"),
    }
}

/// The [`BACKLOG`]: row `i` of `job_type` with `payload(i)`, spread over the queues; with
/// `traced`, every tenth has the headers `traceparent` ([`TRACEPARENT`]) and `tenant`.
pub fn backlog_rows(
    job_type: &'static str,
    payload: impl Fn(usize) -> String,
    traced: bool,
) -> Vec<Row> {
    (0..BACKLOG)
        .map(|i| {
            let mut r = Row::spread(i, job_type, payload(i));
            if traced && i % 10 == 0 {
                r.headers = json!({"traceparent": TRACEPARENT, "tenant": "acme"});
            }
            r
        })
        .collect()
}

/// Inserts `rows` with one statement.
pub async fn insert<'e, E: sqlx::PgExecutor<'e>>(ex: E, rows: &[Row]) {
    let column = |f: &dyn Fn(&Row) -> String| rows.iter().map(f).collect::<Vec<String>>();
    let uuids: Vec<Uuid> = rows.iter().map(|r| r.uuid).collect();
    let payloads: Vec<Vec<u8>> = rows
        .iter()
        .map(|r| r.payload.clone().into_bytes())
        .collect();
    let headers: Vec<Value> = rows.iter().map(|r| r.headers.clone()).collect();
    let run_ats: Vec<Option<DateTime<Utc>>> = rows.iter().map(|r| r.run_at).collect();
    let parents: Vec<Option<Uuid>> = rows.iter().map(|r| r.parent).collect();
    let predecessors: Vec<Option<Uuid>> = rows.iter().map(|r| r.predecessor).collect();
    sqlx::query(
        "INSERT INTO pending_jobs (uuid, queue, job_type, payload, headers, run_at, parent_uuid,
                                   predecessor_uuid)
         SELECT u, q, t, p, h, r, pa, pr
         FROM unnest($1::uuid[], $2::text[], $3::text[], $4::bytea[], $5::jsonb[],
                     $6::timestamptz[], $7::uuid[], $8::uuid[]) AS x(u, q, t, p, h, r, pa, pr)",
    )
    .bind(&uuids)
    .bind(column(&|r| r.queue.to_owned()))
    .bind(column(&|r| r.job_type.to_owned()))
    .bind(&payloads)
    .bind(&headers)
    .bind(&run_ats)
    .bind(&parents)
    .bind(&predecessors)
    .execute(ex)
    .await
    .expect("rows inserted");
}

/// Commits `unfit` (rows the layout dead-letters; lowest ids, so that the rows behind them
/// must still go out) in a transaction of their own, then `rows` in transactions of
/// [`PER_TRANSACTION`].
pub async fn commit_backlog(pool: &PgPool, unfit: &[Row], rows: &[Row]) {
    let mut tx = pool.begin().await.unwrap();
    insert(&mut *tx, unfit).await;
    tx.commit().await.unwrap();
    for chunk in rows.chunks(PER_TRANSACTION) {
        let mut tx = pool.begin().await.unwrap();
        insert(&mut *tx, chunk).await;
        tx.commit().await.unwrap();
    }
}

/// [`DELAYED`] rows due at `due`, spread over the queues, with `payload(i)`.
pub fn delayed_rows(
    job_type: &'static str,
    due: DateTime<Utc>,
    payload: impl Fn(usize) -> String,
) -> Vec<Row> {
    (0..DELAYED)
        .map(|i| Row {
            run_at: Some(due),
            ..Row::spread(i, job_type, payload(i))
        })
        .collect()
}

/// The first [`REPLAYED`] of `rows`, taken out, as rows to insert again (without headers: a
/// replay is known by its uuid alone).
pub fn replay_of(rows: &mut Vec<Row>) -> Vec<Row> {
    rows.drain(..REPLAYED)
        .map(|r| Row {
            headers: json!({}),
            ..r
        })
        .collect()
}

/// A row per queue of [`QUEUES`], committed after a replay: a job the replay wrongly queued
/// waits in its queue in front of that queue's sentinel, so once every sentinel ran, such a job
/// has been taken by the worker too (no guessing how long a worker takes to find a stray job).
pub fn sentinels(job_type: &'static str, payload: impl Fn(usize) -> String) -> Vec<Row> {
    QUEUES
        .iter()
        .enumerate()
        .map(|(i, q)| Row::new(q, job_type, payload(10_000 + i)))
        .collect()
}

/// Commits [`sentinels`] and waits until the relay has relayed them.
pub async fn commit_sentinels(
    pool: &PgPool,
    job_type: &'static str,
    payload: impl Fn(usize) -> String,
) -> Vec<Row> {
    let rows = sentinels(job_type, payload);
    insert(pool, &rows).await;
    relayed(pool, "the sentinels relayed").await;
    rows
}

/// The moment `after` from now, to the microsecond (what Postgres keeps of a `run_at`).
pub fn due_in(after: chrono::Duration) -> DateTime<Utc> {
    DateTime::from_timestamp_micros((Utc::now() + after).timestamp_micros()).unwrap()
}

/// Epoch seconds with the microseconds, as the workers' clocks are.
pub fn epoch(t: DateTime<Utc>) -> f64 {
    t.timestamp_micros() as f64 / 1e6
}

/// The first ```sql block of the runner's page `docs/layouts/<page>` after `marker` (a section's
/// heading, e.g. `"\n## Producing an RQ job"`, or a comment marking the block), before the next
/// section.
pub fn doc_sql(page: &str, marker: &str) -> String {
    let path = format!("{}/docs/layouts/{page}", env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let after = doc
        .split_once(marker)
        .unwrap_or_else(|| panic!("{marker:?} in docs/layouts/{page}"))
        .1;
    let section = after.split("\n## ").next().unwrap();
    let block = section
        .split_once("```sql\n")
        .unwrap_or_else(|| panic!("a sql block after {marker:?}"))
        .1;
    block
        .split_once("```")
        .expect("the block's end")
        .0
        .to_owned()
}

/// Runs the SQL block of `docs/layouts/<page>` after `marker` in a transaction of its own, as
/// an application would.
pub async fn run_doc_sql(pool: &PgPool, page: &str, marker: &str) {
    let mut tx = pool.begin().await.unwrap();
    sqlx::raw_sql(&doc_sql(page, marker))
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
}

/// Waits (30 s at most) until `pool` has no pending row.
pub async fn relayed(pool: &PgPool, what: &str) {
    wait_until(what, Duration::from_secs(30), || async {
        pending_count(pool).await == 0
    })
    .await;
}

/// The dead letters are `expected`, in that order (by id), each reason naming the layout
/// (`does not fit the <layout> layout`) and what is wrong.
pub async fn assert_dead_letters(pool: &PgPool, layout: &str, expected: &[(Uuid, &str)]) {
    let dead: Vec<(Uuid, String)> =
        sqlx::query_as("SELECT uuid, last_error FROM pending_jobs_dead ORDER BY id")
            .fetch_all(pool)
            .await
            .unwrap();
    let uuids: Vec<Uuid> = dead.iter().map(|(u, _)| *u).collect();
    let want: Vec<Uuid> = expected.iter().map(|(u, _)| *u).collect();
    assert_eq!(uuids, want, "dead letters: {dead:#?}");
    let fit = format!("does not fit the {layout} layout");
    for ((uuid, error), (_, says)) in dead.iter().zip(expected) {
        assert!(
            error.contains(&fit) && error.contains(says),
            "{uuid}: {error}"
        );
    }
}

/// A run a real worker recorded.
pub trait Ran {
    /// When it ran, epoch seconds by the worker's clock.
    fn at(&self) -> f64;
}

macro_rules! ran {
    ($($run:ty),*) => {
        $(impl Ran for $run {
            fn at(&self) -> f64 {
                self.at
            }
        })*
    };
}
ran!(
    super::bullmq::Run,
    super::celery::Run,
    super::rq::Run,
    super::sidekiq::Run
);

/// The docs' example of the celery and rq layouts (`send_welcome(42, lang="de")` in the queue
/// `emails`) ran once, with its arguments: `ran` holds the args and kwargs of each run of its
/// task.
pub fn assert_the_docs_example_ran(ran: &[(&Value, &Value)]) {
    assert_eq!(ran.len(), 1, "the docs' example");
    assert_eq!(ran[0], (&json!([42]), &json!({"lang": "de"})));
}

/// The runs a worker recorded, by job id.
pub struct RunsById<'a, R>(HashMap<&'a str, Vec<&'a R>>);

impl<'a, R: Ran> RunsById<'a, R> {
    /// `runs` by `id` (what the worker calls the job).
    pub fn new(runs: &'a [R], id: impl Fn(&'a R) -> &'a str) -> Self {
        let mut m: HashMap<&str, Vec<&R>> = HashMap::new();
        for r in runs {
            m.entry(id(r)).or_default().push(r);
        }
        RunsById(m)
    }

    /// The one run of job `id`; panics if it never ran or ran more than once.
    pub fn once(&self, id: &str) -> &'a R {
        let got = self
            .0
            .get(id)
            .unwrap_or_else(|| panic!("job {id} did not run"));
        assert_eq!(got.len(), 1, "job {id} ran {} times", got.len());
        got[0]
    }

    /// When each of the jobs `ids` ran (each once).
    pub fn times<S: AsRef<str>>(&self, ids: impl IntoIterator<Item = S>) -> Vec<f64> {
        ids.into_iter()
            .map(|id| self.once(id.as_ref()).at())
            .collect()
    }

    /// None of the jobs `ids` (dead letters) ran.
    pub fn assert_none_ran<S: AsRef<str>>(&self, ids: impl IntoIterator<Item = S>) {
        for id in ids {
            let id = id.as_ref();
            assert!(!self.0.contains_key(id), "dead {id} ran");
        }
    }

    /// The ids of the jobs that ran more than once.
    pub fn twice(&self) -> Vec<&'a str> {
        self.0
            .iter()
            .filter(|(_, r)| r.len() > 1)
            .map(|(id, _)| *id)
            .collect()
    }
}

/// Scheduled jobs ran in time: `relayed` (when the relayed ones ran, epoch seconds) none before
/// `due`, and none more than 2 s after the last of `baseline` (when the jobs that `runner`'s
/// own client scheduled for `due` ran).
pub fn assert_delays(runner: &str, due: DateTime<Utc>, relayed: &[f64], baseline: &[f64]) {
    let due = epoch(due);
    let relayed: Vec<f64> = relayed.iter().map(|at| at - due).collect();
    let baseline: Vec<f64> = baseline.iter().map(|at| at - due).collect();
    let max = |v: &[f64]| v.iter().cloned().fold(f64::MIN, f64::max);
    let min = |v: &[f64]| v.iter().cloned().fold(f64::MAX, f64::min);
    eprintln!(
        "run_at delays: relayed {:.3}..{:.3} s, {runner} {:.3}..{:.3} s",
        min(&relayed),
        max(&relayed),
        min(&baseline),
        max(&baseline)
    );
    assert!(!relayed.is_empty() && !baseline.is_empty());
    assert!(min(&relayed) >= 0.0, "ran before run_at: {relayed:?}");
    assert!(
        max(&relayed) <= max(&baseline) + 2.0,
        "relayed {relayed:?}, {runner} {baseline:?}"
    );
}
