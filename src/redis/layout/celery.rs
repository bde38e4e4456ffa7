//! The layout of [Celery](https://docs.celeryq.dev/) 5 on its Redis broker (kombu's Redis
//! transport), task message protocol 2 with the JSON serializer (docs/layouts.md, "celery").
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
//!   wrote them (their JSON text, not re-encoded).
//! - Keys: the queue's list is `<ns><queue>` (priority 0, kombu's `_q_for_pri`: the queue name
//!   itself); `--namespace` is kombu's `global_keyprefix` (empty for a stock worker). The
//!   relay writes no `_kombu.binding.*` set: a worker declares its own queues when it starts,
//!   and a message published to the default (anonymous) exchange, as celery's client does for
//!   a direct queue, is routed by its queue name, never through a binding.
//! - The dedup marker `<ns>jobrelay:celery:<uuid>`, a key kombu and celery never read.
//! - No flows (celery's chains and chords travel in the message body) and no scheduled set:
//!   rows wait in the outbox until their `run_at` is due ([`Layout::holds_until_due`]) and go
//!   out without an ETA.

use std::fmt::Write as _;

use base64::Engine as _;
use chrono::{SecondsFormat, Utc};
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use uuid::Uuid;

use super::{push_keys, Layout, LayoutKind, Unfit};
use crate::job::Job;

/// The layout.
pub(super) static CELERY: Celery = Celery;

/// See the module.
#[derive(Debug)]
pub(super) struct Celery;

/// The marker key's infix: `<ns>jobrelay:celery:<uuid>`.
const MARKER_INFIX: &str = "jobrelay:celery:";

/// What one job adds to a script call besides its message, the namespace (twice) and its queue
/// name: the marker key's infix and uuid (52) and the framing of three bulk strings (5 each plus
/// the digits of their lengths, at most 3, 3 and 10): 83.
const ARGS_OVERHEAD: usize = 96;

/// `origin` of every message (celery's client writes its node name, `gen<pid>@<host>`).
const ORIGIN: &str = "jobrelay";

/// Celery's `argsrepr_maxsize` and `kwargsrepr_maxsize` (celery/app/amqp.py).
const REPR_MAXSIZE: usize = 1024;

/// Celery's `saferepr` default nesting depth: deeper lists and dicts show as `[...]`, `{...}`.
const REPR_MAXLEVELS: usize = 3;

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

/// The envelope, fields in the order kombu writes them.
#[derive(Serialize)]
struct Envelope<'a> {
    body: &'a str,
    #[serde(rename = "content-encoding")]
    content_encoding: &'static str,
    #[serde(rename = "content-type")]
    content_type: &'static str,
    headers: Headers<'a>,
    properties: Properties<'a>,
}

/// `as_task_v2`'s headers, then the row's (as `apply_async(headers=...)` adds them).
#[derive(Serialize)]
struct Headers<'a> {
    lang: &'static str,
    task: &'a str,
    id: &'a str,
    shadow: Option<&'a str>,
    eta: Option<String>,
    expires: Option<&'a str>,
    group: Option<&'a str>,
    group_index: Option<u32>,
    retries: u32,
    timelimit: [Option<f64>; 2],
    root_id: &'a str,
    parent_id: Option<&'a str>,
    argsrepr: String,
    kwargsrepr: String,
    origin: &'static str,
    ignore_result: bool,
    replaced_task_nesting: u32,
    stamped_headers: Option<&'a str>,
    stamps: Empty,
    #[serde(flatten)]
    row: RowHeaders<'a>,
}

/// `{}`.
struct Empty;

impl Serialize for Empty {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        s.serialize_map(Some(0))?.end()
    }
}

/// The row's headers except celery's own names.
struct RowHeaders<'a>(&'a Job);

impl Serialize for RowHeaders<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(None)?;
        for (k, v) in &self.0.headers {
            if !is_reserved_header(k) {
                m.serialize_entry(k, v)?;
            }
        }
        m.end()
    }
}

#[derive(Serialize)]
struct Properties<'a> {
    correlation_id: &'a str,
    reply_to: &'static str,
    delivery_mode: u8,
    delivery_info: DeliveryInfo<'a>,
    priority: u8,
    body_encoding: &'static str,
    delivery_tag: &'a str,
}

#[derive(Serialize)]
struct DeliveryInfo<'a> {
    exchange: &'static str,
    routing_key: &'a str,
}

/// The object form of a payload.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ArgsKwargs<'a> {
    #[serde(borrow, default)]
    args: Option<&'a RawValue>,
    #[serde(borrow, default)]
    kwargs: Option<&'a RawValue>,
}

