//! Metric names (part of the contract, docs/metrics.md) and the one place each is recorded.
//!
//! Only the events of [`super::events`] record them (the recording functions are private to
//! `telemetry`): a call site emits an event, which writes its log line and updates its metrics
//! together.
//!
//! The `metrics` facade is a no-op until a recorder is installed, so library users who do not
//! run the relay's HTTP listener pay next to nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::error::{ErrorClass, Reason};
use crate::job::Outcome;

/// Counter, label `outcome`: jobs Redis accepted (or recognised as duplicates).
pub const JOBS_RELAYED: &str = "jobrelay_jobs_relayed_total";
/// Counter, labels `kind` (`transient`, `per_job`, `permanent`, `config`) and `reason` (a
/// [`Reason`]'s name, [`failure_reasons`]): failed job pushes.
pub const JOB_FAILURES: &str = "jobrelay_job_failures_total";
/// Counter: rows moved to the dead-letter table.
pub const JOBS_DEAD_LETTERED: &str = "jobrelay_jobs_dead_lettered_total";
/// Histogram: one claim-push-delete-commit cycle.
pub const BATCH_DURATION: &str = "jobrelay_batch_duration_seconds";
/// Histogram: from a row's `created_at` to its delete.
pub const RELAY_LAG: &str = "jobrelay_relay_lag_seconds";
/// Gauge: rows in the outbox table.
pub const PENDING_JOBS: &str = "jobrelay_pending_jobs";
/// Gauge: age of the oldest row in the outbox table (0 when empty).
pub const OLDEST_PENDING_AGE: &str = "jobrelay_oldest_pending_age_seconds";
/// Gauge: age of the first row, in `id` order, that a claim could take now (due, not parked
/// by a retry's backoff); 0 when there is none.
pub const OLDEST_CLAIMABLE_AGE: &str = "jobrelay_oldest_claimable_age_seconds";
/// Gauge, label `dependency` (`postgres`, `redis`): 1 when reachable.
pub const UP: &str = "jobrelay_up";
/// Gauge: rows in the dead-letter table.
pub const DEAD_JOBS: &str = "jobrelay_dead_jobs";
/// Gauge: how long the oldest holder of the database's xmin horizon has held it, in seconds
/// (0 when none; docs/metrics.md#the-xmin-horizon).
pub const XMIN_HORIZON_AGE: &str = "jobrelay_xmin_horizon_age_seconds";
/// Gauge: how many transaction ids old the database's xmin horizon is.
pub const XMIN_HORIZON_XIDS: &str = "jobrelay_xmin_horizon_age_xids";
/// Gauge: ordering keys held, their rows waiting behind a dead-lettered row of theirs
/// (docs/runbook.md#jobrelayorderingkeyheld).
pub const HELD_KEYS: &str = "jobrelay_held_keys";
/// Gauge: how long the oldest held key has been held (since its dead row died), in seconds;
/// 0 when none is.
pub const HELD_KEY_OLDEST_AGE: &str = "jobrelay_held_key_oldest_age_seconds";
/// Gauge: 1 while the relay's claims run as named statements, planned once per connection
/// (`--prepared-statements`), 0 while they are planned at every claim.
pub const NAMED_CLAIMS: &str = "jobrelay_named_claims";
/// Counter, label `task` (`worker`, `probe`, `listener`, `wakeup`, `repair`, `redis-side`): panics caught in the
/// relay's tasks, each followed by a restart of the task.
pub const TASK_PANICS: &str = "jobrelay_task_panics_total";

/// Gauge, label `queue`: jobs waiting in the queue's Redis list (queues the relay fed within
/// `--consumer-window`, at most 100; docs/metrics.md#the-redis-side).
pub const QUEUE_DEPTH: &str = "jobrelay_queue_depth";
/// Gauge, label `queue`: how long ago the next job to be popped was put on the queue (0 when
/// empty; no series when its jobs do not say).
pub const QUEUE_OLDEST_AGE: &str = "jobrelay_queue_oldest_age_seconds";
/// Gauge, label `queue`: consumers the runner records for the queue (no series when it records
/// none).
pub const QUEUE_CONSUMERS: &str = "jobrelay_queue_consumers";

