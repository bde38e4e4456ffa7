//! The layout of [Celery](https://docs.celeryq.dev/) 5 on its Redis broker (kombu's Redis
//! transport), task message protocol 2 with the JSON serializer (docs/layouts/celery.md).
//!
//! - Wire format: the envelope kombu's Redis transport `LPUSH`es for `apply_async`, built from
//!   celery's `AMQP.as_task_v2` and `send_task_message` (celery/app/amqp.py), kombu's
//!   `Producer.publish` (kombu/messaging.py), `Channel.prepare_message` and
//!   `_inplace_augment_message` (kombu/transport/virtual/base.py) and `Channel._put`
//!   (kombu/transport/redis.py): a JSON object with `body` (base64 of the JSON
//!   `[args, kwargs, embed]`), `content-encoding`, `content-type`, `headers` (the task's:
//!   `lang`, `task`, `id`, ...) and `properties` (`correlation_id`, `reply_to`,
//!   `delivery_mode`, `delivery_info`, `priority`, `body_encoding`, `delivery_tag`).
//! - The row's `payload` is a JSON array (the args) or an object `{"args": [...], "kwargs":
//!   {...}}`; anything else does not fit. The args and kwargs go into the body as the row
//!   wrote them (their JSON text, not re-encoded); the headers `argsrepr` and `kwargsrepr` are
//!   celery's `saferepr` of what a worker decodes from them (celery/saferepr.rs), `()` for no
//!   args (as_task_v2's `args or ()`).
//! - The message is written straight into the caller's buffer, field by field: its layout is
//!   fixed, and a general JSON serializer spent more time than the rest of the relay's work
//!   for the job.
//! - Keys: the queue's list is `<ns><queue>` (priority 0, kombu's `_q_for_pri`: the queue name
//!   itself; a job whose `priority` option is 3 or more goes to kombu's list of its step,
//!   `<ns><queue>\x06\x16<step>`, [`Layout::list_suffix`]); `--namespace` is kombu's
//!   `global_keyprefix` (empty for a stock worker). The
//!   relay writes no `_kombu.binding.*` set: a worker declares its own queues when it starts,
//!   and a message published to the default (anonymous) exchange, as celery's client does for
//!   a direct queue, is routed by its queue name, never through a binding.
//! - The dedup marker `<ns>jobrelay:celery:<uuid>`, a key kombu and celery never read.
//! - Job options (the row's `options`, [`options::OPTIONS`]): `expires`, `time_limit`,
//!   `soft_time_limit`, `ignore_result`, `retries`, `shadow` and `priority`, by the names and
//!   types of celery's `apply_async`, written where its client writes them (celery/options.rs);
//!   a job without options gets the constant bytes of celery's defaults.
//! - No flows (celery's chains and chords travel in the message body) and no scheduled set:
//!   rows wait in the outbox until their `run_at` is due ([`ClaimNeeds::holds_until_due`]) and go
//!   out without an ETA.

#[cfg(feature = "daemon")]
mod consumers;
mod options;
#[cfg(feature = "daemon")]
mod peek;
mod saferepr;

use std::io::Write as _;

use base64::write::EncoderWriter;
use chrono::{SecondsFormat, Utc};
use uuid::Uuid;

use self::options::Opts;
use self::saferepr::saferepr;
use super::args_kwargs::split_payload;
use super::{push_keys, ClaimNeeds, Layout, LayoutKind, Payload, Unfit};
use crate::job::{Job, Options};

/// The layout.
pub(super) static CELERY: Celery = Celery;

/// See the module.
#[derive(Debug)]
pub(super) struct Celery;

/// The marker key's infix: `<ns>jobrelay:celery:<uuid>`.
const MARKER_INFIX: &str = "jobrelay:celery:";

/// What one job adds to a call besides its message, the namespace (twice) and its queue name:
/// the marker key's infix and uuid (52), a priority list's suffix (3) and the framing of three
/// bulk strings (5 each plus the digits of their lengths, at most 3, 3 and 10): 86.
const ARGS_OVERHEAD: usize = 96;

/// `origin` of every message (celery's client writes its node name, `gen<pid>@<host>`).
const ORIGIN: &str = "jobrelay";

