//! Redis layouts: what a job looks like in Redis for the workers that consume it.
//!
//! A layout owns three things: the job's wire encoding, the key names, and the enqueue script
//! that writes them (with the dedup marker). [`crate::Enqueuer`] runs whichever layout it is
//! given; everything else (claiming, settling, dead letters) is the same for every layout.
//!
//! - [`LayoutKind::Jobrelay`] (`--layout jobrelay`, the default): jobrelay's own protobuf
//!   `jobrelay.v1.Job` and keys (docs/layouts/jobrelay.md).
//! - [`LayoutKind::Conveyor`] (`--layout conveyor`): what the Go job runner
//!   [conveyor](https://github.com/jpoz/conveyor) reads: its `wire.Job`, its keys and its
//!   `AddJob` branch order, with flows kept in order and late children never stranded.
//! - [`LayoutKind::Sidekiq`] (`--layout sidekiq`): what the Ruby job runner
//!   [Sidekiq](https://github.com/sidekiq/sidekiq) 6.x/7.x reads: the job hash as JSON that its
//!   client pushes, its queues and its scheduled set. No flows.
//! - [`LayoutKind::Celery`] (`--layout celery`): what a [Celery](https://docs.celeryq.dev/) 5
//!   worker on the Redis broker reads: kombu's message envelope (task protocol 2, JSON) on the
//!   queue's list; rows wait in the outbox until their `run_at` is due.
//! - [`LayoutKind::Bullmq`] (`--layout bullmq`): what a [BullMQ](https://github.com/taskforcesh/bullmq)
//!   6.x `Worker` reads: the job hash, wait list, delayed set, marker and events stream that
//!   `Queue.add` writes for a custom job id. No flows.
//! - [`LayoutKind::Rq`] (`--layout rq`): what an [RQ](https://python-rq.org) 2.x worker with
//!   the JSON serializer reads: RQ's job hash, its queue's list of ids and its scheduled
//!   registry. No flows.
//!
//! Another runner's layout is one more implementation of [`Layout`] and one more variant.

mod args_kwargs;
mod bullmq;
mod celery;
mod conveyor;
mod jobrelay;
#[cfg(feature = "daemon")]
pub mod peek;
mod rq;
mod sidekiq;

pub(crate) use self::sidekiq::args_of as sidekiq_args_of;
pub use self::sidekiq::{MAX_ARGS_DEPTH as SIDEKIQ_MAX_ARGS_DEPTH, RESERVED as SIDEKIQ_RESERVED};
pub use crate::job::layout::{LayoutKind, Unfit};

use std::fmt;

use uuid::Uuid;

use crate::job::Job;

impl LayoutKind {
    /// The layout itself.
    pub fn layout(self) -> &'static dyn Layout {
        match self {
            LayoutKind::Jobrelay => &jobrelay::JOBRELAY,
            LayoutKind::Conveyor => &conveyor::CONVEYOR,
            LayoutKind::Sidekiq => &sidekiq::SIDEKIQ,
            LayoutKind::Celery => &celery::CELERY,
            LayoutKind::Bullmq => &bullmq::BULLMQ,
            LayoutKind::Rq => &rq::RQ,
        }
    }

    /// Where the layout keeps its jobs and how to read one (`jobrelay peek`).
    #[cfg(feature = "daemon")]
    pub fn peek(self) -> &'static dyn peek::Peek {
        match self {
            LayoutKind::Jobrelay => &jobrelay::JOBRELAY,
            LayoutKind::Conveyor => &conveyor::CONVEYOR,
            LayoutKind::Sidekiq => &sidekiq::SIDEKIQ,
            LayoutKind::Celery => &celery::CELERY,
            LayoutKind::Bullmq => &bullmq::BULLMQ,
            LayoutKind::Rq => &rq::RQ,
        }
    }
}

/// One Redis layout: wire encoding, keys and enqueue script.
///
/// The script receives `ARGV[1]` = the namespace, `ARGV[2]` = the marker TTL in milliseconds
/// (`"0"`: none), then each job's keys and arguments from [`Layout::push_args`] (two keys per
/// job, its marker and its queue, in `KEYS`; with [`Layout::marks_in_sets`], a key never
/// written first, then one key per job, its queue, and the uuid as its first argument), and
/// answers one element per job: an outcome code
/// ([`crate::Outcome`]) or a string saying why it refused that job (having written nothing for
/// it).
pub trait Layout: Send + Sync + fmt::Debug {
    /// Which one.
    fn kind(&self) -> LayoutKind;

    /// The enqueue script's source.
    fn script(&self) -> &'static str;

    /// Appends the job's wire encoding to `buf`, or says why the job has none in this layout.
    fn encode(&self, job: &Job, buf: &mut Vec<u8>) -> std::result::Result<(), Unfit>;