/// `args` and `kwargs` of a payload, as JSON text, or why it has none.
fn split_payload(payload: &[u8]) -> Result<(&str, &str), Unfit> {
    const SHAPE: &str = "the payload must be a JSON array of args or an object \
                         {\"args\": [...], \"kwargs\": {...}}";
    let text = std::str::from_utf8(payload)
        .map_err(|e| Unfit(format!("{SHAPE}; it is not UTF-8: {e}")))?;
    let raw: &RawValue =
        serde_json::from_str(text).map_err(|e| Unfit(format!("{SHAPE}; it is not JSON: {e}")))?;
    let raw = raw
        .get()
        .trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\r'));
    match raw.as_bytes().first() {
        Some(b'[') => Ok((raw, "{}")),
        Some(b'{') => {
            let o: ArgsKwargs<'_> =
                serde_json::from_str(raw).map_err(|e| Unfit(format!("{SHAPE}: {e}")))?;
            let args = o.args.map_or("[]", RawValue::get);
            let kwargs = o.kwargs.map_or("{}", RawValue::get);
            if !args.starts_with('[') {
                return Err(Unfit(format!("{SHAPE}; \"args\" is not an array")));
            }
            if !kwargs.starts_with('{') {
                return Err(Unfit(format!("{SHAPE}; \"kwargs\" is not an object")));
            }
            Ok((args, kwargs))
        }
        _ => Err(Unfit(format!(
            "{SHAPE}, not {}",
            if raw.len() > 40 {
                format!("{}...", raw.chars().take(40).collect::<String>())
            } else {
                raw.to_owned()
            }
        ))),
    }
}

/// The task body's third element (celery's `embed`): no callbacks, errbacks, chain or chord.
const EMBED: &str = r#"{"callbacks": null, "errbacks": null, "chain": null, "chord": null}"#;

impl Celery {
    /// The envelope of `job` with the delivery tag `tag`, into `buf`.
    fn envelope(job: &Job, tag: Uuid, buf: &mut Vec<u8>) -> Result<(), Unfit> {
        if job.parent_uuid.is_some() || job.predecessor_uuid.is_some() {
            return Err(Unfit(
                "celery has no parent or predecessor jobs (its chains and chords travel in the \
                 message body): leave parent_uuid and predecessor_uuid empty"
                    .to_owned(),
            ));
        }
        let (args, kwargs) = split_payload(&job.payload)?;
        // The body as kombu's JSON serializer writes it (Python's json.dumps separators).
        let body = format!("[{args}, {kwargs}, {EMBED}]");
        let body = base64::engine::general_purpose::STANDARD.encode(body);
        let (argsrepr, kwargsrepr) = (repr(args)?, repr(kwargs)?);
        let (mut id_buf, mut tag_buf) = (Uuid::encode_buffer(), Uuid::encode_buffer());
        let id = job.uuid.hyphenated().encode_lower(&mut id_buf);
        let tag = tag.hyphenated().encode_lower(&mut tag_buf);
        // The relay holds a row until it is due, so its job goes out without an ETA. A job
        // given to the enqueuer directly (or a clock behind the database's) with a run_at
        // still ahead carries it as celery's own client would (`apply_async(eta=...)`).
        let eta = job
            .run_at
            .filter(|t| *t > Utc::now())
            .map(|t| t.to_rfc3339_opts(SecondsFormat::Micros, false));
        let envelope = Envelope {
            body: &body,
            content_encoding: "utf-8",
            content_type: "application/json",
            headers: Headers {
                lang: "py",
                task: &job.job_type,
                id,
                shadow: None,
                eta,
                expires: None,
                group: None,
                group_index: None,
                retries: 0,
                timelimit: [None, None],
                root_id: id,
                parent_id: None,
                argsrepr,
                kwargsrepr,
                origin: ORIGIN,
                ignore_result: false,
                replaced_task_nesting: 0,
                stamped_headers: None,
                stamps: Empty,
                row: RowHeaders(job),
            },
            properties: Properties {
                correlation_id: id,
                reply_to: "",
                delivery_mode: 2,
                delivery_info: DeliveryInfo {
                    exchange: "",
                    routing_key: &job.queue,
                },
                priority: 0,
                body_encoding: "base64",
                delivery_tag: tag,
            },
        };
        serde_json::to_writer(&mut *buf, &envelope)
            .map_err(|e| Unfit(format!("cannot write the message: {e}")))
    }
}

impl Layout for Celery {
    fn kind(&self) -> LayoutKind {
        LayoutKind::Celery
    }