/// The message headers celery's client writes (`as_task_v2`), kombu's `compression`, and the
/// names celery's worker sets on a task's request from other parts of the message (a header of
/// the same name would be overwritten or would change how the task runs). A row header with one
/// of these names is left out: celery's own values win.
const RESERVED_HEADERS: &[&str] = &[
    "lang",
    "task",
    "id",
    "shadow",
    "eta",
    "expires",
    "group",
    "group_index",
    "retries",
    "timelimit",
    "root_id",
    "parent_id",
    "argsrepr",
    "kwargsrepr",
    "origin",
    "ignore_result",
    "replaced_task_nesting",
    "stamped_headers",
    "stamps",
    "compression",
    "properties",
    "reply_to",
    "correlation_id",
    "hostname",
    "delivery_info",
    "args",
    "kwargs",
    "is_eager",
    "callbacks",
    "errbacks",
    "chain",
    "chord",
    "called_directly",
];

/// Whether celery owns the header `name` (a row header of that name is left out).
fn is_reserved_header(name: &str) -> bool {
    RESERVED_HEADERS.contains(&name)
}

/// What a celery payload must be (the start of each reason it is not).
const SHAPE: &str = "the payload must be a JSON array of args or an object \
                     {\"args\": [...], \"kwargs\": {...}}";

/// The task body's third element (celery's `embed`): no callbacks, errbacks, chain or chord.
const EMBED: &str = r#"{"callbacks": null, "errbacks": null, "chain": null, "chord": null}"#;

impl Celery {
    /// The envelope of `job` with the delivery tag `tag`, into `buf`: written field by field,
    /// in the order kombu writes them (the tests hold it to what celery's client writes).
    fn envelope(job: &Job, tag: Uuid, buf: &mut Vec<u8>) -> Result<(), Unfit> {
        if job.parent_uuid.is_some() || job.predecessor_uuid.is_some() {
            return Err(Unfit(
                "celery has no parent or predecessor jobs (its chains and chords travel in the \
                 message body): leave parent_uuid and predecessor_uuid empty"
                    .to_owned(),
            ));
        }
        let (args, kwargs) = split_payload(&job.payload, SHAPE)?;
        // Most jobs have no options: their message is the constant bytes below.
        let opts = if job.options.is_empty() {
            None
        } else {
            Some(Opts::of(&job.options)?)
        };
        let mut argsrepr = String::with_capacity(args.len().min(1100));
        if is_empty_array(args) {
            // as_task_v2's `args or ()`: no args show as an empty tuple.
            argsrepr.push_str("()");
        } else {
            saferepr(args, &mut argsrepr)?;
        }
        let mut kwargsrepr = String::with_capacity(kwargs.len().min(1100));
        saferepr(kwargs, &mut kwargsrepr)?;
        let (mut id_buf, mut tag_buf) = (Uuid::encode_buffer(), Uuid::encode_buffer());
        let id = job.uuid.hyphenated().encode_lower(&mut id_buf).as_bytes();
        let tag = tag.hyphenated().encode_lower(&mut tag_buf).as_bytes();

        buf.extend_from_slice(b"{\"body\":\"");
        body(args, kwargs, buf)?;
        buf.extend_from_slice(
            b"\",\"content-encoding\":\"utf-8\",\"content-type\":\"application/json\",\
              \"headers\":{\"lang\":\"py\",\"task\":",
        );
        json_str(&job.job_type, buf)?;
        buf.extend_from_slice(b",\"id\":\"");
        buf.extend_from_slice(id);
        match &opts {
            None => buf.extend_from_slice(b"\",\"shadow\":null,\"eta\":"),
            Some(o) => {
                buf.extend_from_slice(b"\",\"shadow\":");
                o.write_shadow(buf)?;
                buf.extend_from_slice(b",\"eta\":");
            }
        }
        // The relay holds a row until it is due, so its job goes out without an ETA. A job
        // given to the enqueuer directly (or a clock behind the database's) with a run_at
        // still ahead carries it as celery's own client would (`apply_async(eta=...)`).
        match job.run_at.filter(|t| *t > Utc::now()) {
            Some(t) => json_str(&t.to_rfc3339_opts(SecondsFormat::Micros, false), buf)?,
            None => buf.extend_from_slice(b"null"),
        }
        match &opts {
            None => buf.extend_from_slice(
                b",\"expires\":null,\"group\":null,\"group_index\":null,\"retries\":0,\
                  \"timelimit\":[null,null],\"root_id\":\"",
            ),
            Some(o) => {
                buf.extend_from_slice(b",\"expires\":");
                o.write_expires(job, buf)?;
                let _ = write!(
                    buf,
                    ",\"group\":null,\"group_index\":null,\"retries\":{},\"timelimit\":",
                    o.retries
                );
                o.write_timelimit(buf);
                buf.extend_from_slice(b",\"root_id\":\"");
            }
        }
        buf.extend_from_slice(id);
        buf.extend_from_slice(b"\",\"parent_id\":null,\"argsrepr\":");
        json_str(&argsrepr, buf)?;
        buf.extend_from_slice(b",\"kwargsrepr\":");
        json_str(&kwargsrepr, buf)?;
        buf.extend_from_slice(b",\"origin\":");
        json_str(ORIGIN, buf)?;
        match &opts {
            None => buf.extend_from_slice(
                b",\"ignore_result\":false,\"replaced_task_nesting\":0,\"stamped_headers\":null,\
                  \"stamps\":{}",
            ),
            Some(o) => {
                let _ = write!(
                    buf,
                    ",\"ignore_result\":{},\"replaced_task_nesting\":0,\"stamped_headers\":null,\
                     \"stamps\":{{}}",
                    o.ignore_result
                );
            }
        }
        // The row's headers after celery's own (as `apply_async(headers=...)` adds them),
        // except celery's names.
        for (k, v) in &job.headers {
            if !is_reserved_header(k) {
                buf.push(b',');
                json_str(k, buf)?;
                buf.push(b':');
                json_str(v, buf)?;
            }
        }
        buf.extend_from_slice(b"},\"properties\":{\"correlation_id\":\"");
        buf.extend_from_slice(id);
        match &opts {
            None => buf.extend_from_slice(
                b"\",\"reply_to\":\"\",\"delivery_mode\":2,\
                  \"delivery_info\":{\"exchange\":\"\",\"routing_key\":",
            ),
            Some(o) => {
                buf.extend_from_slice(b"\",\"reply_to\":\"\",\"delivery_mode\":2,");
                o.write_expiration(job, Utc::now(), buf)?;
                buf.extend_from_slice(b"\"delivery_info\":{\"exchange\":\"\",\"routing_key\":");
            }
        }
        json_str(&job.queue, buf)?;
        match &opts {
            None => buf.extend_from_slice(
                b"},\"priority\":0,\"body_encoding\":\"base64\",\"delivery_tag\":\"",
            ),
            Some(o) => {
                let _ = write!(
                    buf,
                    "}},\"priority\":{},\"body_encoding\":\"base64\",\"delivery_tag\":\"",
                    o.priority
                );
            }
        }
        buf.extend_from_slice(tag);
        buf.extend_from_slice(b"\"}}");
        Ok(())
    }
}

