//! The layout of [RQ](https://python-rq.org) 2.x, the Python job runner (docs/layouts/rq.md):
//! what RQ's own client writes for `Queue.enqueue` / `Queue.enqueue_at` with the JSON
//! serializer, so that an unmodified `rq worker --serializer rq.serializers.JSONSerializer`
//! runs the jobs and `rq info`, `Queue.count` and the registries show them as their own.
//!
//! - The job is RQ's hash `rq:job:<uuid>` with the fields of `Job.to_dict` (rq/job.py) as
//!   `Queue._enqueue_async_job` / `schedule_job` (rq/queue.py) leave them for a job enqueued with
//!   the queue's defaults: `created_at` (the row's), `data`, the empty callback names and
//!   run-time fields, `origin` (the queue), `description` (`get_call_string`), `enqueued_at`
//!   (queued jobs only: Redis's clock at the call, formatted by the script), `timeout` (`180`,
//!   RQ's `DEFAULT_JOB_TIMEOUT`), `status` (`queued` or `scheduled`), and `meta` (the row's
//!   headers as a JSON object, if any).
//! - Job options (the row's `options`, [`options::OPTIONS`]): `timeout` (or `job_timeout`),
//!   `result_ttl`, `ttl`, `failure_ttl`, `retry`, `description`, `at_front`, `meta`, by RQ's
//!   names, checked as RQ checks them and written as `Job.to_dict` writes them (rq/options.rs);
//!   an `at_front` job goes to the queue's head, a `ttl` is also the job hash's expiry.
//! - `data` is the JSON serializer's encoding of `(func_name, instance, args, kwargs)`:
//!   `["<job_type>", null, <args>, <kwargs>]`, the args and kwargs as the row wrote them, in a
//!   zlib stream (`Job.to_dict` compresses with `zlib.compress`; the relay writes the stream's
//!   stored form, which `zlib.decompress` reads alike, without spending CPU on deflate).
//! - The queue's list `rq:queue:<q>` gets the job's id (`RPUSH`, as `Queue.push_job_id`;
//!   `LPUSH` with `at_front`), the set `rq:queues` the queue's key; a job whose `run_at` is
//!   ahead goes, by id, into the scheduled registry `rq:scheduled:<q>` (score: `run_at` in epoch
//!   seconds rounded up, so that RQ's scheduler, which compares whole seconds, never runs it
//!   early).
//! - RQ's keys have no configurable prefix: `--namespace` is a raw prefix, empty for a stock RQ.
//! - The dedup marker: the uuid, a member of a set
//!   `<ns>jobrelay:rq:marks:<ttl>:<interval>:<digit>` ([`Layout::marks_in_sets`]); a job hash of
//!   the same id (RQ's own job, or one the relay wrote and RQ keeps for its `result_ttl`) makes
//!   the job a duplicate too.
//! - No flows: RQ's `depends_on` takes a dependency that does not exist (yet) for met, so a row
//!   naming a predecessor not yet relayed would run first; rows naming a parent or a predecessor
//!   are [`Unfit`], and so is a payload that is neither a JSON array nor `{"args", "kwargs"}`.

#[cfg(feature = "daemon")]
mod consumers;
mod options;
#[cfg(feature = "daemon")]
mod peek;
mod pyjson;
mod pyrepr;

use std::io::Write as _;

use chrono::{DateTime, Utc};

use self::pyrepr::Py;
use super::args_kwargs::split_payload;
use super::{push_queue_key, refuse_flows, Layout, LayoutKind, Payload, Unfit};
use crate::job::{epoch_score, Job, Options};

/// The layout.
pub(super) static RQ: Rq = Rq;

/// See the module.
#[derive(Debug)]
pub(super) struct Rq;

/// The marker sets' infix: `<ns>jobrelay:rq:marks:<ttl>:<interval>:<digit>`.
const MARKER_INFIX: &str = "jobrelay:rq:";

/// RQ's queue key prefix (`Queue.redis_queue_namespace_prefix`).
const QUEUE_INFIX: &str = "rq:queue:";

/// `get_call_string`'s `max_length` for each argument's repr (`Job.get_call_string`).
const DESCRIPTION_ARG_CHARS: usize = 75;

/// What one job adds to a script call besides its encoding, the namespace (twice) and its queue
/// name: the uuid (36), `rq:queue:` (9), the run_at before created_at
/// (at most 24), the meta's frame (at most 12), the framing of five bulk strings (5 each plus
/// the digits of their lengths, at most 10 each).
const ARGS_OVERHEAD: usize = 200;

/// What an rq payload must be (the start of each reason it is not).
const SHAPE: &str = "the rq layout needs the payload to be a JSON array of args or an object \
                     {\"args\": [...], \"kwargs\": {...}}";

