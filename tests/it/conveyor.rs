//! The conveyor layout: with `--layout conveyor` the relay writes
//! conveyor's wire format (`wire.Job`, proto/conveyor/wire.proto) and Redis layout, and a
//! conveyor consumer runs what it wrote exactly once and in conveyor's order.
//!
//! The consumer is tests/it/common/conveyor.rs, a port of conveyor's storage code (Pop, CloseJob,
//! AddJob, PopScheduledJobs), one Redis round trip per step as in the Go code. Its self-test
//! (`consumer_*`) needs no relay. The relays run as child processes with `--http-addr` on a
//! free port, so that the tests can read their `/metrics`.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::common::conveyor::{Conveyor, Hook, Run, Workers};
use crate::common::http_relay::HttpRelay;
use crate::common::*;
use chrono::{DateTime, Utc};
use jobrelay::proto::wire;
use prost::Message;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use sqlx::PgPool;
use uuid::Uuid;

/// A payload with zero bytes and a byte that is not UTF-8.
const PAYLOAD: &[u8] = b"\x00{\"id\":1}\x00\x00\xff\x01tail\x00";
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
/// How long a test waits for its jobs to run.
const SETTLE: Duration = Duration::from_secs(60);

// === Helpers

/// A job with a fresh uuid and fields 1-4 set.
fn job(queue: &str, job_type: &str, payload: &[u8]) -> wire::Job {
    wire::Job {
        uuid: Uuid::new_v4().to_string(),
        r#type: job_type.to_owned(),
        queue: queue.to_owned(),
        payload: payload.to_vec(),
        ..Default::default()
    }
}

/// `offset_secs` from now, at a fixed fraction (.654321 s, which Postgres keeps exactly).
fn at(offset_secs: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(Utc::now().timestamp() + offset_secs, 654_321_000).unwrap()
}

/// As `timestamppb.New(t)`: whole seconds and the nanoseconds within the second.
fn ts(t: DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: t.timestamp(),
        nanos: t.timestamp_subsec_nanos() as i32,
    }
}

fn uuid_or_null(s: &str) -> Option<Uuid> {
    (!s.is_empty()).then(|| Uuid::parse_str(s).unwrap())
}

/// Inserts the row that should become `job` (with headers, which the wire format has no
/// field for).
async fn insert<'e, E: sqlx::PgExecutor<'e>>(ex: E, job: &wire::Job) {
    let run_at = job
        .run_at
        .as_ref()
        .map(|t| DateTime::from_timestamp(t.seconds, t.nanos as u32).unwrap());
    sqlx::query(
        "INSERT INTO pending_jobs (uuid, queue, job_type, payload, parent_uuid, predecessor_uuid,
                                   run_at, headers)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(Uuid::parse_str(&job.uuid).unwrap())
    .bind(&job.queue)
    .bind(&job.r#type)
    .bind(&job.payload)
    .bind(uuid_or_null(&job.parent_uuid))
    .bind(uuid_or_null(&job.predecessor_uuid))
    .bind(run_at)
    .bind(serde_json::json!({"traceparent": TRACEPARENT, "tenant": "acme"}))
    .execute(ex)
    .await
    .expect("row inserted");
}

/// `job` as it must arrive when its parent or predecessor had already finished.
fn orphaned(job: &wire::Job) -> wire::Job {
    wire::Job {
        parent_uuid: String::new(),
        predecessor_uuid: String::new(),
        ..job.clone()
    }
}

/// Raw elements of a list, oldest push first.
async fn list_raw(ns: &Namespace, key: &str) -> Vec<Vec<u8>> {
    let mut con = ns.con().await;
    let mut raw: Vec<Vec<u8>> = redis::cmd("LRANGE")
        .arg(ns.key(key))
        .arg(0)
        .arg(-1)
        .query_async(&mut con)
        .await
        .unwrap();
    raw.reverse();
    raw
}

/// Raw members and scores of `scheduled`.
async fn scheduled_raw(ns: &Namespace) -> Vec<(Vec<u8>, f64)> {
    let mut con = ns.con().await;
    redis::cmd("ZRANGE")
        .arg(ns.key("scheduled"))
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(&mut con)
        .await
        .unwrap()
}

/// Keys of `ns` other than the relay's dedup markers (`jobrelay:...`): conveyor's.
async fn conveyor_keys(ns: &Namespace) -> Vec<String> {
    let keys = ns.keys().await;
    keys.into_iter()
        .filter(|k| !k.starts_with("jobrelay:"))
        .collect()
}

/// Waits until the workers ran and closed `n` jobs; on timeout, says what is left where.
async fn settle(w: &Workers, n: usize, ns: &Namespace, pool: &PgPool) {
    if !eventually(SETTLE, || async { w.settled(n) }).await {
        panic!(
            "{} runs of {n} expected after {SETTLE:?}; consumer errors {:?}; \
             pending rows {}; conveyor keys {:?}",
            w.runs().len(),
            w.errors(),
            pending_count(pool).await,
            conveyor_keys(ns).await
        );
    }
}

/// The one run of `job`; panics if it ran zero or several times.
fn once<'a>(runs: &HashMap<&str, Vec<&'a Run>>, job: &wire::Job) -> &'a Run {
    let r = runs
        .get(job.uuid.as_str())
        .unwrap_or_else(|| panic!("job {} never ran", job.uuid));
    assert_eq!(r.len(), 1, "job {} ran {} times", job.uuid, r.len());
    r[0]
}

