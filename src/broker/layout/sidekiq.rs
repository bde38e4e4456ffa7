//! The layout of [Sidekiq](https://github.com/sidekiq/sidekiq) 6.x and 7.x, the Ruby job runner
//! (docs/layouts/sidekiq.md): what `Sidekiq::Client#push` writes, so that an unmodified
//! Sidekiq process runs the jobs and its Web UI and API (`Sidekiq::Queue`, `Sidekiq::Stats`,
//! `Sidekiq::ScheduledSet`) show them as their own.
//!
//! - Wire format: the job hash as JSON, built here, keys as the client's `normalize_item`
//!   (`lib/sidekiq/job_util.rb`) and `atomic_push` (`lib/sidekiq/client.rb`) write them:
//!   `retry` (the row's option, else `true`), `queue`, `class` (`job_type`), `args` (the
//!   payload, which must be a JSON array, written as it is), `jid` (the uuid's 32 hex digits),
//!   `created_at` (the row's, epoch seconds as a Float), `enqueued_at` (the push's, epoch
//!   seconds; not for a job that goes to the scheduled set), then the headers whose names are
//!   not [`RESERVED`].
//! - Keys (`--namespace` is a raw prefix, empty for a stock Sidekiq): `<ns>queue:<queue>`
//!   (`LPUSH`), `<ns>queues` (`SADD` of the queue's name), `<ns>schedule` (score: `run_at` in
//!   epoch seconds, the fraction kept, as the client's `at`).
//! - The dedup marker `<ns>jobrelay:sidekiq:<uuid>`, a key Sidekiq never touches, holding the
//!   job's JSON for `--dedup-ttl`.
//! - Job options (the row's `options`): `retry`, `retry_queue`, `backtrace`, `dead`, `tags` and
//!   `retry_for` by Sidekiq's names and types ([`OPTIONS`]; `retry` replaces the default `true`,
//!   the others follow `enqueued_at`), and any other name as a key of the job with its JSON value,
//!   as a client middleware would add it, except the keys Sidekiq sets itself
//!   ([`SET_BY_SIDEKIQ`]). A header of an option's name is left out.
//! - Sidekiq has no flows: a row naming a parent or a predecessor is [`Unfit`], and so is a
//!   payload that is not a JSON array.

#[cfg(feature = "daemon")]
mod consumers;
#[cfg(feature = "daemon")]
mod peek;

use std::fmt::Write as _;
use std::io::Write as _;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{push_keys, refuse_flows, Layout, LayoutKind, Payload, Unfit};
use crate::job::{epoch_score, Job, Options};

/// The layout.
pub(super) static SIDEKIQ: Sidekiq = Sidekiq;

/// See the module.
#[derive(Debug)]
pub(super) struct Sidekiq;

/// The marker key's infix: `<ns>jobrelay:sidekiq:<uuid>`.
const MARKER_INFIX: &str = "jobrelay:sidekiq:";

/// Header names that are never written into the job: the keys the relay writes itself, `at`
/// (the client's schedule time, never stored in the job) and the keys Sidekiq's retry logic
/// and its Web UI read with a type of their own (numbers, booleans, arrays). A header of one
/// of these names is left out; every other header becomes a string-valued key of the job
/// (e.g. `wrapped` for an ActiveJob job, `traceparent`).
pub const RESERVED: [&str; 18] = [
    "args",
    "at",
    "backtrace",
    "class",
    "created_at",
    "dead",
    "enqueued_at",
    "error_backtrace",
    "error_class",
    "error_message",
    "failed_at",
    "jid",
    "queue",
    "retried_at",
    "retry",
    "retry_count",
    "retry_for",
    "tags",
];