/// RQ's `utcformat`: `%Y-%m-%dT%H:%M:%S.%fZ`. Written digit by digit: chrono's `format` parses
/// its pattern on every call, half a microsecond a job.
fn utcformat(t: DateTime<Utc>, buf: &mut Vec<u8>) {
    use chrono::{Datelike as _, Timelike as _};
    let (year, nanos) = (t.year(), t.nanosecond());
    if !(0..=9999).contains(&year) || nanos >= 1_000_000_000 {
        // Beyond Python's datetime (or a leap second): as chrono writes it.
        let _ = write!(buf, "{}", t.format("%Y-%m-%dT%H:%M:%S%.6fZ"));
        return;
    }
    let mut digits = |value: u32, width: usize, after: u8| {
        let mut v = value;
        let at = buf.len();
        buf.resize(at + width, b'0');
        for d in buf[at..].iter_mut().rev() {
            *d = b'0' + (v % 10) as u8;
            v /= 10;
        }
        buf.push(after);
    };
    digits(year as u32, 4, b'-');
    digits(t.month(), 2, b'-');
    digits(t.day(), 2, b'T');
    digits(t.hour(), 2, b':');
    digits(t.minute(), 2, b':');
    digits(t.second(), 2, b'.');
    digits(nanos / 1000, 6, b'Z');
}

/// `s` as a JSON string.
fn json_str(s: &str, buf: &mut Vec<u8>) {
    serde_json::to_writer(&mut *buf, s).expect("a string serialises");
}

/// RQ's `get_call_string(func_name, args, kwargs, max_length=75)`: `func(repr(a), ...,
/// k=repr(v), ...)`, each repr cut to 75 characters and `...`, the keyword arguments sorted.
fn description(func: &str, args: &str, kwargs: &str, out: &mut String) -> Result<(), Unfit> {
    let bad = |e: serde_json::Error| Unfit(format!("cannot read the args and kwargs: {e}"));
    let args: Vec<Py> = serde_json::from_str(args).map_err(bad)?;
    let kwargs: Vec<(String, Py)> = match serde_json::from_str(kwargs).map_err(bad)? {
        Py::Dict(d) => d,
        _ => Vec::new(),
    };
    out.push_str(func);
    out.push('(');
    let mut one = String::new();
    let mut cut = |v: &Py, out: &mut String| {
        one.clear();
        // Past 4 bytes a character, the repr is surely longer than the cut.
        v.repr(&mut one, 4 * DESCRIPTION_ARG_CHARS + 4);
        match one.char_indices().nth(DESCRIPTION_ARG_CHARS) {
            Some((at, _)) => {
                out.push_str(&one[..at]);
                out.push_str("...");
            }
            None => out.push_str(&one),
        }
    };
    for (i, a) in args.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        cut(a, out);
    }
    // (A repeated key was merged by the parser, as Python's dict does.)
    let mut named: Vec<String> = Vec::with_capacity(kwargs.len());
    for (k, v) in &kwargs {
        let mut s = String::with_capacity(k.len() + 8);
        s.push_str(k);
        s.push('=');
        cut(v, &mut s);
        named.push(s);
    }
    named.sort_unstable();
    for (i, s) in named.iter().enumerate() {
        if i > 0 || !args.is_empty() {
            out.push_str(", ");
        }
        out.push_str(s);
    }
    out.push(')');
    Ok(())
}

/// A zlib stream (RFC 1950) of `data` in stored (uncompressed) deflate blocks, into `buf`.
fn zlib_stored(data: &[u8], buf: &mut Vec<u8>) {
    // CMF 0x78 (deflate, 32K window), FLG 0x01 (no dictionary, fastest; 0x7801 % 31 == 0).
    buf.extend_from_slice(&[0x78, 0x01]);
    let mut chunks = data.chunks(0xffff).peekable();
    if chunks.peek().is_none() {
        buf.extend_from_slice(&[0x01, 0x00, 0x00, 0xff, 0xff]);
    }
    while let Some(c) = chunks.next() {
        let last = chunks.peek().is_none();
        let len = c.len() as u16;
        buf.push(u8::from(last));
        buf.extend_from_slice(&len.to_le_bytes());
        buf.extend_from_slice(&(!len).to_le_bytes());
        buf.extend_from_slice(c);
    }
    buf.extend_from_slice(&adler32(data).to_be_bytes());
}

fn adler32(data: &[u8]) -> u32 {
    const MOD: u32 = 65521;
    let (mut a, mut b) = (1u32, 0u32);
    // 5552: the most bytes before b can overflow a u32 (zlib's NMAX).
    for chunk in data.chunks(5552) {
        for &x in chunk {
            a += u32::from(x);
            b += a;
        }
        a %= MOD;
        b %= MOD;
    }
    (b << 16) | a
}

/// The encoding's fields, in order: each a 4-byte big-endian length, then the bytes. The script
/// gets them as separate arguments ([`Layout::push_args`]).
const FIELDS: usize = 3;

/// One field of an encoding, written by `write`, whose answer it passes on.
fn field<R>(buf: &mut Vec<u8>, write: impl FnOnce(&mut Vec<u8>) -> R) -> R {
    let at = buf.len();
    buf.extend_from_slice(&[0; 4]);
    let answer = write(buf);
    let len = (buf.len() - at - 4) as u32;
    buf[at..at + 4].copy_from_slice(&len.to_be_bytes());
    answer
}