/// The last sample of the watched queues (those whose list could be read): rendered after the
/// recorder's metrics ([`render_queue_sides`]), so that a queue no longer watched has no
/// series at all (a gauge of the `metrics` facade, once set, stays).
#[cfg(feature = "daemon")]
static QUEUE_SIDES: std::sync::Mutex<Vec<crate::admin::queues::QueueSide>> =
    std::sync::Mutex::new(Vec::new());

/// Registers help texts. Call once after installing a recorder.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        JOBS_RELAYED,
        "Jobs written to Redis (or found already there), by outcome"
    );
    describe_counter!(
        JOB_FAILURES,
        "Failed job pushes, by kind (transient, per_job, permanent) and reason"
    );
    describe_counter!(JOBS_DEAD_LETTERED, "Rows moved to the dead-letter table");
    describe_histogram!(
        BATCH_DURATION,
        Unit::Seconds,
        "Duration of one claim-push-delete-commit batch"
    );
    describe_histogram!(
        RELAY_LAG,
        Unit::Seconds,
        "Time from a row's created_at to its delete"
    );
    describe_gauge!(PENDING_JOBS, "Rows waiting in the outbox table");
    describe_gauge!(
        OLDEST_PENDING_AGE,
        Unit::Seconds,
        "Age of the oldest row in the outbox table"
    );
    describe_gauge!(
        OLDEST_CLAIMABLE_AGE,
        Unit::Seconds,
        "Age of the oldest row a claim could take now (due, not waiting for a retry)"
    );
    describe_gauge!(UP, "1 when the dependency is reachable, else 0");
    describe_gauge!(DEAD_JOBS, "Rows in the dead-letter table");
    describe_gauge!(
        XMIN_HORIZON_AGE,
        Unit::Seconds,
        "How long the oldest holder of the xmin horizon has held it (its running statement, else its transaction; never the relay's own sessions)"
    );
    describe_gauge!(
        XMIN_HORIZON_XIDS,
        "Age of the database's xmin horizon, in transaction ids"
    );
    describe_gauge!(
        HELD_KEYS,
        "Ordering keys whose rows wait behind a dead-lettered row of theirs"
    );
    describe_gauge!(
        HELD_KEY_OLDEST_AGE,
        Unit::Seconds,
        "How long the oldest held ordering key has been held (since its dead row died)"
    );
    describe_gauge!(
        NAMED_CLAIMS,
        "1 while claims run as named statements (planned once per connection), else 0"
    );
    describe_counter!(
        TASK_PANICS,
        "Panics caught in the relay's tasks (each restarted), by task"
    );
    // Make every series visible from the first scrape, at zero.
    for o in Outcome::ALL {
        metrics::counter!(JOBS_RELAYED, "outcome" => o.as_str()).increment(0);
    }
    for k in ErrorClass::ALL {
        for r in failure_reasons(k) {
            failure_counter(k, *r).increment(0);
        }
    }
    metrics::counter!(JOBS_DEAD_LETTERED).increment(0);
    metrics::counter!(TASK_PANICS, "task" => "worker").increment(0);
    // A registered histogram renders (with zero counts) before its first sample.
    let _ = metrics::histogram!(BATCH_DURATION);
    let _ = metrics::histogram!(RELAY_LAG);
    // Nothing is up until it has answered once (as in `relay::Health`).
    up("postgres", false);
    up("redis", false);
}

/// Process-wide tallies of the counters, for the shutdown log line (the `metrics` recorder
/// cannot be read back, and is not installed at all without `--http-addr`).
static RELAYED: AtomicU64 = AtomicU64::new(0);
static FAILED: [AtomicU64; ErrorClass::ALL.len()] =
    [const { AtomicU64::new(0) }; ErrorClass::ALL.len()];
static DEAD_LETTERED: AtomicU64 = AtomicU64::new(0);

/// What this process has done so far, summed over every worker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// Jobs relayed, every outcome (duplicates included).
    pub relayed: u64,
    /// Failed job pushes of kind `transient`.
    pub transient: u64,
    /// Failed job pushes of kind `per_job`.
    pub per_job: u64,
    /// Failed job pushes of kind `permanent`.
    pub permanent: u64,
    /// Failed job pushes of kind `config`.
    pub config: u64,
    /// Rows moved to the dead-letter table.
    pub dead_lettered: u64,
}

