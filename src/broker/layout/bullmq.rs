//! The layout of [BullMQ](https://github.com/taskforcesh/bullmq) 6.x (and 5.56 on), the Node.js
//! job runner on Redis (docs/layouts/bullmq.md): what `Queue.add(name, data, {jobId})` writes
//! (src/classes/job.ts `asJSON`, the Redis backend's `addJobToTransaction` and `optsAsJSON`,
//! src/commands/addStandardJob-9.lua and addDelayedJob-6.lua with their includes), so that an
//! unmodified `Worker` runs the jobs and `QueueEvents`, `Queue.getJobCounts` and dashboards such
//! as bull-board see them as their own.
//!
//! - Keys: `--namespace` is BullMQ's prefix followed by `:` (`bull:` for BullMQ's default
//!   `bull`; `{bull}:` on a Redis Cluster), and a queue's keys are `<ns><queue>:<type>`
//!   (src/classes/queue-keys.ts): the job hash `<ns><queue>:<uuid>`, the `id` counter, the
//!   `wait` list (or, for a paused queue of BullMQ 5, `paused`), `delayed`, `marker`, `meta` and
//!   the `events` stream.
//! - The job: the row's `uuid` is the custom job id (hyphenated), `job_type` the job's `name`,
//!   `payload` its `data` (which must be JSON, written as the row gave it, surrounding whitespace
//!   left out); `opts` are what `Queue.add` stores for `{jobId}` (`{"jobId":..,"attempts":0}`,
//!   and `delay` for a future `run_at`), `timestamp` Redis's time of the push in milliseconds.
//! - The dedup marker: the uuid, a member of a set
//!   `<ns>jobrelay:bullmq:marks:<ttl>:<interval>:<digit>` ([`Layout::marks_in_sets`]) BullMQ
//!   never reads, for `--dedup-ttl` (to twice that): a row replayed after its job was removed
//!   on completion (`removeOnComplete`) is a duplicate, where BullMQ's own duplicate-id check
//!   (the job hash exists) would add it again.
//! - Job options (the row's `options`, [`OPTIONS`]): `attempts`, `backoff`, `removeOnComplete`,
//!   `removeOnFail`, `lifo`, `keepLogs`, `stackTraceLimit`, `priority`, by BullMQ's names and
//!   types, stored in the job's `opts` as `Queue.add` stores them (`backoff` given as a number
//!   becomes `{"type":"fixed","delay":n}`, `keepLogs` is stored as `kl`); a `lifo` job goes to
//!   the wait list's head; a job of `priority` above 0 that is due goes to the queue's
//!   `prioritized` set as `addPrioritizedJob` adds it (a delayed one keeps its priority in its
//!   hash, where BullMQ's promotion reads it).
//! - No flows: BullMQ's parent waits for its children (the reverse of a jobrelay parent), so a
//!   row naming a parent or predecessor is [`Unfit`]. Headers have no place in a BullMQ job and
//!   are not written.

#[cfg(feature = "daemon")]
mod consumers;
#[cfg(feature = "daemon")]
mod peek;

use std::fmt::Write as _;

use chrono::{DateTime, Utc};

use super::{push_queue_key, refuse_flows, Layout, LayoutKind, Payload, Unfit};
use crate::job::{Job, Options};
use serde_json::Value;

/// The layout.
pub(super) static BULLMQ: Bullmq = Bullmq;

/// See the module.
#[derive(Debug)]
pub(super) struct Bullmq;

/// The marker sets' infix: `<ns>jobrelay:bullmq:marks:<ttl>:<interval>:<digit>`.
const MARKER_INFIX: &str = "jobrelay:bullmq:";

/// The wait list's suffix after the queue's name: `<ns><queue>:wait`.
const WAIT_SUFFIX: &str = ":wait";

/// What one job adds to a script call besides its data, its options (counted apart), the
/// namespace (twice), its queue name and its name: the uuid (36), `:wait` (5), the route (at
/// most 20 digits), the framing of six bulk strings (5 each plus the digits of their lengths,
/// at most 3, 3, 2, 3, 10 and 1 for an empty opts): 131.
const ARGS_OVERHEAD: usize = 144;