/// The fields of an encoding.
fn fields(encoded: &[u8]) -> [&[u8]; FIELDS] {
    let mut out = [&encoded[..0]; FIELDS];
    let mut rest = encoded;
    for f in &mut out {
        if rest.len() < 4 {
            break;
        }
        let len = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let end = (4 + len).min(rest.len());
        *f = &rest[4..end];
        rest = &rest[end..];
    }
    out
}

impl Rq {
    /// `created_at` (after `@<run_at>|` for a job with a `run_at`: the script's route), `data`,
    /// and `description`, framed when the job has headers or options (`\0<n>:<n bytes of
    /// description>`, then the meta, or the options' fields ([`options::write_fields`]): the
    /// script's form, no argument of its own for what most jobs lack). `enqueued_at` is the
    /// script's, from Redis's clock.
    fn encode_fields(job: &Job, buf: &mut Vec<u8>) -> Result<(), Unfit> {
        refuse_flows(
            job,
            "the rq layout has no flows (RQ's depends_on takes a job that does not exist yet \
                 for finished, and RQ has no parent jobs)",
        )?;
        let options = if job.options.is_empty() {
            None
        } else {
            Some(options::parse(&job.options)?).filter(|o| !o.is_default())
        };
        let (args, kwargs) = split_payload(&job.payload, SHAPE)?;
        let given = options.as_ref().and_then(|o| o.description);
        let mut desc = String::new();
        if given.is_none() {
            desc.reserve(job.job_type.len() + args.len() + kwargs.len() + 8);
            description(&job.job_type, args, kwargs, &mut desc)?;
        }
        let desc = given.unwrap_or(&desc);
        field(buf, |b| {
            if let Some(at) = job.run_at {
                let _ = write!(b, "@{}|", epoch_score(at));
            }
            utcformat(job.created_at, b)
        });
        let mut data = Vec::with_capacity(job.job_type.len() + args.len() + kwargs.len() + 16);
        data.push(b'[');
        json_str(&job.job_type, &mut data);
        data.extend_from_slice(b", null, ");
        data.extend_from_slice(args.as_bytes());
        data.extend_from_slice(b", ");
        data.extend_from_slice(kwargs.as_bytes());
        data.push(b']');
        field(buf, |b| zlib_stored(&data, b));
        field(buf, |b| {
            if let Some(o) = &options {
                let _ = write!(b, "\0{}:", desc.len());
                b.extend_from_slice(desc.as_bytes());
                return options::write_fields(job, o, b);
            }
            if job.headers.is_empty() {
                b.extend_from_slice(desc.as_bytes());
                return Ok(());
            }
            let _ = write!(b, "\0{}:", desc.len());
            b.extend_from_slice(desc.as_bytes());
            // json.dumps of a dict of strings.
            b.push(b'{');
            for (i, (k, v)) in job.headers.iter().enumerate() {
                if i > 0 {
                    b.extend_from_slice(b", ");
                }
                json_str(k, b);
                b.extend_from_slice(b": ");
                json_str(v, b);
            }
            b.push(b'}');
            Ok(())
        })
    }
}

impl Layout for Rq {
    fn kind(&self) -> LayoutKind {
        LayoutKind::Rq
    }

    fn name(&self) -> &'static str {
        "rq"
    }

    fn payload(&self) -> Payload {
        Payload::JsonArgs
    }

    fn refuses_cluster(&self) -> Option<&'static str> {
        // RQ has no Cluster support (rq/rq#1048, open): its transactions and scripts name a
        // job's hash, queue and registries, which share no hash tag.
        Some(
            "rq cannot read a Redis Cluster (RQ has no Cluster support): give the URL of the \
             Redis its workers use",
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
        concat!(
            include_str!("prelude.lua"),
            include_str!("rq_utcformat.lua"),
            include_str!("rq.lua")
        )
    }

    fn options(&self) -> &'static [&'static str] {
        &options::OPTIONS
    }

    fn check_options(&self, options: &Options) -> std::result::Result<(), Unfit> {
        options::parse(options).map(|_| ())
    }

    fn encode(&self, job: &Job, buf: &mut Vec<u8>) -> std::result::Result<(), Unfit> {
        Rq::encode_fields(job, buf)
    }

    /// One key, the queue key, and as arguments the uuid and the encoding's three fields:
    /// `created_at` (after `@<run_at>|` for a job with a `run_at`, in epoch
    /// seconds), `data`, `description`.
    fn push_args(
        &self,
        inv: &mut redis::ScriptInvocation<'_>,
        namespace: &str,
        job: &Job,
        encoded: &[u8],
        key: &mut String,
    ) {
        push_queue_key(self, inv, namespace, job, key);
        for f in fields(encoded) {
            inv.arg(f);
        }
    }

    fn args_overhead(&self, namespace: &str, job: &Job, _encoded_len: usize) -> usize {
        2 * namespace.len() + job.queue.len() + ARGS_OVERHEAD
    }

    fn marker_infix(&self) -> &'static str {
        MARKER_INFIX
    }

    fn queue_infix(&self) -> &'static str {
        QUEUE_INFIX
    }

    fn marks_in_sets(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests;