/// The task body as kombu's JSON serializer writes it (Python's json.dumps separators), the
/// args and kwargs as the row wrote them, base64-encoded into `buf`.
fn body(args: &str, kwargs: &str, buf: &mut Vec<u8>) -> Result<(), Unfit> {
    let mut w = EncoderWriter::new(buf, &base64::engine::general_purpose::STANDARD);
    for part in ["[", args, ", ", kwargs, ", ", EMBED, "]"] {
        w.write_all(part.as_bytes()).map_err(cannot_write)?;
    }
    w.finish().map_err(cannot_write)?;
    Ok(())
}

/// `s` as a JSON string into `buf`.
fn json_str(s: &str, buf: &mut Vec<u8>) -> Result<(), Unfit> {
    // Most text needs no escape: one pass that finds none (no early exit: it vectorizes).
    let plain = !s.bytes().fold(false, |esc, b| {
        esc | (b < 0x20) | (b == b'"') | (b == b'\\')
    });
    if plain {
        buf.push(b'"');
        buf.extend_from_slice(s.as_bytes());
        buf.push(b'"');
        return Ok(());
    }
    serde_json::to_writer(buf, s).map_err(cannot_write)
}

fn cannot_write(e: impl std::fmt::Display) -> Unfit {
    Unfit(format!("cannot write the message: {e}"))
}

