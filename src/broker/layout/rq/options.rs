//! The job options of the rq layout (docs/layouts/rq.md#job-options): what RQ 2.12's
//! `Queue.enqueue` / `Queue.enqueue_call` / `Job.create` take, by their names, checked as RQ
//! checks them (`Queue.create_job`, `rq.utils.parse_timeout`, `rq.job.Retry`), and the job
//! hash fields `Job.to_dict` writes for them.
//!
//! - `timeout` (or `job_timeout`, `Queue.enqueue`'s name for it): the hash's `timeout`
//!   instead of RQ's default `180`;
//! - `result_ttl`, `failure_ttl`: the fields of those names;
//! - `ttl`: the field, and the job hash's expiry (`Job.cleanup`, as `Queue._persist_job`);
//! - `retry` (`{"max": n, "interval": n | [n, ...], "enqueue_at_front": bool}`, `Retry`'s
//!   arguments): `retries_left`, `retry_intervals` (`json.dumps` of the list; a number `n` is
//!   `[n]`), and `enqueue_at_front_on_retry` `1` when asked for;
//! - `description`: instead of `get_call_string`'s (an empty one is RQ's default too);
//! - `at_front`: the queue's head (`LPUSH`, `Queue.push_job_id`); a scheduled job keeps it as
//!   `enqueue_at_front` `1` for RQ's scheduler (`Queue.enqueue_at`);
//! - `meta`: `json.dumps` of the object, with the row's headers (which are the meta of a job
//!   without options) before its keys.
//!
//! Seconds are RQ's `parse_timeout`: an integer, or a string of one (`"90"`) or of digits and a
//! unit `s`, `m`, `h` or `d` (`"1h"`); a fraction, which RQ cuts off, is refused, and so are
//! values RQ refuses (`timeout` 0, a `ttl` under 1) or that its worker cannot use (beyond
//! 2,147,483,647: `signal.alarm`'s limit). `null` is RQ's `None`: as absent.

use std::fmt::Write as _;

use serde_json::{Map, Value};

use super::super::Unfit;
use super::pyjson;
use crate::job::{Job, Options};

/// The options, by RQ's names.
pub(crate) const OPTIONS: [&str; 9] = [
    "timeout",
    "job_timeout",
    "result_ttl",
    "ttl",
    "failure_ttl",
    "retry",
    "description",
    "at_front",
    "meta",
];

/// The most seconds any option may give: C's `INT_MAX`, the most `signal.alarm` (RQ's job
/// timeout) takes.
const MAX_SECONDS: i64 = i32::MAX as i64;

/// What a seconds option may be, besides its range.
const SECONDS: &str = "as an integer or a string of one, with an optional unit s, m, h or d \
                       (\"90\", \"1h\")";

/// A job's options, checked.
#[derive(Debug, Default, PartialEq)]
pub(super) struct RqOptions<'a> {
    pub(super) timeout: Option<i64>,
    pub(super) result_ttl: Option<i64>,
    pub(super) failure_ttl: Option<i64>,
    pub(super) ttl: Option<i64>,
    pub(super) retry: Option<Retry>,
    /// Not empty (RQ's `description or job.get_call_string()`).
    pub(super) description: Option<&'a str>,
    pub(super) at_front: bool,
    /// Not empty (RQ writes no meta for `{}`).
    pub(super) meta: Option<&'a Map<String, Value>>,
}

/// `rq.job.Retry`'s arguments.
#[derive(Debug, PartialEq)]
pub(super) struct Retry {
    pub(super) max: i64,
    pub(super) intervals: Vec<i64>,
    pub(super) enqueue_at_front: bool,
}

impl RqOptions<'_> {
    /// Whether the job hash is the one of a job without options.
    pub(super) fn is_default(&self) -> bool {
        *self == RqOptions::default()
    }
}