fn by_uuid(runs: &[Run]) -> HashMap<&str, Vec<&Run>> {
    let mut map: HashMap<&str, Vec<&Run>> = HashMap::new();
    for r in runs {
        map.entry(r.job.uuid.as_str()).or_default().push(r);
    }
    map
}

/// A relay in the conveyor layout (`args` after `--layout conveyor`), not waited for.
async fn spawn_relay(pool: &PgPool, ns: &Namespace, args: &[&str]) -> HttpRelay {
    let mut all = vec!["--layout", "conveyor"];
    all.extend_from_slice(args);
    HttpRelay::spawn(pool, &ns.url, &ns.prefix, &all).await
}

/// The same, once it answers /readyz.
async fn start_relay(pool: &PgPool, ns: &Namespace, args: &[&str]) -> HttpRelay {
    let r = spawn_relay(pool, ns, args).await;
    r.ready().await;
    r
}

/// Two relays on the same table and namespace, batch sizes 2 and 3, two workers each; both
/// started before either is waited for, so that they compete from the start.
async fn two_relays(pool: &PgPool, ns: &Namespace) -> [HttpRelay; 2] {
    let a = spawn_relay(pool, ns, &["--batch-size", "2", "--workers", "2"]).await;
    let b = spawn_relay(pool, ns, &["--batch-size", "3", "--workers", "2"]).await;
    a.ready().await;
    b.ready().await;
    [a, b]
}

// === Flows: a parent, two children, one or two heirs (conveyor's EnqueueChild, EnqueueHeir)

const PARENT_Q: &str = "flow.Parent";
const CHILD_Q: &str = "flow.Child";
const HEIR_Q: &str = "flow.Heir";
const FLOW_QUEUES: [&str; 3] = [PARENT_Q, CHILD_Q, HEIR_Q];

struct Flow {
    parent: wire::Job,
    children: Vec<wire::Job>,
    heirs: Vec<wire::Job>,
}

impl Flow {
    fn new(i: usize) -> Flow {
        let parent = job(PARENT_Q, "flow.Parent", format!("parent {i}").as_bytes());
        let children = (0..2)
            .map(|k| wire::Job {
                parent_uuid: parent.uuid.clone(),
                ..job(CHILD_Q, "flow.Child", format!("child {i}.{k}").as_bytes())
            })
            .collect();
        let heirs = (0..1 + i % 2)
            .map(|k| wire::Job {
                predecessor_uuid: parent.uuid.clone(),
                ..job(HEIR_Q, "flow.Heir", format!("heir {i}.{k}").as_bytes())
            })
            .collect();
        Flow {
            parent,
            children,
            heirs,
        }
    }