/// Whether the JSON array `args` has no elements.
fn is_empty_array(args: &str) -> bool {
    args.strip_prefix('[')
        .and_then(|a| a.strip_suffix(']'))
        .is_some_and(|inner| {
            inner
                .bytes()
                .all(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
        })
}

/// A delivery tag: a random (version 4) uuid, as kombu's `uuid()`, from the thread's random
/// number generator (no system call per message).
fn delivery_tag() -> Uuid {
    uuid::Builder::from_random_bytes(rand::random()).into_uuid()
}

impl Layout for Celery {
    fn kind(&self) -> LayoutKind {
        LayoutKind::Celery
    }

    fn name(&self) -> &'static str {
        "celery"
    }

    fn claim_needs(&self) -> ClaimNeeds {
        ClaimNeeds {
            flows_in_order: false,
            holds_until_due: true,
        }
    }

    fn payload(&self) -> Payload {
        Payload::JsonArgs
    }

    fn refuses_cluster(&self) -> Option<&'static str> {
        // kombu's Redis transport talks to one Redis (or a Sentinel-managed primary).
        Some(
            "celery cannot read a Redis Cluster (kombu's Redis transport has no Cluster \
             support): give the URL of the Redis its workers use",
        )
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
        concat!(include_str!("prelude.lua"), include_str!("celery.lua"))
    }

    fn options(&self) -> &'static [&'static str] {
        &options::OPTIONS
    }

    /// Refuses an unknown option, one of another type, and `soft_time_limit` above
    /// `time_limit` (docs/layouts/celery.md#job-options).
    fn check_options(&self, options: &Options) -> std::result::Result<(), Unfit> {
        Opts::of(options).map(|_| ())
    }

    /// kombu's list of the job's `priority` (`<queue>\x06\x16<step>`), empty for the queue's
    /// own.
    fn list_suffix(&self, job: &Job) -> &'static str {
        let priority = job.options.get("priority").and_then(|p| p.as_u64());
        options::list_suffix(priority.unwrap_or(0))
    }

    /// The envelope, with a fresh random delivery tag (kombu's `uuid()`).
    fn encode(&self, job: &Job, buf: &mut Vec<u8>) -> std::result::Result<(), Unfit> {
        Celery::envelope(job, delivery_tag(), buf)
    }

    /// The script's arguments: two keys, the marker key `<ns>jobrelay:celery:<uuid>` and the
    /// queue's list `<ns><queue>`. The message itself goes by `LPUSH`
    /// ([`Layout::lpushes_messages`]).
    fn push_args(
        &self,
        inv: &mut redis::ScriptInvocation<'_>,
        namespace: &str,
        job: &Job,
        _encoded: &[u8],
        key: &mut String,
    ) {
        push_keys(self, inv, namespace, job, key);
    }

    /// Messages go by a native `LPUSH` in the call's transaction; the script settles markers
    /// and duplicates over the keys alone (celery.lua).
    fn lpushes_messages(&self) -> bool {
        true
    }

    fn args_overhead(&self, namespace: &str, job: &Job, _encoded_len: usize) -> usize {
        2 * namespace.len() + job.queue.len() + ARGS_OVERHEAD
    }

    fn marker_infix(&self) -> &'static str {
        MARKER_INFIX
    }

    /// kombu's list for the queue's priority 0 (every message the relay writes) is the queue's
    /// own name.
    fn queue_infix(&self) -> &'static str {
        ""
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_job;
    use super::*;
    use base64::Engine as _;
    use chrono::DateTime;
    use serde_json::{json, Value};
    use std::collections::BTreeMap;

    const ID: &str = "6f1c2a3b-4d5e-4f60-8a71-92b3c4d5e6f7";
    const TAG: &str = "0b7d5c3e-1f2a-4b6c-9d8e-7f6a5b4c3d2e";

    fn job(payload: &str) -> Job {
        Job {
            headers: BTreeMap::from([
                ("traceparent".to_owned(), "00-ab-cd-01".to_owned()),
                ("task".to_owned(), "not.this.one".to_owned()),
            ]),
            ..test_job("emails", "app.tasks.send_welcome", payload.as_bytes())
        }
    }

    fn envelope(j: &Job) -> (String, Value) {
        let mut buf = Vec::new();
        Celery::envelope(j, TAG.parse().unwrap(), &mut buf).unwrap();
        let text = String::from_utf8(buf).unwrap();
        let v = serde_json::from_str(&text).unwrap();
        (text, v)
    }

    /// What celery 5 with kombu writes for `send_welcome.apply_async(args=[42, "x"],
    /// kwargs={"lang": "de"}, queue="emails", headers={"traceparent": ...})`, field for field
    /// (celery/app/amqp.py as_task_v2, kombu's Producer.publish and Redis Channel._put), with
    /// the relay's origin and delivery tag.
    #[test]
    fn writes_what_celery_writes() {
        let (text, v) = envelope(&job(r#"{"args": [42, "x"], "kwargs": {"lang": "de"}}"#));
        let body = r#"[[42, "x"], {"lang": "de"}, {"callbacks": null, "errbacks": null, "chain": null, "chord": null}]"#;
        // Built in parts (json! recurses per token).
        let mut headers = json!({
            "lang": "py", "task": "app.tasks.send_welcome", "id": ID, "shadow": null,
            "eta": null, "expires": null, "group": null, "group_index": null, "retries": 0
        });
        let more = json!({
            "timelimit": [null, null], "root_id": ID, "parent_id": null,
            "argsrepr": "[42, 'x']", "kwargsrepr": "{'lang': 'de'}", "origin": "jobrelay"
        });
        let rest = json!({
            "ignore_result": false, "replaced_task_nesting": 0, "stamped_headers": null,
            "stamps": {}, "traceparent": "00-ab-cd-01"
        });
        for part in [more, rest] {
            headers
                .as_object_mut()
                .unwrap()
                .extend(part.as_object().unwrap().clone());
        }
        let properties = json!({
            "correlation_id": ID, "reply_to": "", "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": "emails"}, "priority": 0,
            "body_encoding": "base64", "delivery_tag": TAG
        });
        let want = json!({
            "body": base64::engine::general_purpose::STANDARD.encode(body),
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": headers,
            "properties": properties
        });
        assert_eq!(v, want, "{text}");
        // kombu's key order, and celery's headers before the row's.
        let order = [
            "\"body\"",
            "\"content-encoding\"",
            "\"content-type\"",
            "\"headers\"",
            "\"lang\"",
            "\"stamps\"",
            "\"traceparent\"",
            "\"properties\"",
            "\"delivery_tag\"",
        ];
        let at: Vec<usize> = order.iter().map(|k| text.find(k).unwrap()).collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "{text}");
    }

    #[test]
    fn an_array_payload_is_the_args() {
        let (_, v) = envelope(&job(r#"[1, 2.50, {"b": 1, "a": [true, null]}]"#));
        let body = base64::engine::general_purpose::STANDARD
            .decode(v["body"].as_str().unwrap())
            .unwrap();
        // The args exactly as the row wrote them (2.50 stays 2.50), no kwargs.
        assert_eq!(
            String::from_utf8(body).unwrap(),
            r#"[[1, 2.50, {"b": 1, "a": [true, null]}], {}, {"callbacks": null, "errbacks": null, "chain": null, "chord": null}]"#
        );
        assert_eq!(
            v["headers"]["argsrepr"],
            "[1, 2.5, {'b': 1, 'a': [True, None]}]"
        );
        assert_eq!(v["headers"]["kwargsrepr"], "{}");
    }

    #[test]
    fn payloads_that_do_not_fit() {
        for (payload, why) in [
            ("", "not JSON"),
            ("\"x\"", "not \"x\""),
            ("42", "not 42"),
            ("{\"args\": {}}", "\"args\" is not an array"),
            ("{\"kwargs\": []}", "\"kwargs\" is not an object"),
            ("{\"args\": [], \"kwarg\": {}}", "unknown field `kwarg`"),
            ("[1,", "not JSON"),
        ] {
            let mut buf = Vec::new();
            let e = CELERY.encode(&job(payload), &mut buf).unwrap_err();
            assert!(e.0.contains(why), "{payload:?}: {e}");
        }
        let mut buf = Vec::new();
        let mut j = job("[]");
        j.payload = vec![b'[', 0xff, b']'];
        assert!(CELERY.encode(&j, &mut buf).unwrap_err().0.contains("UTF-8"));
        let mut j = job("[]");
        j.parent_uuid = Some(j.uuid);
        assert!(CELERY
            .encode(&j, &mut buf)
            .unwrap_err()
            .0
            .contains("chains"));
        let mut j = job("[]");
        j.predecessor_uuid = Some(j.uuid);
        assert!(CELERY
            .encode(&j, &mut buf)
            .unwrap_err()
            .0
            .contains("chains"));
        // Missing args and kwargs are empty; no args show as celery's `args or ()` does.
        for payload in ["{}", "[]", "[ \n]", "{\"args\": []}"] {
            let (_, v) = envelope(&job(payload));
            assert_eq!(v["headers"]["argsrepr"], "()", "{payload}");
            assert_eq!(v["headers"]["kwargsrepr"], "{}", "{payload}");
        }
    }

    #[test]
    fn eta_only_for_a_run_at_still_ahead() {
        let mut j = job("[]");
        j.run_at = Some(DateTime::from_timestamp(1_700_000_000, 500_000_000).unwrap());
        assert_eq!(envelope(&j).1["headers"]["eta"], Value::Null);
        j.run_at = Some(DateTime::from_timestamp(4_102_444_800, 123_456_000).unwrap());
        assert_eq!(
            envelope(&j).1["headers"]["eta"],
            "2100-01-01T00:00:00.123456+00:00"
        );
    }

    fn with_options(options: Value) -> Job {
        Job {
            options: serde_json::from_value(options).unwrap(),
            ..job("[1]")
        }
    }

    /// What celery's client writes for `apply_async(args=[1], queue="emails", expires=30,
    /// time_limit=5, soft_time_limit=2.5, ignore_result=True, retries=3, shadow="welcome 7",
    /// priority=5)` called at the row's created_at: the headers in their places, `expiration`
    /// after `delivery_mode`, and kombu's list of priority 3.
    #[test]
    fn writes_options_as_celery_writes() {
        let j = with_options(json!({
            "expires": 30, "time_limit": 5, "soft_time_limit": 2.5, "ignore_result": true,
            "retries": 3, "shadow": "welcome 7", "priority": 5
        }));
        CELERY.check_options(&j.options).unwrap();
        let (text, v) = envelope(&j);
        let (_, plain) = envelope(&job("[1]"));
        let h = &v["headers"];
        // created_at is epoch second 1,700,000,000; 30 s later.
        assert_eq!(h["expires"], "2023-11-14T22:13:50+00:00", "{text}");
        assert_eq!(h["timelimit"], json!([5, 2.5]));
        assert_eq!(
            (&h["ignore_result"], &h["retries"], &h["shadow"]),
            (&json!(true), &json!(3), &json!("welcome 7"))
        );
        let p = &v["properties"];
        assert_eq!((&p["priority"], &p["expiration"]), (&json!(5), &json!("0")));
        // Nothing else differs from the message without options.
        let mut v = v.clone();
        for k in ["expires", "timelimit", "ignore_result", "retries", "shadow"] {
            v["headers"][k] = plain["headers"][k].clone();
        }
        v["properties"]["priority"] = json!(0);
        v["properties"]
            .as_object_mut()
            .unwrap()
            .remove("expiration");
        assert_eq!(v, plain);
        let order = [
            "\"shadow\"",
            "\"expires\"",
            "\"retries\"",
            "\"timelimit\"",
            "\"ignore_result\"",
            "\"delivery_mode\"",
            "\"expiration\"",
            "\"delivery_info\"",
            "\"priority\"",
        ];
        let at: Vec<usize> = order.iter().map(|k| text.find(k).unwrap()).collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "{text}");
        // kombu's _q_for_pri: the highest of the steps 0, 3, 6, 9 not above the priority.
        assert_eq!(CELERY.list_suffix(&j), "\x06\x163");
        let mut keys = String::new();
        let at = super::super::job_keys(&CELERY, "app1:", &j, &mut keys);
        assert_eq!(&keys[at..], "app1:emails\x06\x163");
        for (p, suffix) in [
            (0, ""),
            (2, ""),
            (3, "\x06\x163"),
            (8, "\x06\x166"),
            (9, "\x06\x169"),
        ] {
            assert_eq!(
                CELERY.list_suffix(&with_options(json!({"priority": p}))),
                suffix
            );
        }
        assert_eq!(CELERY.list_suffix(&with_options(json!({"retries": 1}))), "");
    }

    /// `expires` as seconds counts from created_at, to the microsecond, written as Python's
    /// isoformat; a string is written as given; `expiration` is what is left at the push.
    #[test]
    fn expires_as_seconds_or_a_date() {
        let mut j = with_options(json!({"expires": 0.25}));
        assert_eq!(
            envelope(&j).1["headers"]["expires"],
            "2023-11-14T22:13:20.250000+00:00"
        );
        // Postgres keeps microseconds.
        j.created_at = DateTime::from_timestamp_micros(Utc::now().timestamp_micros()).unwrap();
        let before = Utc::now();
        j.options = serde_json::from_value(json!({"expires": 3600.5})).unwrap();
        let (_, v) = envelope(&j);
        let ms: i64 = v["properties"]["expiration"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        let elapsed = (Utc::now() - before).num_milliseconds();
        assert!((3_600_500 - elapsed - 1..=3_600_500).contains(&ms), "{ms}");
        let at = chrono::DateTime::parse_from_rfc3339(v["headers"]["expires"].as_str().unwrap())
            .unwrap();
        assert_eq!(
            at,
            j.created_at + chrono::TimeDelta::microseconds(3_600_500_000)
        );
        j.options =
            serde_json::from_value(json!({"expires": "2100-01-01T01:00:00+01:00"})).unwrap();
        let (_, v) = envelope(&j);
        assert_eq!(v["headers"]["expires"], "2100-01-01T01:00:00+01:00");
        let ms: i64 = v["properties"]["expiration"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        let want =
            (DateTime::from_timestamp(4_102_444_800, 0).unwrap() - Utc::now()).num_milliseconds();
        assert!((want - 1000..=want + 1000).contains(&ms), "{ms} {want}");
        j.options = serde_json::from_value(json!({"expires": -10})).unwrap();
        let (_, v) = envelope(&j);
        assert_eq!(
            v["properties"]["expiration"], "0",
            "past: 0, as celery's client"
        );
    }

    /// Options at celery's defaults write the message without options, byte for byte.
    #[test]
    fn options_at_their_defaults_change_nothing() {
        let mut tag = Vec::new();
        Celery::envelope(&job("[1]"), TAG.parse().unwrap(), &mut tag).unwrap();
        let mut with = Vec::new();
        let j = with_options(json!({"priority": 0, "retries": 0, "ignore_result": false}));
        Celery::envelope(&j, TAG.parse().unwrap(), &mut with).unwrap();
        assert_eq!(
            String::from_utf8(with).unwrap(),
            String::from_utf8(tag).unwrap()
        );
    }

    /// Unknown names and values of another type are refused, naming the option and the layout.
    #[test]
    fn refuses_unknown_options_and_wrong_types() {
        let refusal = |options: Value| {
            let options: Options = serde_json::from_value(options).unwrap();
            CELERY.check_options(&options).unwrap_err().0
        };
        let r = refusal(json!({"countdown": 5}));
        assert!(
            r.starts_with("unknown option \"countdown\" for the celery layout; known: expires, "),
            "{r}"
        );
        for (options, name) in [
            (json!({"expires": "tomorrow"}), "expires"),
            (json!({"expires": "2026-01-01T00:00:00"}), "expires"),
            (json!({"expires": true}), "expires"),
            (json!({"time_limit": "5"}), "time_limit"),
            (json!({"time_limit": -1}), "time_limit"),
            (json!({"soft_time_limit": null}), "soft_time_limit"),
            (json!({"ignore_result": 1}), "ignore_result"),
            (json!({"retries": -1}), "retries"),
            (json!({"retries": 1.5}), "retries"),
            (json!({"shadow": ""}), "shadow"),
            (json!({"shadow": 7}), "shadow"),
            (json!({"priority": 10}), "priority"),
            (json!({"priority": "high"}), "priority"),
        ] {
            let r = refusal(options.clone());
            assert!(
                r.starts_with(&format!(
                    "option \"{name}\" for the celery layout; must be "
                )),
                "{options}: {r}"
            );
        }
        let r = refusal(json!({"time_limit": 2, "soft_time_limit": 3}));
        assert!(
            r.starts_with(
                "option \"soft_time_limit\" for the celery layout; must be at most time_limit"
            ),
            "{r}"
        );
        let mut j = with_options(json!({"expires": 1e12}));
        let r = CELERY.encode(&j, &mut Vec::new()).unwrap_err().0;
        assert!(r.contains("years 1..=9999"), "{r}");
        j.options = serde_json::from_value(json!({
            "expires": "2026-01-01T00:00:00Z", "time_limit": 2, "soft_time_limit": 2,
            "retries": 0, "priority": 9, "shadow": "s", "ignore_result": false
        }))
        .unwrap();
        assert!(CELERY.check_options(&j.options).is_ok());
    }

    #[test]
    fn keys() {
        let u: Uuid = ID.parse().unwrap();
        assert_eq!(
            CELERY.marker_key("app1:", u),
            format!("app1:jobrelay:celery:{ID}")
        );
        assert_eq!(CELERY.queue_key("", "emails"), "emails");
        assert_eq!(CELERY.queue_key("app1:", "emails"), "app1:emails");
    }
}
