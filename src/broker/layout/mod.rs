//! Redis layouts: what a job looks like in Redis for the workers that consume it.
//!
//! A layout is one module that owns everything about its runner: the job's wire encoding, the
//! key names, the enqueue script that writes them (with the dedup marker), how `jobrelay peek`
//! reads a job back, its configuration rules (default namespace, namespaces its workers cannot
//! use, Cluster support) and what the claim must do for it ([`ClaimNeeds`]). [`crate::Enqueuer`]
//! runs whichever layout it is given; everything else (claiming, settling, dead letters) is the
//! same for every layout. Each module's first line names its runner and the versions it is
//! written for; [`LayoutKind::ALL`] lists them, and docs/layouts/README.md describes them.
//!
//! Another runner's layout is one more module implementing [`Layout`] (and [`peek::Peek`]),
//! one more variant of [`LayoutKind`] and its arm in [`LayoutKind::layout`], the one registry.

mod args_kwargs;
mod bullmq;
mod celery;
#[cfg(feature = "daemon")]
pub mod consumers;
mod conveyor;
mod jobrelay;
#[cfg(feature = "daemon")]
pub mod peek;
mod rq;
mod sidekiq;

pub(crate) use self::sidekiq::args_of as sidekiq_args_of;
pub use self::sidekiq::{MAX_ARGS_DEPTH as SIDEKIQ_MAX_ARGS_DEPTH, RESERVED as SIDEKIQ_RESERVED};
pub use crate::error::Unfit;
pub use crate::sink::ClaimNeeds;

use std::fmt;
use std::str::FromStr;

use uuid::Uuid;

use crate::job::{Job, Options};

/// Which layout, as named by `--layout` / `JOBRELAY_LAYOUT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LayoutKind {
    /// jobrelay's own layout (the default).
    #[default]
    Jobrelay,
    /// The layout of the Go job runner conveyor.
    Conveyor,
    /// The layout of the Ruby job runner Sidekiq.
    Sidekiq,
    /// The layout of Celery on its Redis broker (kombu's Redis transport).
    Celery,
    /// The layout of the Node.js job runner BullMQ.
    Bullmq,
    /// The layout of the Python job runner RQ (JSON serializer).
    Rq,
}

impl LayoutKind {
    /// Every layout, in the order `--help` lists them.
    pub const ALL: [LayoutKind; 6] = [
        LayoutKind::Jobrelay,
        LayoutKind::Conveyor,
        LayoutKind::Sidekiq,
        LayoutKind::Celery,
        LayoutKind::Bullmq,
        LayoutKind::Rq,
    ];

    /// The layout itself: the one registry of layouts.
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

    /// The name `--layout` takes.
    pub fn as_str(self) -> &'static str {
        self.layout().name()
    }
}

impl fmt::Display for LayoutKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for LayoutKind {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        LayoutKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = LayoutKind::ALL.iter().map(|k| k.as_str()).collect();
                format!("unknown layout {s:?}; one of {}", names.join(", "))
            })
    }
}

/// What a row's `payload` is to a layout's runner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payload {
    /// Bytes the runner's workers read as they are (jobrelay's own layout; conveyor's
    /// protobuf message).
    Opaque,
    /// A JSON array of the job's arguments (Sidekiq's `args`, BullMQ's `data`); the layouts of
    /// Celery and RQ also take `{"args": [...], "kwargs": {...}}`.
    JsonArgs,
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

    /// The name `--layout` takes.
    fn name(&self) -> &'static str;

    /// What the claim must do for this runner: keep flows in order, hold rows until due
    /// (nothing, by default).
    fn claim_needs(&self) -> ClaimNeeds {
        ClaimNeeds::default()
    }

    /// What a row's `payload` is to the runner.
    fn payload(&self) -> Payload;

    /// The namespace when none is given: the runner's own key prefix (empty by default).
    fn default_namespace(&self) -> &'static str {
        ""
    }

    /// Refuses a namespace the runner's workers can never read, saying why and what to give
    /// instead (checked once, as the configuration is read).
    fn check_namespace(&self, namespace: &str) -> std::result::Result<(), String> {
        let _ = namespace;
        Ok(())
    }

    /// Why the runner's workers cannot read a Redis Cluster, if they cannot (the relay then
    /// refuses to start with a Cluster URL in this layout).
    fn refuses_cluster(&self) -> Option<&'static str> {
        None
    }

    /// Where the layout keeps its jobs and how to read one back (`jobrelay peek`).
    #[cfg(feature = "daemon")]
    fn peek(&self) -> &dyn peek::Peek;

    /// Who reads the layout's queues, as its runner records them in Redis.
    #[cfg(feature = "daemon")]
    fn consumers(&self) -> &dyn consumers::Consumers;

    /// The enqueue script's source.
    fn script(&self) -> &'static str;

    /// The runner's job options this layout carries (a row's `options`, by the runner's own
    /// names; docs/layouts/README.md#job-options): none by default.
    fn options(&self) -> &'static [&'static str] {
        &[]
    }

    /// Refuses a job's `options` (not empty) that the layout cannot carry, naming the option
    /// and the layout; by default any name not in [`Layout::options`]
    /// (`unknown option "x" for the <layout> layout; known: ...`). A layout that carries
    /// options checks their types here: [`Layout::encode`] then writes them as they are.
    fn check_options(&self, options: &Options) -> std::result::Result<(), Unfit> {
        refuse_unknown_options(self.name(), self.options(), options)
    }

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

    /// What follows the queue list's key in the key of the list a job with options goes to,
    /// when its options choose another list than the queue's own (kombu's list of a message
    /// priority, `<queue>\x06\x16<step>`); empty by default. Asked only for a job whose
    /// options are not empty (its options checked): a job without options goes to its queue's
    /// list. For a layout whose messages go by `LPUSH` ([`Layout::lpushes_messages`]) or whose
    /// script takes the list's key as it is.
    fn list_suffix(&self, job: &Job) -> &'static str {
        let _ = job;
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
/// them (what [`push_keys`] declares; the queue key followed by [`Layout::list_suffix`] for a
/// job with options); returns where the queue key begins.
pub(crate) fn job_keys(layout: &dyn Layout, namespace: &str, job: &Job, out: &mut String) -> usize {
    let mut uuid = Uuid::encode_buffer();
    out.push_str(namespace);
    out.push_str(layout.marker_infix());
    out.push_str(job.uuid.hyphenated().encode_lower(&mut uuid));
    let queue_at = out.len();
    write_queue_key(layout, namespace, &job.queue, out);
    if !job.options.is_empty() {
        out.push_str(layout.list_suffix(job));
    }
    queue_at
}