    fn script(&self) -> &'static str {
        concat!(include_str!("prelude.lua"), include_str!("celery.lua"))
    }

    /// The envelope, with a fresh random delivery tag (kombu's `uuid()`).
    fn encode(&self, job: &Job, buf: &mut Vec<u8>) -> std::result::Result<(), Unfit> {
        Celery::envelope(job, Uuid::new_v4(), buf)
    }

    /// Two keys, the marker key `<ns>jobrelay:celery:<uuid>` and the queue's list `<ns><queue>`,
    /// and one argument: the message.
    fn push_args(
        &self,
        inv: &mut redis::ScriptInvocation<'_>,
        namespace: &str,
        job: &Job,
        encoded: &[u8],
        key: &mut String,
    ) {
        push_keys(self, inv, namespace, job, key);
        inv.arg(encoded);
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

    fn orders_flows(&self) -> bool {
        false
    }

    fn holds_until_due(&self) -> bool {
        true
    }
}

// === argsrepr and kwargsrepr: celery's `saferepr(args, 1024)` of the values the worker decodes

/// A JSON value with its object members in document order (as Python's `json.loads` keeps them).
enum Py {
    None,
    Bool(bool),
    Int(String),
    Float(f64),
    Str(String),
    List(Vec<Py>),
    Dict(Vec<(String, Py)>),
}