/// Refuses an option of the wrong type or range: `option "x" for the rq layout; must be ...,
/// not <value>`.
fn misfit(name: &str, what: &str, value: &Value) -> Unfit {
    Unfit(format!(
        "option {name:?} for the rq layout; must be {what}, not {value}"
    ))
}

/// RQ's `parse_timeout` of `value`, if `fits` it (`what` says what fits): `Ok(None)` for null.
fn seconds(
    name: &str,
    value: &Value,
    fits: fn(i64) -> bool,
    what: &str,
) -> Result<Option<i64>, Unfit> {
    let parsed = match value {
        Value::Null => return Ok(None),
        Value::Number(n) => n.as_i64(),
        Value::String(s) => parse_timeout(s),
        _ => None,
    };
    match parsed {
        Some(s) if s <= MAX_SECONDS && fits(s) => Ok(Some(s)),
        _ => Err(misfit(name, &format!("{what}, {SECONDS}"), value)),
    }
}

/// `parse_timeout` of a string: `int(s)`, else `int(s[:-1])` times the unit `s[-1]` (`s`, `m`,
/// `h`, `d`, either case). Digits only (Python's `int` also takes blanks around them and `_`
/// between them: refused here); `None` for anything else.
fn parse_timeout(s: &str) -> Option<i64> {
    let int = |t: &str| {
        let digits = t.strip_prefix(['+', '-']).unwrap_or(t);
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        t.parse::<i64>().ok()
    };
    if let Some(n) = int(s) {
        return Some(n);
    }
    let unit = match s.as_bytes().last()?.to_ascii_lowercase() {
        b's' => 1,
        b'm' => 60,
        b'h' => 3600,
        b'd' => 86400,
        _ => return None,
    };
    int(&s[..s.len() - 1])?.checked_mul(unit)
}

/// `Retry(max, interval, enqueue_at_front)` of `{"max": n, "interval": n | [n, ...],
/// "enqueue_at_front": bool}`: `max` at least 1, intervals at least 0.
fn retry(value: &Value) -> Result<Option<Retry>, Unfit> {
    let refused = || {
        misfit(
            "retry",
            "{\"max\": retries (1 or more), \"interval\": seconds (0 or more) or a list of \
             them, \"enqueue_at_front\": true or false} (RQ's Retry)",
            value,
        )
    };
    let count = |v: &Value, min: i64| {
        v.as_i64()
            .filter(|n| (min..=MAX_SECONDS).contains(n))
            .ok_or_else(refused)
    };
    let map = match value {
        Value::Null => return Ok(None),
        Value::Object(map) => map,
        _ => return Err(refused()),
    };
    let mut r = Retry {
        max: count(map.get("max").ok_or_else(refused)?, 1)?,
        intervals: vec![0],
        enqueue_at_front: false,
    };
    for (k, v) in map {
        match (k.as_str(), v) {
            ("max", _) => {}
            ("interval", Value::Array(items)) => {
                r.intervals = items
                    .iter()
                    .map(|i| count(i, 0))
                    .collect::<Result<_, _>>()?;
            }
            ("interval", v) => r.intervals = vec![count(v, 0)?],
            ("enqueue_at_front", Value::Bool(b)) => r.enqueue_at_front = *b,
            _ => return Err(refused()),
        }
    }
    Ok(Some(r))
}