    fn jobs(&self) -> impl Iterator<Item = &wire::Job> {
        std::iter::once(&self.parent)
            .chain(&self.children)
            .chain(&self.heirs)
    }

    /// The flow's jobs in an order of its own: shuffled (seeded by `i`), then the parent
    /// first for one flow in three and an heir first for another one in three.
    fn insert_order(&self, i: usize) -> Vec<&wire::Job> {
        let mut jobs: Vec<&wire::Job> = self.jobs().collect();
        jobs.shuffle(&mut rand::rngs::StdRng::seed_from_u64(i as u64));
        let first = match i % 3 {
            0 => Some(&self.parent.uuid),
            1 => Some(&self.heirs[0].uuid),
            _ => None,
        };
        if let Some(pos) = first.and_then(|u| jobs.iter().position(|j| &j.uuid == u)) {
            let j = jobs.remove(pos);
            jobs.insert(0, j);
        }
        jobs
    }
}

fn flows(n: usize) -> Vec<Flow> {
    (0..n).map(Flow::new).collect()
}

fn job_count(flows: &[Flow]) -> usize {
    flows.iter().map(|f| f.jobs().count()).sum()
}

/// Commits each flow in one transaction of its own.
async fn insert_flows(pool: &PgPool, flows: &[Flow]) {
    for (i, f) in flows.iter().enumerate() {
        let mut tx = pool.begin().await.unwrap();
        for j in f.insert_order(i) {
            insert(&mut *tx, j).await;
        }
        tx.commit().await.unwrap();
    }
}

/// Every job of every flow ran exactly once, arrived as it was inserted (canonical bytes; a
/// late job would have lost its parent or predecessor), children after their parent returned,
/// heirs after the parent and every child returned; no consumer error.
fn check_flows(flows: &[Flow], w: &Workers) {
    let errors = w.errors();
    assert!(errors.is_empty(), "consumer errors: {errors:#?}");
    let runs = w.runs();
    assert_eq!(runs.len(), job_count(flows), "runs in all");
    let runs = by_uuid(&runs);
    for f in flows {
        for j in f.jobs() {
            let r = once(&runs, j);
            assert_eq!(r.job, *j, "job {} as it was popped", j.uuid);
            assert_eq!(r.bytes, j.encode_to_vec(), "bytes of {}", j.uuid);
        }
        let parent_done = once(&runs, &f.parent).handled.unwrap();
        let children_done: Vec<Instant> = f
            .children
            .iter()
            .map(|c| once(&runs, c).handled.unwrap())
            .collect();
        for c in &f.children {
            let started = once(&runs, c).popped;
            assert!(
                started > parent_done,
                "child {} ran before its parent returned",
                c.uuid
            );
        }
        for h in &f.heirs {
            let started = once(&runs, h).popped;
            assert!(
                started > parent_done,
                "heir {} ran before its predecessor",
                h.uuid
            );
            for done in &children_done {
                assert!(
                    started > *done,
                    "heir {} ran before a child of its predecessor",
                    h.uuid
                );
            }
        }
    }
}

/// The end of a flow test: everything ran in order, nothing was late, nothing is left.
async fn finish_flows(
    pool: &PgPool,
    ns: &Namespace,
    w: Workers,
    relays: &[HttpRelay],
    flows: &[Flow],
) {
    settle(&w, job_count(flows), ns, pool).await;
    wait_until("every row deleted", Duration::from_secs(30), || async {
        pending_count(pool).await == 0
    })
    .await;
    check_flows(flows, &w);
    // Children into their parent's list, heirs into their predecessor's, parents queued.
    let children: usize = flows.iter().map(|f| f.children.len()).sum();
    let heirs: usize = flows.iter().map(|f| f.heirs.len()).sum();
    for (outcome, want) in [
        ("children", children),
        ("on_complete", heirs),
        ("queued", flows.len()),
    ] {
        let mut got = 0.0;
        for r in relays {
            got += r.count(outcome).await;
        }
        assert_eq!(got, want as f64, "jobs relayed with outcome {outcome}");
    }
    for r in relays {
        assert_eq!(r.count("late").await, 0.0, "late jobs; logs:\n{}", r.logs());
        assert_eq!(r.warnings("late"), Vec::<String>::new(), "late warnings");
    }
    assert_eq!(
        conveyor_keys(ns).await,
        Vec::<String>::new(),
        "conveyor keys left"
    );
    w.stop().await;
}