/// The job options Sidekiq reads with a type of its own (`lib/sidekiq/job_retry.rb`,
/// `job_util.rb`), and what each must be: `retry` (`false`: no retry and no dead-set entry; a
/// count of retries; `true`: 25), `retry_queue` (the queue retries go to), `backtrace` (keep
/// the error's backtrace, all of it or that many lines), `dead` (`false`: no dead-set entry
/// once retries are exhausted), `tags` (shown by the Web UI), `retry_for` (Sidekiq 7.1: retry
/// for that many seconds instead of a count; ignored by 6.x).
pub(crate) const OPTIONS: [(&str, OptionType); 6] = [
    ("retry", OptionType::BoolOrCount),
    ("retry_queue", OptionType::QueueName),
    ("backtrace", OptionType::BoolOrCount),
    ("dead", OptionType::Bool),
    ("tags", OptionType::Strings),
    ("retry_for", OptionType::Count),
];

/// The names of [`OPTIONS`].
const OPTION_NAMES: [&str; 6] = {
    let mut names = [""; 6];
    let mut i = 0;
    while i < OPTIONS.len() {
        names[i] = OPTIONS[i].0;
        i += 1;
    }
    names
};

/// What a Sidekiq job option must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OptionType {
    /// `true`, `false` or an integer >= 0.
    BoolOrCount,
    /// `true` or `false`.
    Bool,
    /// An integer >= 0.
    Count,
    /// A queue's name, as the row's `queue` (1..=128 characters of `[A-Za-z0-9_.:-]`).
    QueueName,
    /// An array of strings.
    Strings,
}

impl OptionType {
    fn fits(self, v: &serde_json::Value) -> bool {
        use serde_json::Value;
        let count = |v: &Value| v.as_u64().is_some();
        match self {
            OptionType::BoolOrCount => v.is_boolean() || count(v),
            OptionType::Bool => v.is_boolean(),
            OptionType::Count => count(v),
            OptionType::QueueName => v
                .as_str()
                .is_some_and(|q| crate::job::validate_queue(q).is_ok()),
            OptionType::Strings => v
                .as_array()
                .is_some_and(|items| items.iter().all(Value::is_string)),
        }
    }

    fn describe(self) -> &'static str {
        match self {
            OptionType::BoolOrCount => "true, false or an integer >= 0",
            OptionType::Bool => "true or false",
            OptionType::Count => "an integer >= 0",
            OptionType::QueueName => "a queue name (1..=128 characters of A-Za-z0-9_.:-)",
            OptionType::Strings => "an array of strings",
        }
    }
}

/// The keys of a job that Sidekiq sets itself, refused as options: those its client writes
/// from the row (`class`, `args`, `jid`, `queue`, `created_at`, `enqueued_at`, and `at`, which
/// it turns into the scheduled set's score) and those its retry logic writes.
pub(crate) const SET_BY_SIDEKIQ: [&str; 13] = [
    "args",
    "at",
    "class",
    "created_at",
    "enqueued_at",
    "error_backtrace",
    "error_class",
    "error_message",
    "failed_at",
    "jid",
    "queue",
    "retried_at",
    "retry_count",
];

/// Refuses options Sidekiq could not read: one it sets itself, or one of [`OPTIONS`] of
/// another type. Every other name passes.
fn check_options(options: &Options) -> Result<(), Unfit> {
    for (name, value) in options {
        if SET_BY_SIDEKIQ.contains(&name.as_str()) {
            return Err(Unfit(format!(
                "reserved option {name:?} for the sidekiq layout; Sidekiq sets it itself (from \
                 the row, or when it retries): {}",
                SET_BY_SIDEKIQ.join(", ")
            )));
        }
        if let Some((_, ty)) = OPTIONS.iter().find(|(n, _)| n == name) {
            if !ty.fits(value) {
                return Err(Unfit(format!(
                    "option {name:?} for the sidekiq layout; must be {}, not {value}",
                    ty.describe()
                )));
            }
        }
    }
    Ok(())
}

/// How deep `args` may nest, counting `args` itself as 1: Sidekiq parses a job with Ruby's
/// `JSON.parse`, whose `max_nesting` is 100, and the job hash around `args` is the first level.
/// A deeper job would be acknowledged by Redis and then fail to parse in the worker, which
/// sends it to its dead set.
pub const MAX_ARGS_DEPTH: usize = 99;