/// The options of a row, checked; the first misfit refused, naming it.
pub(super) fn parse(options: &Options) -> Result<RqOptions<'_>, Unfit> {
    super::super::refuse_unknown_options("rq", &OPTIONS, options)?;
    let mut o = RqOptions::default();
    let given = |name| options.get(name).filter(|v| !v.is_null());
    if let (Some(_), Some(_)) = (given("timeout"), given("job_timeout")) {
        return Err(Unfit(
            "options \"timeout\" and \"job_timeout\" for the rq layout; give one (job_timeout \
             is Queue.enqueue's name for Job.create's timeout)"
                .to_owned(),
        ));
    }
    for (name, value) in options {
        match name.as_str() {
            "timeout" | "job_timeout" => {
                let fits = |s| s == -1 || s >= 1;
                if let Some(s) = seconds(name, value, fits, "-1 (no limit) or 1 or more")? {
                    o.timeout = Some(s);
                }
            }
            "result_ttl" | "failure_ttl" => {
                let what = "-1 (kept for ever), 0 (deleted at once) or more";
                let s = seconds(name, value, |s| s >= -1, what)?;
                if name == "result_ttl" {
                    o.result_ttl = s;
                } else {
                    o.failure_ttl = s;
                }
            }
            "ttl" => o.ttl = seconds(name, value, |s| s >= 1, "1 or more")?,
            "retry" => o.retry = retry(value)?,
            "description" => match value {
                Value::Null => {}
                Value::String(s) => o.description = Some(s.as_str()).filter(|s| !s.is_empty()),
                _ => return Err(misfit(name, "a string", value)),
            },
            "at_front" => match value {
                Value::Null => {}
                Value::Bool(b) => o.at_front = *b,
                _ => return Err(misfit(name, "true or false", value)),
            },
            "meta" => match value {
                Value::Null => {}
                Value::Object(m) => o.meta = Some(m).filter(|m| !m.is_empty()),
                _ => return Err(misfit(name, "an object", value)),
            },
            _ => unreachable!("refuse_unknown_options let {name:?} through"),
        }
    }
    Ok(o)
}