    /// Appends the job's script arguments; `encoded` is [`Layout::encode`]'s output.
    /// `scratch` is a reusable buffer for building keys.
    fn push_args(
        &self,
        inv: &mut redis::ScriptInvocation<'_>,
        namespace: &str,
        job: &Job,
        encoded: &[u8],
        scratch: &mut String,
    );

    /// An upper bound of the bytes [`Layout::push_args`] sends for `job` besides `encoded`.
    fn args_overhead(&self, namespace: &str, job: &Job, encoded_len: usize) -> usize;

    /// What comes between the namespace and the uuid in a dedup marker's key (`jobs:`).
    fn marker_infix(&self) -> &'static str;

    /// What comes between the namespace and the queue's name in its list's key.
    fn queue_infix(&self) -> &'static str {
        "queue:"
    }

    /// The dedup marker's key for `uuid`: `<namespace><marker infix><uuid>`. Not for a layout
    /// whose markers are members of sets ([`Layout::marks_in_sets`]).
    fn marker_key(&self, namespace: &str, uuid: Uuid) -> String {
        format!("{namespace}{}{}", self.marker_infix(), uuid.hyphenated())
    }

    /// Whether the layout's dedup markers are members of sets, one set per interval of the
    /// marker TTL and per first hex digit of the uuid
    /// (`<namespace><marker infix>marks:<ttl>:<interval>:<digit>`, or
    /// `<namespace><marker infix>marks:<digit>` without a TTL), instead of a key per job
    /// (docs/layouts/markers.md#markers-as-sets). Its scripts then get first a key that is never
    /// written (`<namespace><marker infix>marks:absent`, so that a Cluster refuses the call
    /// while the slot migrates), then one key per job, its queue, and its uuid as the job's
    /// first argument. For layouts whose keys are all in one hash slot or that refuse a
    /// Cluster: a set holds the markers of every queue.
    fn marks_in_sets(&self) -> bool {
        false
    }

    /// What follows the queue's name in its list's key (BullMQ's `:wait`).
    fn queue_suffix(&self) -> &'static str {
        ""
    }

    /// The queue list's key: `<namespace><queue infix><queue><queue suffix>`.
    fn queue_key(&self, namespace: &str, queue: &str) -> String {
        format!(
            "{namespace}{}{queue}{}",
            self.queue_infix(),
            self.queue_suffix()
        )
    }

    /// Whether a job must reach Redis no later than the job it names as its parent or
    /// predecessor (so that it never lands in the lists of a job that already finished): the
    /// claim then takes a row only once no pending row names it, and a batch goes out with
    /// such dependents first.
    fn orders_flows(&self) -> bool;

    /// Whether a job whose `run_at` is in the future stays in the outbox until it is due (the
    /// runner has no scheduled set the relay could write it to): the claim then takes a row
    /// only once its `run_at` has passed, and the job goes out without one.
    fn holds_until_due(&self) -> bool {
        false
    }

    /// Whether each job's message reaches its queue's list by a native `LPUSH` instead of as a
    /// script argument: the call is then a `MULTI`/`EXEC` transaction of one `LPUSH` per list
    /// and the script (`EVAL`), which gets only each job's two keys and `ARGV[1]`, `ARGV[2]`,
    /// finds job i's message at its place among the ones just pushed, writes the markers of
    /// the new jobs and takes the messages of the others back out ([`Layout::push_args`] is
    /// then not used). Redis copies and hashes every byte of a script argument; a native
    /// push does not (docs/layouts/celery.md#how-the-celery-layout-pushes).
    fn lpushes_messages(&self) -> bool {
        false
    }

    /// A script the relay runs every second or so, if the layout needs housekeeping. It gets
    /// `ARGV[1]` = the namespace, `ARGV[2]` = a grace period in milliseconds, `ARGV[3]` = a
    /// limit on the work of one call, `ARGV[4]` = the marker TTL in milliseconds, and answers how many jobs it relayed as late jobs
    /// ([`crate::Outcome::Late`]).
    fn repair_script(&self) -> Option<&'static str> {
        None
    }
}

/// Declares a job's two keys (`KEYS`), its marker key and its queue key as `layout` names them
/// ([`Layout::marker_key`], [`Layout::queue_key`]), built in `key` (left empty): no `String` of
/// their own per job. Declared, not passed as arguments, so that a Redis Cluster routes the
/// call by them and refuses it while their slot migrates (docs/redis.md#cluster).
pub(crate) fn push_keys(
    layout: &dyn Layout,
    inv: &mut redis::ScriptInvocation<'_>,
    namespace: &str,
    job: &Job,
    key: &mut String,
) {
    key.clear();
    let queue_at = job_keys(layout, namespace, job, key);
    inv.key(&key[..queue_at]);
    inv.key(&key[queue_at..]);
    key.clear();
}