/// The tallies of this process so far.
pub fn totals() -> Totals {
    let failed = |k: ErrorClass| FAILED[k.index()].load(Ordering::Relaxed);
    Totals {
        relayed: RELAYED.load(Ordering::Relaxed),
        transient: failed(ErrorClass::Transient),
        per_job: failed(ErrorClass::PerJob),
        permanent: failed(ErrorClass::Permanent),
        config: failed(ErrorClass::Config),
        dead_lettered: DEAD_LETTERED.load(Ordering::Relaxed),
    }
}

/// The reasons a failure of `kind` can have: the `reason` label values of
/// `jobrelay_job_failures_total` for that `kind`, each a series from the first scrape. A
/// per-job or permanent failure is about the job, never a dependency's state: `error`. The
/// configuration errors that fail pushes are Redis's: its eviction policy. A transient failure
/// can have any other reason.
pub fn failure_reasons(kind: ErrorClass) -> &'static [Reason] {
    match kind {
        ErrorClass::Transient => &TRANSIENT_REASONS,
        ErrorClass::PerJob | ErrorClass::Permanent => &[Reason::Other],
        ErrorClass::Config => &CONFIG_REASONS,
    }
}

/// The reasons of the configuration errors that fail pushes ([`ErrorClass::Config`]).
const CONFIG_REASONS: [Reason; 1] = [Reason::EvictionPolicy];

/// Every reason but those of [`CONFIG_REASONS`], in the order of [`Reason::ALL`].
const TRANSIENT_REASONS: [Reason; Reason::ALL.len() - CONFIG_REASONS.len()] = {
    let mut out = [Reason::Other; Reason::ALL.len() - CONFIG_REASONS.len()];
    let (mut i, mut n) = (0, 0);
    while i < Reason::ALL.len() {
        let mut config = false;
        let mut j = 0;
        while j < CONFIG_REASONS.len() {
            config |= Reason::ALL[i] as usize == CONFIG_REASONS[j] as usize;
            j += 1;
        }
        if !config {
            out[n] = Reason::ALL[i];
            n += 1;
        }
        i += 1;
    }
    out
};

fn failure_counter(kind: ErrorClass, reason: Reason) -> metrics::Counter {
    metrics::counter!(JOB_FAILURES, "kind" => kind.as_str(), "reason" => reason.as_str())
}

/// Counts jobs relayed with one outcome.
pub(in crate::telemetry) fn relayed(outcome: Outcome, n: u64) {
    if n > 0 {
        RELAYED.fetch_add(n, Ordering::Relaxed);
        metrics::counter!(JOBS_RELAYED, "outcome" => outcome.as_str()).increment(n);
    }
}

/// Counts failed pushes of one kind, for one reason.
pub(in crate::telemetry) fn failures(kind: ErrorClass, reason: Reason, n: u64) {
    if n > 0 {
        FAILED[kind.index()].fetch_add(n, Ordering::Relaxed);
        failure_counter(kind, reason).increment(n);
    }
}

/// Counts rows moved to the dead-letter table.
pub(in crate::telemetry) fn dead_lettered(n: u64) {
    if n > 0 {
        DEAD_LETTERED.fetch_add(n, Ordering::Relaxed);
        metrics::counter!(JOBS_DEAD_LETTERED).increment(n);
    }
}

/// Records one batch's duration.
pub(in crate::telemetry) fn batch_duration(d: Duration) {
    metrics::histogram!(BATCH_DURATION).record(d.as_secs_f64());
}

/// Records one job's relay lag, in seconds.
pub(in crate::telemetry) fn relay_lag(seconds: f64) {
    metrics::histogram!(RELAY_LAG).record(seconds.max(0.0));
}

/// Sets the backlog gauges.
pub(in crate::telemetry) fn backlog(
    pending: i64,
    oldest_age_seconds: f64,
    oldest_claimable_age_seconds: f64,
    dead: i64,
) {
    metrics::gauge!(PENDING_JOBS).set(pending as f64);
    metrics::gauge!(OLDEST_PENDING_AGE).set(oldest_age_seconds);
    metrics::gauge!(OLDEST_CLAIMABLE_AGE).set(oldest_claimable_age_seconds);
    metrics::gauge!(DEAD_JOBS).set(dead as f64);
}