/// The job hash's fields for `o` (not default), after the description in the script's
/// description argument (rq.lua): `\0`, `L` (`at_front`) or `F`, then `\0<field>\0<value>`
/// per field, as `Job.to_dict` writes them (`timeout` replaces the default; `ttl` is also the
/// key's expiry). The meta is the job's headers, then the `meta` option's keys; a key in
/// both is refused. No value holds a `\0`: numbers, and JSON with every control character
/// escaped.
pub(super) fn write_fields(job: &Job, o: &RqOptions<'_>, out: &mut Vec<u8>) -> Result<(), Unfit> {
    let mut s = String::with_capacity(64);
    s.push('\0');
    s.push(if o.at_front { 'L' } else { 'F' });
    let number = |s: &mut String, name: &str, n: Option<i64>| {
        if let Some(n) = n {
            let _ = write!(s, "\0{name}\0{n}");
        }
    };
    number(&mut s, "timeout", o.timeout);
    number(&mut s, "result_ttl", o.result_ttl);
    number(&mut s, "failure_ttl", o.failure_ttl);
    number(&mut s, "ttl", o.ttl);
    if let Some(r) = &o.retry {
        number(&mut s, "retries_left", Some(r.max));
        s.push_str("\0retry_intervals\0[");
        for (i, n) in r.intervals.iter().enumerate() {
            if i > 0 {
                s.push_str(", ");
            }
            let _ = write!(s, "{n}");
        }
        s.push(']');
        if r.enqueue_at_front {
            s.push_str("\0enqueue_at_front_on_retry\x001");
        }
    }
    if o.meta.is_some() || !job.headers.is_empty() {
        s.push_str("\0meta\0{");
        let mut first = true;
        let mut key = |s: &mut String, k: &str| {
            if !first {
                s.push_str(", ");
            }
            first = false;
            pyjson::dumps_str(k, s);
            s.push_str(": ");
        };
        for (k, v) in &job.headers {
            key(&mut s, k);
            pyjson::dumps_str(v, &mut s);
        }
        for (k, v) in o.meta.into_iter().flatten() {
            if job.headers.contains_key(k) {
                return Err(Unfit(format!(
                    "option \"meta\" for the rq layout; its key {k:?} is also a header of the \
                     row (the headers are the job's meta too)"
                )));
            }
            key(&mut s, k);
            pyjson::dumps(v, &mut s);
        }
        s.push('}');
    }
    out.extend_from_slice(s.as_bytes());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn options(v: Value) -> Options {
        serde_json::from_value(v).unwrap()
    }

    fn parsed(v: Value) -> RqOptions<'static> {
        let o = Box::leak(Box::new(options(v)));
        parse(o).unwrap()
    }

    fn refusal(v: Value) -> String {
        parse(&options(v)).unwrap_err().0
    }

    #[test]
    fn seconds_are_what_parse_timeout_makes_of_them() {
        for (given, want) in [
            (json!(30), 30),
            (json!("30"), 30),
            (json!("+30"), 30),
            (json!("-1"), -1),
            (json!("90s"), 90),
            (json!("2m"), 120),
            (json!("1h"), 3600),
            (json!("1H"), 3600),
            (json!("2d"), 172_800),
            (json!(-1), -1),
            (json!(2_147_483_647), 2_147_483_647),
        ] {
            let o = parsed(json!({ "timeout": given.clone() }));
            assert_eq!(o.timeout, Some(want), "{given}");
            let o = parsed(json!({ "job_timeout": given.clone() }));
            assert_eq!(o.timeout, Some(want), "{given}");
        }
        assert_eq!(parsed(json!({"result_ttl": 0})).result_ttl, Some(0));
        assert_eq!(parsed(json!({"failure_ttl": "-1"})).failure_ttl, Some(-1));
        assert_eq!(parsed(json!({"ttl": "1m"})).ttl, Some(60));
    }

    #[test]
    fn retry_is_rqs_retry() {
        let r = |v| parsed(json!({ "retry": v })).retry.unwrap();
        assert_eq!(
            r(json!({"max": 3})),
            Retry {
                max: 3,
                intervals: vec![0],
                enqueue_at_front: false
            }
        );
        assert_eq!(r(json!({"max": 1, "interval": 5})).intervals, [5]);
        assert_eq!(
            r(json!({"max": 2, "interval": [1, 0, 30]})).intervals,
            [1, 0, 30]
        );
        assert!(r(json!({"max": 2, "interval": []})).intervals.is_empty());
        assert!(r(json!({"max": 2, "enqueue_at_front": true})).enqueue_at_front);
    }

    #[test]
    fn null_is_absent_and_so_are_an_empty_description_and_meta() {
        let o = parsed(json!({
            "timeout": null, "job_timeout": null, "result_ttl": null, "ttl": null,
            "failure_ttl": null, "retry": null, "description": null, "at_front": null,
            "meta": null,
        }));
        assert!(o.is_default());
        assert!(parsed(json!({"description": "", "meta": {}, "at_front": false})).is_default());
        assert!(!parsed(json!({"at_front": true})).is_default());
    }

    /// Each misfit is refused, naming the option and the layout.
    #[test]
    fn misfits_are_refused_naming_the_option() {
        for (options, name) in [
            (json!({"timeout": 0}), "timeout"),
            (json!({"timeout": "0h"}), "timeout"),
            (json!({"timeout": -2}), "timeout"),
            (json!({"timeout": 1.5}), "timeout"),
            (json!({"timeout": "1.5"}), "timeout"),
            (json!({"timeout": "1w"}), "timeout"),
            (json!({"timeout": "h"}), "timeout"),
            (json!({"timeout": " 5"}), "timeout"),
            (json!({"timeout": true}), "timeout"),
            (json!({"timeout": 2_147_483_648i64}), "timeout"),
            (json!({"job_timeout": "999999999d"}), "job_timeout"),
            (json!({"result_ttl": -2}), "result_ttl"),
            (json!({"failure_ttl": [1]}), "failure_ttl"),
            (json!({"ttl": 0}), "ttl"),
            (json!({"ttl": "-1"}), "ttl"),
            (json!({"retry": 3}), "retry"),
            (json!({"retry": {}}), "retry"),
            (json!({"retry": {"max": 0}}), "retry"),
            (json!({"retry": {"max": true}}), "retry"),
            (json!({"retry": {"max": 1, "interval": -1}}), "retry"),
            (json!({"retry": {"max": 1, "interval": [1, 0.5]}}), "retry"),
            (json!({"retry": {"max": 1, "intervals": [1]}}), "retry"),
            (json!({"retry": {"max": 1, "enqueue_at_front": 1}}), "retry"),
            (json!({"description": 5}), "description"),
            (json!({"at_front": "yes"}), "at_front"),
            (json!({"meta": ["a"]}), "meta"),
        ] {
            let r = refusal(options.clone());
            assert!(
                r.starts_with(&format!("option \"{name}\" for the rq layout; must be ")),
                "{options}: {r}"
            );
        }
        let r = refusal(json!({"timeout": 5, "job_timeout": 5}));
        assert!(
            r.starts_with("options \"timeout\" and \"job_timeout\""),
            "{r}"
        );
        let r = refusal(json!({"depends_on": "x"}));
        assert!(
            r.starts_with("unknown option \"depends_on\" for the rq layout; known: timeout"),
            "{r}"
        );
    }

    fn fields(j: &Job, v: Value) -> Result<String, Unfit> {
        let o = options(v);
        let mut out = Vec::new();
        write_fields(j, &parse(&o).unwrap(), &mut out)?;
        Ok(String::from_utf8(out).unwrap())
    }

    /// The fields as `Job.to_dict` writes them (RQ 2.12.0 with the JSON serializer, for
    /// `job_timeout='1h', result_ttl=0, failure_ttl=-1, ttl=50, retry=Retry(max=3,
    /// interval=[1, 2], enqueue_at_front=True), at_front=True, meta={'a': [1, 2.5, None,
    /// True], 'b': 'ü', 'n': {'x': 1e16}}`).
    #[test]
    fn fields_are_what_to_dict_writes() {
        let j = super::super::super::test_job("q", "f", b"[]");
        let got = fields(
            &j,
            json!({
                "job_timeout": "1h", "result_ttl": 0, "failure_ttl": -1, "ttl": 50,
                "retry": {"max": 3, "interval": [1, 2], "enqueue_at_front": true},
                "at_front": true, "meta": {"b": "ü", "a": [1, 2.5, null, true], "n": {"x": 1e16}},
            }),
        )
        .unwrap();
        assert_eq!(
            got,
            "\0L\0timeout\x003600\0result_ttl\x000\0failure_ttl\0-1\0ttl\x0050\
             \0retries_left\x003\0retry_intervals\0[1, 2]\0enqueue_at_front_on_retry\x001\
             \0meta\0{\"a\": [1, 2.5, null, true], \"b\": \"\\u00fc\", \"n\": {\"x\": 1e+16}}"
        );
        assert_eq!(
            fields(&j, json!({"retry": {"max": 1, "interval": 5}})).unwrap(),
            "\0F\0retries_left\x001\0retry_intervals\0[5]"
        );
        assert_eq!(
            fields(&j, json!({"retry": {"max": 2}})).unwrap(),
            "\0F\0retries_left\x002\0retry_intervals\0[0]"
        );
    }

    #[test]
    fn headers_come_first_in_the_meta_and_may_not_repeat_in_it() {
        let mut j = super::super::super::test_job("q", "f", b"[]");
        j.headers.insert("traceparent".into(), "00-ab".into());
        assert_eq!(
            fields(&j, json!({"at_front": true})).unwrap(),
            "\0L\0meta\0{\"traceparent\": \"00-ab\"}"
        );
        assert_eq!(
            fields(&j, json!({"meta": {"a": 1}})).unwrap(),
            "\0F\0meta\0{\"traceparent\": \"00-ab\", \"a\": 1}"
        );
        let r = fields(&j, json!({"meta": {"traceparent": "x"}}))
            .unwrap_err()
            .0;
        assert!(
            r.starts_with("option \"meta\" for the rq layout; its key \"traceparent\""),
            "{r}"
        );
    }
}