/// The job options BullMQ's `Queue.add` takes that this layout carries, by their names
/// (`JobsOptions`, src/types/job-options.ts), and what each must be.
pub(crate) const OPTIONS: [&str; 8] = [
    "attempts",
    "backoff",
    "removeOnComplete",
    "removeOnFail",
    "lifo",
    "keepLogs",
    "stackTraceLimit",
    "priority",
];

/// The highest `priority` BullMQ takes (src/classes/job.ts `PRIORITY_LIMIT`, 2^21 - 1): a
/// prioritized job's score is its priority times 2^32 plus a counter, exact in a double.
const PRIORITY_LIMIT: u64 = (1 << 21) - 1;

/// Whether `v` is an integer >= 0.
fn count(v: &Value) -> bool {
    v.as_u64().is_some()
}

/// A field of an option's object, and the test its value must pass.
type Field = (&'static str, fn(&Value) -> bool);

/// Whether `v` is an object of only the `fields`, each passing its test, with the `required`
/// ones present.
fn object_of(v: &Value, required: &[&str], fields: &[Field]) -> bool {
    let Some(map) = v.as_object() else {
        return false;
    };
    required.iter().all(|r| map.contains_key(*r))
        && map
            .iter()
            .all(|(k, v)| fields.iter().any(|(name, fits)| name == k && fits(v)))
}

/// What option `name` must be, when `value` is not that.
fn misfit(name: &str, value: &Value) -> Option<&'static str> {
    let keep_jobs = |v: &Value| {
        v.is_boolean() || count(v) || object_of(v, &[], &[("age", count), ("count", count)])
    };
    let (fits, what) = match name {
        "attempts" | "keepLogs" | "stackTraceLimit" => (count(value), "an integer >= 0"),
        "lifo" => (value.is_boolean(), "true or false"),
        "priority" => (
            value.as_u64().is_some_and(|p| p <= PRIORITY_LIMIT),
            "an integer from 0 to 2097151 (BullMQ's PRIORITY_LIMIT; 0: none)",
        ),
        "removeOnComplete" | "removeOnFail" => (
            keep_jobs(value),
            "true, false, an integer >= 0 or {\"age\": seconds, \"count\": n}",
        ),
        "backoff" => (
            count(value)
                || object_of(
                    value,
                    &["type"],
                    &[
                        ("type", |v: &Value| v.is_string()),
                        ("delay", count),
                        ("jitter", |v: &Value| {
                            v.as_f64().is_some_and(|j| (0.0..=1.0).contains(&j))
                        }),
                    ],
                ),
            "milliseconds (an integer >= 0) or {\"type\": \"fixed\" or \"exponential\", \
             \"delay\": milliseconds, \"jitter\": 0..1}",
        ),
        _ => return None,
    };
    (!fits).then_some(what)
}

/// Refuses names not in [`OPTIONS`], and values of the wrong type.
fn check_options(options: &Options) -> Result<(), Unfit> {
    super::refuse_unknown_options("bullmq", &OPTIONS, options)?;
    for (name, value) in options {
        if let Some(what) = misfit(name, value) {
            return Err(Unfit(format!(
                "option {name:?} for the bullmq layout; must be {what}, not {value}"
            )));
        }
    }
    Ok(())
}

/// The script's `opts` argument for a job's (checked) options: empty without options (the
/// script then stores `"attempts":0`, as `Queue.add`), else `F` or `L` (`lifo`), the
/// `priority` when above 0 (its digits), then the members `opts` gets after `jobId` and
/// `delay`, each with its leading comma, as `Queue.add`
/// stores them: `attempts` (0 unless given), `backoff` normalized (a number `n` is
/// `{"type":"fixed","delay":n}`, BullMQ's `Backoffs.normalize`), `keepLogs` as `kl`
/// (`optsEncodeMap`), the others as given.
fn opts_arg(options: &Options, out: &mut String) {
    out.clear();
    let _ = write_opts(options, out);
}