/// Sets the xmin horizon gauges.
pub(in crate::telemetry) fn xmin_horizon(age_seconds: f64, xids: i64) {
    metrics::gauge!(XMIN_HORIZON_AGE).set(age_seconds);
    metrics::gauge!(XMIN_HORIZON_XIDS).set(xids as f64);
}

/// Sets the held keys' gauges.
pub(in crate::telemetry) fn held_keys(keys: i64, oldest_age_seconds: f64) {
    metrics::gauge!(HELD_KEYS).set(keys as f64);
    metrics::gauge!(HELD_KEY_OLDEST_AGE).set(oldest_age_seconds);
}

/// Sets `jobrelay_named_claims`.
pub(in crate::telemetry) fn named_claims(named: bool) {
    metrics::gauge!(NAMED_CLAIMS).set(if named { 1.0 } else { 0.0 });
}

/// Sets `jobrelay_up{dependency}`.
pub(in crate::telemetry) fn up(dependency: &'static str, up: bool) {
    metrics::gauge!(UP, "dependency" => dependency).set(if up { 1.0 } else { 0.0 });
}

/// Replaces the sample of the watched queues.
#[cfg(feature = "daemon")]
pub(in crate::telemetry) fn queue_sides(sides: &[crate::admin::queues::QueueSide]) {
    let mut all = QUEUE_SIDES.lock().expect("not poisoned");
    all.clear();
    // A queue whose list could not be read has no series: its depth is not known.
    all.extend(sides.iter().filter(|s| s.error.is_none()).cloned());
}

/// Appends the watched queues' gauges to `out` (the Prometheus text format), nothing when no
/// queue is watched.
#[cfg(feature = "daemon")]
pub fn render_queue_sides(out: &mut String) {
    use crate::admin::queues::QueueSide;
    use std::fmt::Write as _;
    let all = QUEUE_SIDES.lock().expect("not poisoned");
    if all.is_empty() {
        return;
    }
    let label = |q: &str| {
        q.replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n")
    };
    type Gauge = (&'static str, &'static str, fn(&QueueSide) -> Option<f64>);
    let gauges: [Gauge; 3] = [
        (
            QUEUE_DEPTH,
            "Jobs waiting in the queue's Redis list, by queue",
            |s| Some(s.depth as f64),
        ),
        (
            QUEUE_OLDEST_AGE,
            "Seconds since the next job to be popped was put on the queue, by queue",
            // 0 when empty, as the backlog's oldest age.
            |s| {
                if s.depth == 0 {
                    Some(0.0)
                } else {
                    s.oldest_age_seconds
                }
            },
        ),
        (
            QUEUE_CONSUMERS,
            "Consumers the runner records for the queue, by queue",
            |s| s.consumers.map(|n| n as f64),
        ),
    ];
    for (name, help, value) in gauges {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for s in all.iter() {
            if let Some(v) = value(s) {
                let _ = writeln!(out, "{name}{{queue=\"{}\"}} {v}", label(&s.queue));
            }
        }
        out.push('\n');
    }
}

/// Counts one panic of a relay task.
pub(in crate::telemetry) fn task_panicked(task: &str) {
    metrics::counter!(TASK_PANICS, "task" => task.to_owned()).increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each reason is a series of one kind that keeps rows: transient, or config.
    #[test]
    fn transient_and_config_failures_share_out_the_reasons() {
        let mut kept: Vec<Reason> = failure_reasons(ErrorClass::Transient).to_vec();
        kept.extend(failure_reasons(ErrorClass::Config));
        let mut all = Reason::ALL.to_vec();
        kept.sort_by_key(|r| *r as usize);
        all.sort_by_key(|r| *r as usize);
        assert_eq!(kept, all);
        assert_eq!(
            failure_reasons(ErrorClass::Config),
            [Reason::EvictionPolicy]
        );
        let series: usize = ErrorClass::ALL
            .map(|k| failure_reasons(k).len())
            .iter()
            .sum();
        assert_eq!(series, 21, "docs/metrics.md: at most 21 series");
    }
}