/// Appends the key of `queue`'s list to `out`, as [`Layout::queue_key`] names it.
fn write_queue_key(layout: &dyn Layout, namespace: &str, queue: &str, out: &mut String) {
    out.push_str(namespace);
    out.push_str(layout.queue_infix());
    out.push_str(queue);
    out.push_str(layout.queue_suffix());
}

/// The first of `options` not among `known`, refused:
/// `unknown option "x" for the <layout> layout; known: a, b` (`known: none` when the layout
/// carries none).
pub(crate) fn refuse_unknown_options(
    layout: &str,
    known: &[&str],
    options: &Options,
) -> Result<(), Unfit> {
    match options.keys().find(|name| !known.contains(&name.as_str())) {
        None => Ok(()),
        Some(name) => Err(Unfit(format!(
            "unknown option {name:?} for the {layout} layout; known: {}",
            if known.is_empty() {
                "none".to_owned()
            } else {
                known.join(", ")
            }
        ))),
    }
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
        options: Default::default(),
        ordering_key: None,
    }
}

/// `u` lower-case hyphenated into `buf`, or `""`.
pub(crate) fn uuid_str(u: Option<Uuid>, buf: &mut [u8; 45]) -> &str {
    match u {
        Some(u) => u.hyphenated().encode_lower(buf),
        None => "",
    }
}

#[cfg(test)]
mod registry_tests {
    use super::*;

    /// The registry and each module agree: every variant's layout says it is that variant,
    /// and its name parses back to it.
    #[test]
    fn every_layout_is_registered_under_its_own_name() {
        for kind in LayoutKind::ALL {
            let layout = kind.layout();
            assert_eq!(layout.kind(), kind);
            assert_eq!(layout.name().parse::<LayoutKind>(), Ok(kind));
            assert_eq!(
                layout.check_namespace(layout.default_namespace()).is_ok(),
                {
                    // conveyor's namespace has no default: the flag must name it.
                    kind != LayoutKind::Conveyor
                }
            );
        }
        let err = "nope".parse::<LayoutKind>().unwrap_err();
        assert!(
            err.contains("jobrelay, conveyor, sidekiq, celery, bullmq, rq"),
            "{err}"
        );
    }
}

#[cfg(test)]
mod option_tests {
    use super::*;

    /// Every layout refuses an option it does not know, naming it, itself and what it knows
    /// (the sidekiq layout, which passes other names through, one Sidekiq sets itself).
    #[test]
    fn every_layout_refuses_an_unknown_option_naming_it() {
        for kind in LayoutKind::ALL {
            let layout = kind.layout();
            let (name, refusal) = match kind {
                LayoutKind::Sidekiq => ("jid", "reserved option"),
                _ => ("no_such_option", "unknown option"),
            };
            let options: Options = [(name.to_owned(), serde_json::json!(1))]
                .into_iter()
                .collect();
            let Unfit(why) = layout.check_options(&options).expect_err(layout.name());
            let known = if kind == LayoutKind::Sidekiq {
                ""
            } else {
                "known: "
            };
            assert!(
                why.starts_with(&format!(
                    "{refusal} \"{name}\" for the {} layout; {known}",
                    layout.name()
                )),
                "{why}"
            );
            assert!(layout.check_options(&Options::new()).is_ok());
        }
    }
}