// === The consumer, alone

/// The consumer runs flows pushed the way conveyor's client pushes them, in conveyor's order,
/// exactly once, and leaves no key behind: half of the flows pushed whole before any worker
/// runs, half enqueued by the parent's handler while it runs (EnqueueChild, EnqueueHeir).
#[tokio::test]
async fn consumer_runs_conveyor_flows_in_order() {
    let ns = Namespace::new();
    let c = Conveyor::connect(&ns.url, &ns.prefix).await;
    let flows = flows(100);
    let (pushed, spawning) = flows.split_at(50);
    for f in pushed {
        c.add(&f.parent, false).await.unwrap();
        for j in f.children.iter().chain(&f.heirs) {
            c.add(j, false).await.unwrap();
        }
    }
    let enqueued_by_parent: Arc<HashMap<String, Vec<wire::Job>>> = Arc::new(
        spawning
            .iter()
            .map(|f| (f.parent.uuid.clone(), f.jobs().skip(1).cloned().collect()))
            .collect(),
    );
    let hook: Hook = {
        let c = c.clone();
        Arc::new(move |job: wire::Job| {
            let (c, spawned) = (c.clone(), enqueued_by_parent.clone());
            Box::pin(async move {
                for j in spawned.get(&job.uuid).into_iter().flatten() {
                    c.add(j, false).await.expect("enqueue from the handler");
                }
            })
        })
    };
    for f in spawning {
        c.add(&f.parent, false).await.unwrap();
    }
    let w = Workers::start(&ns.url, &ns.prefix, &FLOW_QUEUES, 2, Some(hook)).await;
    let settled = eventually(SETTLE, || async { w.settled(job_count(&flows)) }).await;
    assert!(settled, "errors {:?}", w.errors());
    check_flows(&flows, &w);
    assert_eq!(ns.keys().await, Vec::<String>::new(), "keys left");
    w.stop().await;
}

/// A late child, as conveyor has it: closing a child whose parent record is gone fails with
/// NoJob and leaks the child's record (the failure the relay must never cause).
#[tokio::test]
async fn consumer_reports_a_child_whose_parent_is_gone() {
    let ns = Namespace::new();
    let c = Conveyor::connect(&ns.url, &ns.prefix).await;
    let parent = job("late.Q", "example.Parent", b"p");
    let child = wire::Job {
        parent_uuid: parent.uuid.clone(),
        ..job("late.Q", "example.Child", b"c")
    };
    // The child entered the queue as a promoted child (deadParent) of a parent that closed.
    c.add(&child, true).await.unwrap();
    let popped = c
        .pop("w", &["late.Q".to_owned()], Duration::from_secs(1))
        .await
        .unwrap()
        .expect("the child was queued");
    assert_eq!(popped.0, child);
    let err = c.close("w", &child).await.unwrap_err();
    assert!(err.to_string().starts_with("NoJob"), "{err}");
    let keys = ns.keys().await;
    assert!(keys.contains(&format!("job:{}", child.uuid)), "{keys:?}");
}

// === 1. The wire format