/// What one job adds to a script call besides its JSON, the namespace (twice) and its queue
/// name: the marker key's infix and uuid (53), `queue:` (6), the route (a `run_at` score, at
/// most 24 characters), the framing of four bulk strings (5 each plus the digits of their
/// lengths, at most 10 each): 143.
const ARGS_OVERHEAD: usize = 160;

/// Appends `t` as epoch seconds, a JSON number with the microseconds and no trailing zeros
/// (`1700000000.654321`, `1700000000.5`, `1700000000.0`): the Float Ruby's `Time#to_f` gives
/// and its JSON writes, read back as the same instant. Written in decimal from the integers,
/// so that no floating-point rounding changes a digit.
fn epoch_seconds(buf: &mut Vec<u8>, t: DateTime<Utc>) {
    let (secs, micros) = (t.timestamp(), t.timestamp_subsec_micros());
    if secs < 0 {
        // Before 1970 the fraction counts towards zero; let floating point say it plainly.
        let f = secs as f64 + f64::from(micros) / 1e6;
        serde_json::to_writer(&mut *buf, &f).expect("a float serialises");
        return;
    }
    let (mut frac, mut width) = (micros, 6usize);
    while width > 1 && frac % 10 == 0 {
        frac /= 10;
        width -= 1;
    }
    let _ = write!(buf, "{secs}.{frac:0width$}");
}

/// What a JSON text is, by its first character (for a refusal's message).
fn json_kind(text: &str) -> &'static str {
    match text.as_bytes().first() {
        Some(b'{') => "an object",
        Some(b'"') => "a string",
        Some(b't' | b'f') => "a boolean",
        Some(b'n') => "null",
        _ => "a number",
    }
}