/// Writes [`opts_arg`] into `out`, without allocating. The names are those of [`OPTIONS`] (the
/// options were checked before a job is written): plain identifiers, written unescaped.
fn write_opts(options: &Options, out: &mut impl std::fmt::Write) -> std::fmt::Result {
    if options.is_empty() {
        return Ok(());
    }
    let lifo = options.get("lifo") == Some(&Value::Bool(true));
    out.write_char(if lifo { 'L' } else { 'F' })?;
    if let Some(priority) = options.get("priority").and_then(Value::as_u64) {
        if priority > 0 {
            write!(out, "{priority}")?;
        }
    }
    if !options.contains_key("attempts") {
        out.write_str(",\"attempts\":0")?;
    }
    for (name, value) in options {
        let stored = match name.as_str() {
            "keepLogs" => "kl",
            other => other,
        };
        write!(out, ",\"{stored}\":")?;
        match (name.as_str(), value) {
            ("backoff", Value::Number(n)) => write!(out, "{{\"type\":\"fixed\",\"delay\":{n}}}")?,
            _ => write!(out, "{value}")?,
        }
    }
    Ok(())
}

/// A `fmt::Write` that only counts the bytes written to it.
struct Length(usize);

impl std::fmt::Write for Length {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0 += s.len();
        Ok(())
    }
}

/// `run_at` in epoch milliseconds, rounded up: BullMQ runs a delayed job once its due
/// millisecond has come, so a job never runs before its `run_at`.
fn epoch_ms_ceil(t: DateTime<Utc>) -> i64 {
    let ms = t.timestamp_millis();
    if t.timestamp_subsec_nanos() % 1_000_000 != 0 {
        ms + 1
    } else {
        ms
    }
}

/// The payload as BullMQ's `data`: JSON text (surrounding whitespace left out), or why not.
pub(crate) fn data_of(payload: &[u8]) -> Result<&str, Unfit> {
    let unfit = |what: String| {
        Unfit(format!(
            "the bullmq layout needs the payload to be JSON (the job's data): {what}"
        ))
    };
    let text = std::str::from_utf8(payload).map_err(|e| unfit(format!("not UTF-8 ({e})")))?;
    let text = text.trim_matches(|c: char| matches!(c, ' ' | '\t' | '\n' | '\r'));
    if text.is_empty() {
        return Err(unfit("the payload is empty (no data: {})".to_owned()));
    }
    if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(text) {
        return Err(unfit(format!("not JSON ({e})")));
    }
    Ok(text)
}

impl Layout for Bullmq {
    fn kind(&self) -> LayoutKind {
        LayoutKind::Bullmq
    }