impl<'de> Deserialize<'de> for Py {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Py, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Py;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Py, E> {
                Ok(Py::None)
            }
            fn visit_bool<E: de::Error>(self, b: bool) -> Result<Py, E> {
                Ok(Py::Bool(b))
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Py, E> {
                Ok(Py::Int(n.to_string()))
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Py, E> {
                Ok(Py::Int(n.to_string()))
            }
            fn visit_f64<E: de::Error>(self, n: f64) -> Result<Py, E> {
                Ok(Py::Float(n))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Py, E> {
                Ok(Py::Str(s.to_owned()))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Py, E> {
                Ok(Py::Str(s))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Py, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = a.next_element()? {
                    v.push(x);
                }
                Ok(Py::List(v))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Py, A::Error> {
                let mut v: Vec<(String, Py)> = Vec::new();
                while let Some((k, x)) = a.next_entry::<String, Py>()? {
                    // Python's dict keeps the first position and the last value of a key.
                    match v.iter_mut().find(|(old, _)| *old == k) {
                        Some(slot) => slot.1 = x,
                        None => v.push((k, x)),
                    }
                }
                Ok(Py::Dict(v))
            }
        }
        d.deserialize_any(V)
    }
}

/// One token of celery's streaming repr.
enum Tok {
    /// `[` or `{`: never truncated; a container's opening.
    Open(&'static str),
    /// `]` or `}`: never truncated; closes the last container opened.
    Close(&'static str),
    /// `, ` or `: `.
    Sep(&'static str),
    /// A string (a value or a key): quoted, `'` escaped.
    Quoted(String),
    /// A number, `True`, `False`, `None`, or a container too deep (`[...]`).
    Plain(String),
}

fn tokens(v: &Py, level: usize, out: &mut Vec<Tok>) {
    match v {
        Py::None => out.push(Tok::Plain("None".into())),
        Py::Bool(b) => out.push(Tok::Plain(if *b { "True" } else { "False" }.into())),
        Py::Int(s) => out.push(Tok::Plain(s.clone())),
        Py::Float(f) => out.push(Tok::Plain(py_float(*f))),
        Py::Str(s) => out.push(Tok::Quoted(s.clone())),
        Py::List(items) => {
            if level >= REPR_MAXLEVELS {
                out.push(Tok::Plain("[...]".into()));
                return;
            }
            out.push(Tok::Open("["));
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    out.push(Tok::Sep(", "));
                }
                tokens(x, level + 1, out);
            }
            out.push(Tok::Close("]"));
        }
        Py::Dict(items) => {
            if level >= REPR_MAXLEVELS {
                out.push(Tok::Plain("{...}".into()));
                return;
            }
            out.push(Tok::Open("{"));
            for (i, (k, x)) in items.iter().enumerate() {
                if i > 0 {
                    out.push(Tok::Sep(", "));
                }
                out.push(Tok::Quoted(k.clone()));
                out.push(Tok::Sep(": "));
                tokens(x, level + 1, out);
            }
            out.push(Tok::Close("}"));
        }
    }
}

/// celery.utils.text.truncate: `s` cut to `maxlen` characters at its last space, then `...`,
/// when it has at least `maxlen` characters.
fn truncate(s: &str, maxlen: usize) -> String {
    if maxlen > 0 && s.chars().count() >= maxlen {
        let cut: String = s.chars().take(maxlen).collect();
        let head = cut.rsplit_once(' ').map_or(cut.as_str(), |(h, _)| h);
        format!("{head}...")
    } else {
        s.to_owned()
    }
}

/// celery.utils.saferepr.saferepr(value, maxlen=1024) of the JSON text `json` (valid JSON: the
/// payload was parsed before).
fn repr(json: &str) -> Result<String, Unfit> {
    let v: Py = serde_json::from_str(json)
        .map_err(|e| Unfit(format!("the payload's args or kwargs: {e}")))?;
    let mut toks = Vec::new();
    tokens(&v, 0, &mut toks);
    let mut out = String::new();
    let mut budget = REPR_MAXSIZE as i64;
    for (i, tok) in toks.iter().enumerate() {
        if budget <= 0 {
            // Over the limit: `, ...`, then the closings of the containers still open.
            out.push_str(", ...");
            let mut depth = 0usize;
            for rest in &toks[i + 1..] {
                match rest {
                    Tok::Open(_) => depth += 1,
                    Tok::Close(c) if depth == 0 => out.push_str(c),
                    Tok::Close(_) => depth -= 1,
                    _ => {}
                }
            }
            break;
        }
        let val = match tok {
            Tok::Open(s) | Tok::Close(s) | Tok::Sep(s) => (*s).to_owned(),
            Tok::Quoted(s) => format!("'{}'", truncate(s, budget as usize).replace('\'', "\\'")),
            Tok::Plain(s) => truncate(s, budget as usize),
        };
        budget -= val.chars().count() as i64;
        out.push_str(&val);
    }
    Ok(out)
}

/// Python's `str(float)`: the shortest digits that read back the same, in positional notation
/// for exponents -4..16 (with at least one decimal), else as `1.5e+16`, `1e-05`.
fn py_float(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.into();
    }
    let sci = format!("{f:e}"); // shortest round-trip digits: "-1.2345e-7"
    let (mantissa, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("an integer exponent");
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let mut s = String::from(sign);
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        if point <= 0 {
            s.push_str("0.");
            s.push_str(&"0".repeat((-point) as usize));
            s.push_str(&digits);
        } else if point as usize >= digits.len() {
            s.push_str(&digits);
            s.push_str(&"0".repeat(point as usize - digits.len()));
            s.push_str(".0");
        } else {
            s.push_str(&digits[..point as usize]);
            s.push('.');
            s.push_str(&digits[point as usize..]);
        }
    } else {
        s.push_str(&digits[..1]);
        if digits.len() > 1 {
            s.push('.');
            s.push_str(&digits[1..]);
        }
        let _ = write!(s, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::DateTime;
    use serde_json::{json, Value};
    use std::collections::BTreeMap;

    const ID: &str = "6f1c2a3b-4d5e-4f60-8a71-92b3c4d5e6f7";
    const TAG: &str = "0b7d5c3e-1f2a-4b6c-9d8e-7f6a5b4c3d2e";

    fn job(payload: &str) -> Job {
        Job {
            uuid: ID.parse().unwrap(),
            queue: "emails".into(),
            job_type: "app.tasks.send_welcome".into(),
            payload: payload.as_bytes().to_vec(),
            parent_uuid: None,
            predecessor_uuid: None,
            dead_parent: false,
            run_at: None,
            created_at: DateTime::from_timestamp(1_700_000_000, 0).unwrap(),
            headers: BTreeMap::from([
                ("traceparent".to_owned(), "00-ab-cd-01".to_owned()),
                ("task".to_owned(), "not.this.one".to_owned()),
            ]),
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
        // Missing args and kwargs are empty.
        let (_, v) = envelope(&job("{}"));
        assert_eq!(v["headers"]["argsrepr"], "[]");
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

    /// Celery's saferepr of what the worker decodes (checked against celery 5's
    /// `saferepr(json.loads(...), 1024)`).
    #[test]
    fn reprs_as_celery_does() {
        let cases = [
            (r#"[]"#, "[]"),
            // (One known difference: serde_json reads `-0` as the float -0.0, Python as the
            // integer 0; the argsrepr shows `-0.0`. Display only: the body keeps `-0`.)
            (
                r#"[1, -17, 1.0, 1e5, 1.5E-7, 1e16, 123.456, 0.0001, -0.0]"#,
                "[1, -17, 1.0, 100000.0, 1.5e-07, 1e+16, 123.456, 0.0001, -0.0]",
            ),
            (
                r#"["it's", "a\"b", "\u00e9\n"]"#,
                "['it\\'s', 'a\"b', '\u{e9}\n']",
            ),
            (
                r#"[[[[1]]], {"a": {"b": {"c": 1}}}]"#,
                "[[[[...]]], {'a': {'b': {...}}}]",
            ),
            (r#"{"z": 1, "a": 2, "z": 3}"#, "{'z': 3, 'a': 2}"),
            (r#"[true, false, null]"#, "[True, False, None]"),
        ];
        for (json, want) in cases {
            assert_eq!(repr(json).unwrap(), want, "{json}");
        }
        // Over 1,024 characters: cut, then `, ...` and the closings still open.
        let long = format!("[\"{}\", [1, 2]]", "word ".repeat(300));
        let got = repr(&long).unwrap();
        assert_eq!(got, format!("['{}...', ...]", vec!["word"; 204].join(" ")));
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
