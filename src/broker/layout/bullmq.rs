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
//! - No flows: BullMQ's parent waits for its children (the reverse of a jobrelay parent), so a
//!   row naming a parent or predecessor is [`Unfit`]. Headers have no place in a BullMQ job and
//!   are not written.

#[cfg(feature = "daemon")]
mod peek;

use std::fmt::Write as _;

use chrono::{DateTime, Utc};

use super::{push_queue_key, refuse_flows, Layout, LayoutKind, Payload, Unfit};
use crate::job::Job;

/// The layout.
pub(super) static BULLMQ: Bullmq = Bullmq;

/// See the module.
#[derive(Debug)]
pub(super) struct Bullmq;

/// The marker sets' infix: `<ns>jobrelay:bullmq:marks:<ttl>:<interval>:<digit>`.
const MARKER_INFIX: &str = "jobrelay:bullmq:";

/// The wait list's suffix after the queue's name: `<ns><queue>:wait`.
const WAIT_SUFFIX: &str = ":wait";

/// What one job adds to a script call besides its data, the namespace (twice), its queue name
/// and its name: the uuid (36), `:wait` (5), the route (at most 20
/// digits), the framing of five bulk strings (5 each plus the digits of their lengths, at most
/// 3, 3, 2, 3 and 10): 125.
const ARGS_OVERHEAD: usize = 144;

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

    fn script(&self) -> &'static str {
        concat!(include_str!("prelude.lua"), include_str!("bullmq.lua"))
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

    /// One key, the wait list `<ns><queue>:wait`, and four arguments: the uuid, the route
    /// (empty, or `run_at` in epoch milliseconds), the job's
    /// name and its data; see bullmq.lua.
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
        key.clear();
    }

    fn args_overhead(&self, namespace: &str, job: &Job, _encoded_len: usize) -> usize {
        2 * namespace.len() + job.queue.len() + job.job_type.len() + ARGS_OVERHEAD
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