    fn name(&self) -> &'static str {
        "bullmq"
    }

    fn payload(&self) -> Payload {
        Payload::JsonArgs
    }

    fn default_namespace(&self) -> &'static str {
        // BullMQ's default prefix, "bull", and the ':' it joins keys with.
        "bull:"
    }

    fn check_namespace(&self, namespace: &str) -> std::result::Result<(), String> {
        // BullMQ names a queue's keys <prefix>:<queue>:<type> and never has an empty prefix.
        if namespace.len() >= 2 && namespace.ends_with(':') {
            return Ok(());
        }
        Err(format!(
            "{namespace:?} cannot match a BullMQ worker: with --layout bullmq, give \
             BullMQ's prefix followed by ':' (BullMQ's default prefix is \"bull\": \
             --namespace bull:, the default in this layout; on a Redis Cluster \
             --namespace '{{bull}}:' for the prefix '{{bull}}')"
        ))
    }

    #[cfg(feature = "daemon")]
    fn peek(&self) -> &dyn super::peek::Peek {
        self
    }

    #[cfg(feature = "daemon")]
    fn consumers(&self) -> &dyn super::consumers::Consumers {
        self
    }

    fn script(&self) -> &'static str {
        concat!(include_str!("prelude.lua"), include_str!("bullmq.lua"))
    }

    fn options(&self) -> &'static [&'static str] {
        &OPTIONS
    }

    fn check_options(&self, options: &Options) -> std::result::Result<(), Unfit> {
        check_options(options)
    }

    /// The job's data (the payload, checked to be JSON).
    fn encode(&self, job: &Job, buf: &mut Vec<u8>) -> std::result::Result<(), Unfit> {
        refuse_flows(
            job,
            "the bullmq layout has no flows (a BullMQ parent waits for its children, a \
                 FlowProducer's tree, not a job that waits for its parent)",
        )?;
        if job.queue.contains(':') {
            // QueueBase's constructor: "Queue name cannot contain :".
            return Err(Unfit(format!(
                "BullMQ queue names cannot contain ':' (the queue is {:?})",
                job.queue
            )));
        }
        buf.extend_from_slice(data_of(&job.payload)?.as_bytes());
        Ok(())
    }

    /// One key, the wait list `<ns><queue>:wait`, and five arguments: the uuid, the route
    /// (empty, or `run_at` in epoch milliseconds), the job's name, its data and its options
    /// ([`opts_arg`]: empty for a job without); see bullmq.lua.
    fn push_args(
        &self,
        inv: &mut redis::ScriptInvocation<'_>,
        namespace: &str,
        job: &Job,
        encoded: &[u8],
        key: &mut String,
    ) {
        push_queue_key(self, inv, namespace, job, key);
        if let Some(at) = job.run_at {
            let _ = write!(key, "{}", epoch_ms_ceil(at));
        }
        inv.arg(&*key).arg(&job.job_type).arg(encoded);
        opts_arg(&job.options, key);
        inv.arg(&*key);
        key.clear();
    }

    fn args_overhead(&self, namespace: &str, job: &Job, _encoded_len: usize) -> usize {
        let options = if job.options.is_empty() {
            0
        } else {
            let mut opts = Length(0);
            let _ = write_opts(&job.options, &mut opts);
            opts.0 + 16
        };
        2 * namespace.len() + job.queue.len() + job.job_type.len() + ARGS_OVERHEAD + options
    }

    fn marker_infix(&self) -> &'static str {
        MARKER_INFIX
    }

    /// BullMQ's keys have no infix: the wait list is `<ns><queue>:wait`.
    fn queue_infix(&self) -> &'static str {
        ""
    }

    fn queue_suffix(&self) -> &'static str {
        WAIT_SUFFIX
    }

    fn marks_in_sets(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_job;
    use super::*;
    use serde_json::json;

    fn job(payload: &str) -> Job {
        test_job("emails", "send", payload.as_bytes())
    }

    #[test]
    fn data_is_the_payload_as_written() {
        for (payload, data) in [
            (" {\"a\": 2.50, \"b\": [1]}\n", "{\"a\": 2.50, \"b\": [1]}"),
            ("[1,2]", "[1,2]"),
            ("\"x\"", "\"x\""),
            ("42", "42"),
            ("null", "null"),
        ] {
            let mut buf = Vec::new();
            BULLMQ.encode(&job(payload), &mut buf).unwrap();
            assert_eq!(String::from_utf8(buf).unwrap(), data);
        }
    }

    #[test]
    fn what_does_not_fit() {
        let mut buf = Vec::new();
        for (payload, why) in [("", "empty"), ("{", "not JSON"), ("[1] [2]", "not JSON")] {
            let e = BULLMQ.encode(&job(payload), &mut buf).unwrap_err();
            assert!(
                e.0.contains(why) && e.0.contains("bullmq"),
                "{payload:?}: {e}"
            );
        }
        let mut j = job("{}");
        j.payload = vec![b'"', 0xff, b'"'];
        assert!(BULLMQ.encode(&j, &mut buf).unwrap_err().0.contains("UTF-8"));
        let mut j = job("{}");
        j.parent_uuid = Some(j.uuid);
        assert!(BULLMQ
            .encode(&j, &mut buf)
            .unwrap_err()
            .0
            .contains("no flows"));
        let mut j = job("{}");
        j.predecessor_uuid = Some(j.uuid);
        assert!(BULLMQ
            .encode(&j, &mut buf)
            .unwrap_err()
            .0
            .contains("predecessor_uuid"));
        let mut j = job("{}");
        j.queue = "a:b".into();
        assert!(BULLMQ.encode(&j, &mut buf).unwrap_err().0.contains("':'"));
    }

    fn options(json: serde_json::Value) -> Options {
        serde_json::from_value(json).unwrap()
    }

    /// The script's opts argument: empty without options; else the lifo flag and the members
    /// as `Queue.add` stores them.
    #[test]
    fn opts_are_stored_as_queue_add_stores_them() {
        let mut out = String::from("stale");
        opts_arg(&Options::new(), &mut out);
        assert_eq!(out, "");
        opts_arg(
            &options(json!({"backoff": 200, "keepLogs": 5, "removeOnComplete": {"count": 3}})),
            &mut out,
        );
        assert_eq!(
            out,
            "F,\"attempts\":0,\"backoff\":{\"type\":\"fixed\",\"delay\":200},\"kl\":5,\
             \"removeOnComplete\":{\"count\":3}"
        );
        opts_arg(&options(json!({"attempts": 3, "lifo": true})), &mut out);
        assert_eq!(out, "L,\"attempts\":3,\"lifo\":true");
        opts_arg(&options(json!({"lifo": false})), &mut out);
        assert!(out.starts_with("F,"), "{out}");
        // A priority above 0 follows the flag, and stays a member of opts; 0 is no priority.
        opts_arg(&options(json!({"priority": 2097151})), &mut out);
        assert_eq!(out, "F2097151,\"attempts\":0,\"priority\":2097151");
        opts_arg(&options(json!({"priority": 0, "lifo": true})), &mut out);
        assert_eq!(out, "L,\"attempts\":0,\"lifo\":true,\"priority\":0");
        // The size counted for the call is the size written.
        let mut length = Length(0);
        let _ = write_opts(&options(json!({"priority": 0, "lifo": true})), &mut length);
        assert_eq!(length.0, out.len());
    }

    /// Names BullMQ does not take and values of the wrong type are refused, naming the option.
    #[test]
    fn refuses_unknown_options_and_wrong_types() {
        let refusal = |json| BULLMQ.check_options(&options(json)).unwrap_err().0;
        let r = refusal(json!({"jobId": "x"}));
        assert!(
            r.starts_with("unknown option \"jobId\" for the bullmq layout; known: attempts"),
            "{r}"
        );
        for (json, name) in [
            (json!({"attempts": "3"}), "attempts"),
            (json!({"attempts": -1}), "attempts"),
            (json!({"backoff": {"delay": 200}}), "backoff"),
            (
                json!({"backoff": {"type": "fixed", "delay": 1.5}}),
                "backoff",
            ),
            (
                json!({"backoff": {"type": "fixed", "jitter": 2}}),
                "backoff",
            ),
            (json!({"backoff": {"type": "fixed", "other": 1}}), "backoff"),
            (json!({"removeOnComplete": "yes"}), "removeOnComplete"),
            (json!({"removeOnFail": {"age": -1}}), "removeOnFail"),
            (json!({"lifo": 1}), "lifo"),
            (json!({"keepLogs": true}), "keepLogs"),
            (json!({"stackTraceLimit": 0.5}), "stackTraceLimit"),
            (json!({"priority": 2097152}), "priority"),
            (json!({"priority": -1}), "priority"),
            (json!({"priority": 1.5}), "priority"),
        ] {
            let r = refusal(json.clone());
            assert!(
                r.starts_with(&format!(
                    "option \"{name}\" for the bullmq layout; must be "
                )),
                "{json}: {r}"
            );
        }
        let fine = options(json!({
            "attempts": 3, "backoff": {"type": "exponential", "delay": 1000, "jitter": 0.5},
            "removeOnComplete": true, "removeOnFail": {"age": 3600, "count": 100}, "lifo": false,
            "keepLogs": 10, "stackTraceLimit": 0, "priority": 2097151,
        }));
        assert!(BULLMQ.check_options(&fine).is_ok());
    }

    #[test]
    fn run_at_rounds_up_to_the_millisecond() {
        let t = |s, ns| DateTime::from_timestamp(s, ns).unwrap();
        assert_eq!(epoch_ms_ceil(t(1_700_000_000, 0)), 1_700_000_000_000);
        assert_eq!(
            epoch_ms_ceil(t(1_700_000_000, 5_000_000)),
            1_700_000_000_005
        );
        assert_eq!(
            epoch_ms_ceil(t(1_700_000_000, 5_000_001)),
            1_700_000_000_006
        );
        assert_eq!(
            epoch_ms_ceil(t(1_700_000_000, 999_999_000)),
            1_700_000_001_000
        );
    }

    #[test]
    fn keys() {
        assert!(BULLMQ.marks_in_sets());
        assert_eq!(BULLMQ.marker_infix(), "jobrelay:bullmq:");
        assert_eq!(BULLMQ.queue_key("bull:", "emails"), "bull:emails:wait");
        assert_eq!(BULLMQ.queue_key("{bull}:", "emails"), "{bull}:emails:wait");
    }
}