/// How deeply `json` (valid JSON) nests arrays and objects.
fn depth(json: &str) -> usize {
    let (mut depth, mut max, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for &b in json.as_bytes() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
        } else {
            match b {
                b'"' => in_string = true,
                b'[' | b'{' => {
                    depth += 1;
                    max = max.max(depth);
                }
                b']' | b'}' => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
    }
    max
}

/// The payload as Sidekiq's `args`: a JSON array (surrounding whitespace left out), or why not.
pub(crate) fn args_of(payload: &[u8]) -> Result<&str, Unfit> {
    let unfit = |what: String| {
        Unfit(format!(
            "the sidekiq layout needs the payload to be a JSON array (Sidekiq's args): {what}"
        ))
    };
    let text = std::str::from_utf8(payload).map_err(|e| unfit(format!("not UTF-8 ({e})")))?;
    let text = text.trim_matches(|c: char| matches!(c, ' ' | '\t' | '\n' | '\r'));
    if text.is_empty() {
        return Err(unfit("the payload is empty (no arguments: [])".to_owned()));
    }
    if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(text) {
        return Err(unfit(format!("not JSON ({e})")));
    }
    if !text.starts_with('[') {
        return Err(unfit(format!("{}, not an array", json_kind(text))));
    }
    let d = depth(text);
    if d > MAX_ARGS_DEPTH {
        return Err(unfit(format!(
            "it nests {d} levels deep, Sidekiq parses at most {MAX_ARGS_DEPTH} inside a job"
        )));
    }
    Ok(text)
}

/// Appends `s` as a JSON string.
fn string(buf: &mut Vec<u8>, s: &str) {
    serde_json::to_writer(&mut *buf, s).expect("a string serialises");
}

impl Sidekiq {
    /// The job's JSON; `enqueued_at` is `None` for a job bound for the scheduled set (and for
    /// one whose `run_at` turns out to have passed: the script then adds Redis's time).
    fn json(job: &Job, args: &str, enqueued_at: Option<DateTime<Utc>>, buf: &mut Vec<u8>) {
        let mut jid = Uuid::encode_buffer();
        let options = &job.options;
        match options.get("retry") {
            None => buf.extend_from_slice(b"{\"retry\":true,\"queue\":"),
            Some(retry) => {
                buf.extend_from_slice(b"{\"retry\":");
                serde_json::to_writer(&mut *buf, retry).expect("a JSON value serialises");
                buf.extend_from_slice(b",\"queue\":");
            }
        }
        string(buf, &job.queue);
        buf.extend_from_slice(b",\"class\":");
        string(buf, &job.job_type);
        buf.extend_from_slice(b",\"args\":");
        buf.extend_from_slice(args.as_bytes());
        buf.extend_from_slice(b",\"jid\":");
        string(buf, job.uuid.simple().encode_lower(&mut jid));
        buf.extend_from_slice(b",\"created_at\":");
        epoch_seconds(buf, job.created_at);
        if let Some(at) = enqueued_at {
            buf.extend_from_slice(b",\"enqueued_at\":");
            epoch_seconds(buf, at);
        }
        for (name, value) in options.iter() {
            if name == "retry" {
                continue;
            }
            buf.push(b',');
            string(buf, name);
            buf.push(b':');
            serde_json::to_writer(&mut *buf, value).expect("a JSON value serialises");
        }
        for (name, value) in &job.headers {
            if RESERVED.contains(&name.as_str())
                || (!options.is_empty() && options.contains_key(name))
            {
                continue;
            }
            buf.push(b',');
            string(buf, name);
            buf.push(b':');
            string(buf, value);
        }
        buf.push(b'}');
    }
}

impl Layout for Sidekiq {
    fn kind(&self) -> LayoutKind {
        LayoutKind::Sidekiq
    }

    fn name(&self) -> &'static str {
        "sidekiq"
    }

    fn payload(&self) -> Payload {
        Payload::JsonArgs
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
        concat!(include_str!("prelude.lua"), include_str!("sidekiq.lua"))
    }

    fn options(&self) -> &'static [&'static str] {
        &OPTION_NAMES
    }

    fn check_options(&self, options: &Options) -> std::result::Result<(), Unfit> {
        check_options(options)
    }

    fn encode(&self, job: &Job, buf: &mut Vec<u8>) -> std::result::Result<(), Unfit> {
        refuse_flows(job, "the sidekiq layout has no flows")?;
        let args = args_of(&job.payload)?;
        // As the client's atomic_push: the moment of the push, for a job bound for its queue.
        let enqueued_at = job.run_at.is_none().then(Utc::now);
        Sidekiq::json(job, args, enqueued_at, buf);
        Ok(())
    }

    /// Two keys, the marker key and the queue key, and two arguments: the route and the job's
    /// JSON. The route is empty for a job without `run_at` (its JSON carries `enqueued_at`),
    /// else `run_at` in epoch seconds (the scheduled set's score); see sidekiq.lua.
    fn push_args(
        &self,
        inv: &mut redis::ScriptInvocation<'_>,
        namespace: &str,
        job: &Job,
        encoded: &[u8],
        key: &mut String,
    ) {
        push_keys(self, inv, namespace, job, key);
        if let Some(at) = job.run_at {
            let _ = write!(key, "{}", epoch_score(at));
        }
        inv.arg(&*key).arg(encoded);
    }

    fn args_overhead(&self, namespace: &str, job: &Job, _encoded_len: usize) -> usize {
        2 * namespace.len() + job.queue.len() + ARGS_OVERHEAD
    }

    fn marker_infix(&self) -> &'static str {
        MARKER_INFIX
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_job;
    use super::*;
    use std::collections::BTreeMap;

    fn job(payload: &str) -> Job {
        Job {
            created_at: DateTime::from_timestamp(1_700_000_000, 654_321_000).unwrap(),
            headers: BTreeMap::from([
                ("traceparent".to_owned(), "00-ab".to_owned()),
                ("jid".to_owned(), "not mine".to_owned()),
                ("retry".to_owned(), "false".to_owned()),
                ("wrapped".to_owned(), "ChargeJob".to_owned()),
            ]),
            ..test_job("mailers", "Billing::ChargeCard", payload.as_bytes())
        }
    }

    fn encoded(j: &Job) -> serde_json::Value {
        let mut buf = Vec::new();
        SIDEKIQ.encode(j, &mut buf).unwrap();
        serde_json::from_slice(&buf).unwrap()
    }

    fn now_float() -> f64 {
        let t = Utc::now();
        t.timestamp() as f64 + f64::from(t.timestamp_subsec_micros()) / 1e6
    }

    #[test]
    fn writes_what_the_sidekiq_client_writes() {
        let before = now_float();
        let v = encoded(&job(" [1, \"é\", {\"a\": [null, true, 1.5]}]\n"));
        let after = now_float() + 1e-6;
        let enqueued_at = v["enqueued_at"].as_f64().unwrap();
        assert!(before <= enqueued_at && enqueued_at <= after, "{v}");
        let mut want = serde_json::json!({
            "retry": true,
            "queue": "mailers",
            "class": "Billing::ChargeCard",
            "args": [1, "é", {"a": [null, true, 1.5]}],
            "jid": "6f1c2a3b4d5e4f608a7192b3c4d5e6f7",
            "created_at": 1_700_000_000.654321,
            "traceparent": "00-ab",
            "wrapped": "ChargeJob",
        });
        want["enqueued_at"] = v["enqueued_at"].clone();
        assert_eq!(v, want, "reserved headers (jid, retry) left out");

        // Bound for the scheduled set: no enqueued_at, as the client's atomic_push.
        let mut j = job("[]");
        j.run_at = Some(DateTime::from_timestamp(1_800_000_000, 0).unwrap());
        let v = encoded(&j);
        assert!(v.get("enqueued_at").is_none(), "{v}");
        assert_eq!(v["args"], serde_json::json!([]));
        let mut buf = Vec::new();
        SIDEKIQ.encode(&j, &mut buf).unwrap();
        let text = String::from_utf8(buf).unwrap();
        assert!(
            text.ends_with('}'),
            "the script appends enqueued_at before the last byte"
        );
        assert!(
            text.contains("\"created_at\":1700000000.654321,"),
            "a Float as Ruby writes it: {text}"
        );
        for (micros, want) in [
            (0, "1.0"),
            (500_000, "1.5"),
            (5, "1.000005"),
            (120, "1.00012"),
        ] {
            let mut buf = Vec::new();
            epoch_seconds(
                &mut buf,
                DateTime::from_timestamp(1, micros * 1000).unwrap(),
            );
            assert_eq!(String::from_utf8(buf).unwrap(), want);
        }
    }

    #[test]
    fn refuses_what_is_not_an_array_and_flows() {
        let reason = |payload: &[u8]| {
            let mut j = job("");
            j.payload = payload.to_vec();
            SIDEKIQ.encode(&j, &mut Vec::new()).unwrap_err().0
        };
        for (payload, says) in [
            (&b"{\"a\":1}"[..], "an object, not an array"),
            (&b"\"x\""[..], "a string, not an array"),
            (&b"42"[..], "a number, not an array"),
            (&b"null"[..], "null, not an array"),
            (&b"[1,"[..], "not JSON"),
            (&b"[1] [2]"[..], "not JSON"),
            (&b""[..], "empty"),
            (&b"[\"\xff\"]"[..], "not UTF-8"),
        ] {
            let r = reason(payload);
            assert!(
                r.contains(says) && r.contains("sidekiq layout"),
                "{payload:?}: {r}"
            );
        }
        let nested = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(args_of(nested(MAX_ARGS_DEPTH).as_bytes()).is_ok());
        assert!(reason(nested(MAX_ARGS_DEPTH + 1).as_bytes()).contains("levels deep"));
        // Brackets inside strings do not count.
        assert_eq!(depth(r#"["[[[\"[", {"]": "}"}]"#), 2);

        let mut j = job("[]");
        j.parent_uuid = Some(Uuid::from_u128(7));
        let r = SIDEKIQ.encode(&j, &mut Vec::new()).unwrap_err().0;
        assert!(
            r.starts_with("the sidekiq layout has no flows") && r.contains("parent_uuid"),
            "{r}"
        );
        let mut j = job("[]");
        j.predecessor_uuid = Some(Uuid::from_u128(7));
        let r = SIDEKIQ.encode(&j, &mut Vec::new()).unwrap_err().0;
        assert!(
            r.contains("has no flows") && r.contains("predecessor_uuid"),
            "{r}"
        );
    }

    /// Options as Sidekiq's client writes them: `retry` in its place, the others and custom
    /// keys after `enqueued_at` with their JSON values; a header of an option's name left out.
    #[test]
    fn writes_options_as_the_client_does() {
        let mut j = job("[1]");
        j.options = serde_json::from_value(serde_json::json!({
            "retry": 2, "retry_queue": "low", "backtrace": true, "dead": false,
            "tags": ["a", "b"], "bid": {"id": 7}, "wrapped": "Other",
        }))
        .unwrap();
        let mut buf = Vec::new();
        SIDEKIQ.check_options(&j.options).unwrap();
        SIDEKIQ.encode(&j, &mut buf).unwrap();
        let text = String::from_utf8(buf).unwrap();
        assert!(
            text.starts_with("{\"retry\":2,\"queue\":\"mailers\","),
            "{text}"
        );
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        for (k, want) in [
            ("retry_queue", serde_json::json!("low")),
            ("backtrace", serde_json::json!(true)),
            ("dead", serde_json::json!(false)),
            ("tags", serde_json::json!(["a", "b"])),
            ("bid", serde_json::json!({"id": 7})),
            ("wrapped", serde_json::json!("Other")),
            ("traceparent", serde_json::json!("00-ab")),
        ] {
            assert_eq!(v[k], want, "{k}: {text}");
        }
        assert_eq!(text.matches("\"wrapped\"").count(), 1, "{text}");
        // Without options: the default retry, as before.
        assert!(encoded(&job("[]"))["retry"] == serde_json::json!(true));
    }

    /// Options Sidekiq sets itself, or of the wrong type, are refused naming the option.
    #[test]
    fn refuses_reserved_options_and_wrong_types() {
        let refusal = |json: serde_json::Value| {
            let options: Options = serde_json::from_value(json).unwrap();
            SIDEKIQ.check_options(&options).unwrap_err().0
        };
        for name in SET_BY_SIDEKIQ {
            let r = refusal(serde_json::json!({ name: 1 }));
            assert!(
                r.starts_with(&format!(
                    "reserved option \"{name}\" for the sidekiq layout;"
                )),
                "{r}"
            );
        }
        for (json, name) in [
            (serde_json::json!({"retry": "false"}), "retry"),
            (serde_json::json!({"retry": -1}), "retry"),
            (serde_json::json!({"retry": 1.5}), "retry"),
            (serde_json::json!({"backtrace": "yes"}), "backtrace"),
            (serde_json::json!({"dead": 0}), "dead"),
            (serde_json::json!({"tags": "a"}), "tags"),
            (serde_json::json!({"tags": [1]}), "tags"),
            (serde_json::json!({"retry_queue": ""}), "retry_queue"),
            (serde_json::json!({"retry_queue": 5}), "retry_queue"),
            (serde_json::json!({"retry_for": true}), "retry_for"),
        ] {
            let r = refusal(json.clone());
            assert!(
                r.starts_with(&format!(
                    "option \"{name}\" for the sidekiq layout; must be "
                )),
                "{json}: {r}"
            );
        }
        let ok: Options = serde_json::from_value(serde_json::json!({
            "retry": false, "backtrace": 10, "retry_for": 3600, "custom": null
        }))
        .unwrap();
        assert!(SIDEKIQ.check_options(&ok).is_ok());
    }

    #[test]
    fn keys() {
        let u = job("[]").uuid;
        assert_eq!(
            SIDEKIQ.marker_key("", u),
            "jobrelay:sidekiq:6f1c2a3b-4d5e-4f60-8a71-92b3c4d5e6f7"
        );
        assert_eq!(SIDEKIQ.queue_key("app:", "default"), "app:queue:default");
    }
}