/// Each raw job decodes to one of `expected`, field for field, and is its canonical encoding
/// (no field jobrelay adds, fields 8-12 unset); every expected job is there.
fn assert_wire(raw: &[Vec<u8>], expected: &[&wire::Job]) {
    let mut seen = BTreeSet::new();
    for bytes in raw {
        let got = wire::Job::decode(bytes.as_slice()).expect("a wire.Job");
        let want = expected
            .iter()
            .find(|j| j.uuid == got.uuid)
            .unwrap_or_else(|| panic!("unexpected job {got:?}"));
        assert_eq!(
            got.uuid,
            Uuid::parse_str(&want.uuid)
                .unwrap()
                .hyphenated()
                .to_string()
        );
        assert_eq!(got.r#type, want.r#type, "type");
        assert_eq!(got.queue, want.queue, "queue");
        assert_eq!(got.payload, want.payload, "payload");
        assert_eq!(got.run_at, want.run_at, "run_at");
        assert_eq!(got.parent_uuid, want.parent_uuid, "parent_uuid");
        assert_eq!(
            got.predecessor_uuid, want.predecessor_uuid,
            "predecessor_uuid"
        );
        assert_eq!(got.started_at, None, "started_at");
        assert_eq!((got.retry, got.max_retries), (0, 0), "retry, max_retries");
        assert_eq!(got.last_failure, "", "last_failure");
        assert_eq!(got.status, wire::JobStatus::Unknown as i32, "status");
        assert_eq!(
            *bytes,
            want.encode_to_vec(),
            "canonical bytes of {}",
            want.uuid
        );
        assert!(seen.insert(got.uuid.clone()), "{} twice", got.uuid);
    }
    assert_eq!(seen.len(), expected.len(), "jobs found");
}

#[sqlx::test]
async fn relayed_jobs_are_conveyor_wire_jobs_field_for_field(pool: PgPool) {
    let ns = Namespace::new();
    const Q: &str = "wire.Test";
    let parent = job(Q, "example.Parent", b"parent");
    let plain = job(Q, "example.SendEmail", PAYLOAD);
    let past = wire::Job {
        run_at: Some(ts(at(-30))),
        ..job(Q, "example.Past", b"\x00past")
    };
    let child = wire::Job {
        parent_uuid: parent.uuid.clone(),
        ..job(Q, "example.Child", b"")
    };
    // Every field jobrelay writes: it waits for its parent (the parent branch comes first).
    let full = wire::Job {
        run_at: Some(ts(at(-30))),
        parent_uuid: parent.uuid.clone(),
        predecessor_uuid: plain.uuid.clone(),
        ..job(Q, "example.Full", PAYLOAD)
    };
    let mut tx = pool.begin().await.unwrap();
    for j in [&full, &child, &past, &plain, &parent] {
        insert(&mut *tx, j).await;
    }
    tx.commit().await.unwrap();
    let _relay = start_relay(&pool, &ns, &["--batch-size", "2"]).await;
    wait_until("rows relayed", Duration::from_secs(30), || async {
        pending_count(&pool).await == 0
    })
    .await;
    let children_key = format!("job:{}:children", parent.uuid);
    assert_wire(
        &list_raw(&ns, &format!("queue:{Q}")).await,
        &[&plain, &past, &parent],
    );
    assert_wire(&list_raw(&ns, &children_key).await, &[&full, &child]);
    // Nothing else: no job record (conveyor's workers write those), only dedup markers.
    let keys = ns.keys().await;
    let markers: BTreeSet<&str> = keys
        .iter()
        .filter_map(|k| k.strip_prefix("jobrelay:job:"))
        .collect();
    let all: BTreeSet<&str> = [&full, &child, &past, &plain, &parent]
        .iter()
        .map(|j| j.uuid.as_str())
        .collect();
    assert_eq!(markers, all, "dedup markers");
    let others: BTreeSet<String> = conveyor_keys(&ns).await.into_iter().collect();
    assert_eq!(others, BTreeSet::from([format!("queue:{Q}"), children_key]));
}

// === 2. Flows, delays, replays and late children, run by the consumer

/// 100 flows committed before the relays start: run exactly once, in conveyor's order.
#[sqlx::test]
async fn flows_from_a_backlog_run_once_in_order(pool: PgPool) {
    let ns = Namespace::new();
    let flows = flows(100);
    insert_flows(&pool, &flows).await;
    let w = Workers::start(&ns.url, &ns.prefix, &FLOW_QUEUES, 2, None).await;
    let relays = two_relays(&pool, &ns).await;
    finish_flows(&pool, &ns, w, &relays, &flows).await;
}

/// 100 flows committed while the relays and the consumer run: the same.
#[sqlx::test]
async fn flows_committed_while_relays_run_run_once_in_order(pool: PgPool) {
    let ns = Namespace::new();
    let flows = flows(100);
    let w = Workers::start(&ns.url, &ns.prefix, &FLOW_QUEUES, 2, None).await;
    let relays = two_relays(&pool, &ns).await;
    insert_flows(&pool, &flows).await;
    finish_flows(&pool, &ns, w, &relays, &flows).await;
}

/// A delayed job waits in `scheduled` (score: run_at's whole seconds) and runs once the
/// consumer promotes it, not before run_at.
#[sqlx::test]
async fn a_delayed_job_runs_after_the_consumer_promotes_it(pool: PgPool) {
    let ns = Namespace::new();
    let w = Workers::start(&ns.url, &ns.prefix, &["delayed.Q"], 1, None).await;
    let _relay = start_relay(&pool, &ns, &[]).await;
    let run_at = at(2);
    let later = wire::Job {
        run_at: Some(ts(run_at)),
        ..job("delayed.Q", "example.Later", PAYLOAD)
    };
    insert(&pool, &later).await;
    wait_until("the job is scheduled", Duration::from_secs(10), || async {
        !scheduled_raw(&ns).await.is_empty()
    })
    .await;
    assert_eq!(
        scheduled_raw(&ns).await,
        vec![(later.encode_to_vec(), run_at.timestamp() as f64)],
        "the scheduled member and its score"
    );
    assert_eq!(ns.llen("queue:delayed.Q").await, 0, "queued early");
    assert!(w.runs().is_empty(), "ran early");
    settle(&w, 1, &ns, &pool).await;
    let run = w.runs_of(&later.uuid);
    assert_eq!(run.len(), 1, "runs");
    assert!(
        run[0].popped_at >= SystemTime::from(run_at),
        "popped before run_at"
    );
    assert_eq!(run[0].job, later);
    assert_eq!(w.errors(), Vec::<String>::new());
    assert_eq!(conveyor_keys(&ns).await, Vec::<String>::new(), "keys left");
    w.stop().await;
}

/// A row replayed (its uuid inserted again) after its job ran and closed is a duplicate.
#[sqlx::test]
async fn a_row_replayed_after_its_job_closed_is_a_duplicate(pool: PgPool) {
    let ns = Namespace::new();
    let w = Workers::start(&ns.url, &ns.prefix, &["replay.Q"], 1, None).await;
    let relay = start_relay(&pool, &ns, &[]).await;
    let once_only = job("replay.Q", "example.Once", PAYLOAD);
    insert(&pool, &once_only).await;
    settle(&w, 1, &ns, &pool).await;
    assert_eq!(conveyor_keys(&ns).await, Vec::<String>::new(), "closed");
    insert(&pool, &once_only).await;
    wait_until("the replay relayed", Duration::from_secs(30), || async {
        pending_count(&pool).await == 0
    })
    .await;
    assert_eq!(relay.count("duplicate").await, 1.0, "duplicates");
    // A push lands in Redis before its row is deleted: nothing may be waiting now.
    let queued = ns.llen(&format!("queue:{}", once_only.queue)).await;
    assert_eq!(queued, 0, "the replay was pushed");
    assert_eq!(w.runs_of(&once_only.uuid).len(), 1, "runs");
    assert_eq!(conveyor_keys(&ns).await, Vec::<String>::new(), "keys left");
    assert_eq!(w.errors(), Vec::<String>::new());
    w.stop().await;
}

/// A child and an heir committed after their parent ran and closed run as jobs of their own,
/// once each, without NoJob; the relay counts and logs them as late.
#[sqlx::test]
async fn a_child_and_an_heir_of_a_finished_parent_run_as_jobs_of_their_own(pool: PgPool) {
    let ns = Namespace::new();
    let w = Workers::start(&ns.url, &ns.prefix, &["late.Q"], 2, None).await;
    let relay = start_relay(&pool, &ns, &[]).await;
    let parent = job("late.Q", "example.Parent", b"p");
    insert(&pool, &parent).await;
    settle(&w, 1, &ns, &pool).await;
    assert_eq!(
        conveyor_keys(&ns).await,
        Vec::<String>::new(),
        "parent closed"
    );
    let child = wire::Job {
        parent_uuid: parent.uuid.clone(),
        ..job("late.Q", "example.Child", b"c")
    };
    let heir = wire::Job {
        predecessor_uuid: parent.uuid.clone(),
        ..job("late.Q", "example.Heir", b"h")
    };
    let mut tx = pool.begin().await.unwrap();
    insert(&mut *tx, &child).await;
    insert(&mut *tx, &heir).await;
    tx.commit().await.unwrap();
    settle(&w, 3, &ns, &pool).await;
    assert_eq!(w.errors(), Vec::<String>::new(), "consumer errors");
    for j in [&child, &heir] {
        let run = w.runs_of(&j.uuid);
        assert_eq!(run.len(), 1, "runs of {}", j.uuid);
        assert_eq!(run[0].job, orphaned(j), "as popped");
        assert_eq!(run[0].bytes, orphaned(j).encode_to_vec(), "bytes");
    }
    assert_eq!(
        relay.count("late").await,
        2.0,
        "late; logs:\n{}",
        relay.logs()
    );
    assert!(
        !relay.warnings("late").is_empty(),
        "no WARN about late jobs:\n{}",
        relay.logs()
    );
    assert_eq!(conveyor_keys(&ns).await, Vec::<String>::new(), "keys left");
    w.stop().await;
}

/// The parent's handler commits a child row and returns after 0-9 ms, so the relay pushes the
/// child while the parent runs, while it closes, or after it closed: whichever way the race
/// goes, the child runs exactly once, after its parent, without NoJob; as a late job (parent
/// cleared, counted) only when it came after the parent had finished.
#[sqlx::test]
async fn a_child_committed_by_its_running_parent_runs_exactly_once(pool: PgPool) {
    const N: usize = 30;
    let ns = Namespace::new();
    let parents: Vec<wire::Job> = (0..N)
        .map(|i| job("race.Parent", "example.Parent", format!("p{i}").as_bytes()))
        .collect();
    let children: Arc<HashMap<String, (wire::Job, u64)>> = Arc::new(
        parents
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let c = wire::Job {
                    parent_uuid: p.uuid.clone(),
                    ..job("race.Child", "example.Child", format!("c{i}").as_bytes())
                };
                (p.uuid.clone(), (c, i as u64 % 10))
            })
            .collect(),
    );
    let hook: Hook = {
        let (pool, children) = (pool.clone(), children.clone());
        Arc::new(move |job: wire::Job| {
            let (pool, children) = (pool.clone(), children.clone());
            Box::pin(async move {
                if let Some((child, delay_ms)) = children.get(&job.uuid) {
                    insert(&pool, child).await;
                    // Not waiting for work: the parent's handler runs on for 0-9 ms (the race).
                    let race = Duration::from_millis(*delay_ms);
                    hold_for(race, "the parent's handler runs on").await;
                }
            })
        })
    };
    let queues = ["race.Parent", "race.Child"];
    let w = Workers::start(&ns.url, &ns.prefix, &queues, 2, Some(hook)).await;
    let relay = start_relay(&pool, &ns, &[]).await;
    for p in &parents {
        insert(&pool, p).await;
    }
    settle(&w, 2 * N, &ns, &pool).await;
    assert_eq!(w.errors(), Vec::<String>::new(), "consumer errors");
    let runs = w.runs();
    let runs = by_uuid(&runs);
    let mut late = 0;
    for p in &parents {
        let parent_done = once(&runs, p).handled.unwrap();
        let child = &children[&p.uuid].0;
        let run = once(&runs, child);
        assert!(
            run.popped > parent_done,
            "child {} ran before its parent",
            child.uuid
        );
        if run.job.parent_uuid.is_empty() {
            late += 1;
            assert_eq!(run.job, orphaned(child), "a late child as popped");
        } else {
            assert_eq!(run.job, *child, "a child as popped");
        }
    }
    assert_eq!(
        relay.count("late").await,
        late as f64,
        "late; logs:\n{}",
        relay.logs()
    );
    assert_eq!(conveyor_keys(&ns).await, Vec::<String>::new(), "keys left");
    w.stop().await;
}