/// Declares a job's queue key (`KEYS`, as [`Layout::queue_key`] names it, built in `key`, left
/// empty) and passes its uuid as the first of its arguments: the form of the layouts whose
/// markers are members of sets ([`Layout::marks_in_sets`]).
pub(crate) fn push_queue_key(
    layout: &dyn Layout,
    inv: &mut redis::ScriptInvocation<'_>,
    namespace: &str,
    job: &Job,
    key: &mut String,
) {
    let mut uuid = Uuid::encode_buffer();
    key.clear();
    write_queue_key(layout, namespace, &job.queue, key);
    inv.key(&*key);
    inv.arg(&*job.uuid.hyphenated().encode_lower(&mut uuid));
    key.clear();
}

/// Appends a job's two keys to `out`, its marker key then its queue key, as `layout` names
/// them (what [`push_keys`] declares); returns where the queue key begins.
pub(crate) fn job_keys(layout: &dyn Layout, namespace: &str, job: &Job, out: &mut String) -> usize {
    let mut uuid = Uuid::encode_buffer();
    out.push_str(namespace);
    out.push_str(layout.marker_infix());
    out.push_str(job.uuid.hyphenated().encode_lower(&mut uuid));
    let queue_at = out.len();
    write_queue_key(layout, namespace, &job.queue, out);
    queue_at
}

/// Appends the key of `queue`'s list to `out`, as [`Layout::queue_key`] names it.
fn write_queue_key(layout: &dyn Layout, namespace: &str, queue: &str, out: &mut String) {
    out.push_str(namespace);
    out.push_str(layout.queue_infix());
    out.push_str(queue);
    out.push_str(layout.queue_suffix());
}

/// Refuses a job that names a parent or predecessor, in a layout whose runner has no flows of
/// jobrelay's kind: `Unfit("<why>: the row names parent_uuid <u> and predecessor_uuid <u>")`.
pub(crate) fn refuse_flows(job: &Job, why: &str) -> Result<(), Unfit> {
    let named: Vec<String> = [
        ("parent_uuid", job.parent_uuid),
        ("predecessor_uuid", job.predecessor_uuid),
    ]
    .into_iter()
    .filter_map(|(column, u)| u.map(|u| format!("{column} {u}")))
    .collect();
    if named.is_empty() {
        return Ok(());
    }
    Err(Unfit(format!(
        "{why}: the row names {}",
        named.join(" and ")
    )))
}

/// The route of a job that names a parent, a predecessor, a `run_at` or `dead_parent`, as the
/// jobrelay and conveyor scripts parse it: `<dead_parent 1/0>|<parent>|<predecessor>|<run_at
/// score>` appended to `out`; nothing for a job with none of them. Returns whether it wrote.
pub(crate) fn write_flow_route(job: &Job, out: &mut String) -> bool {
    use std::fmt::Write as _;
    if job.parent_uuid.is_none()
        && job.predecessor_uuid.is_none()
        && job.run_at.is_none()
        && !job.dead_parent
    {
        return false;
    }
    let (mut parent, mut pred) = (Uuid::encode_buffer(), Uuid::encode_buffer());
    let _ = write!(
        out,
        "{}|{}|{}|{}",
        if job.dead_parent { "1" } else { "0" },
        uuid_str(job.parent_uuid, &mut parent),
        uuid_str(job.predecessor_uuid, &mut pred),
        job.run_at.map(crate::job::epoch_score).unwrap_or_default()
    );
    true
}

/// A job for the layouts' unit tests: uuid `6f1c2a3b-4d5e-4f60-8a71-92b3c4d5e6f7`, `queue`,
/// `job_type`, `payload`, created at epoch second 1,700,000,000; no flow, `run_at` or headers.
#[cfg(test)]
pub(crate) fn test_job(queue: &str, job_type: &str, payload: &[u8]) -> Job {
    Job {
        uuid: "6f1c2a3b-4d5e-4f60-8a71-92b3c4d5e6f7".parse().unwrap(),
        queue: queue.into(),
        job_type: job_type.into(),
        payload: payload.to_vec(),
        parent_uuid: None,
        predecessor_uuid: None,
        dead_parent: false,
        run_at: None,
        created_at: chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap(),
        headers: std::collections::BTreeMap::new(),
    }
}

/// `u` lower-case hyphenated into `buf`, or `""`.
pub(crate) fn uuid_str(u: Option<Uuid>, buf: &mut [u8; 45]) -> &str {
    match u {
        Some(u) => u.hyphenated().encode_lower(buf),
        None => "",
    }
}
