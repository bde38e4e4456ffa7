//! The celery layout's job options (docs/layouts/celery.md#job-options): the options of
//! celery's `apply_async` that travel in the task message, by celery's names and types, checked
//! here and written where celery's client writes them (celery/app/amqp.py `as_task_v2`,
//! celery/app/base.py `send_task`, kombu/messaging.py `Producer.publish`,
//! kombu/transport/redis.py `Channel._put`):
//!
//! - `expires`: seconds (a number, counted from the row's `created_at`, the moment of the
//!   producer's call) or an ISO 8601 date and time with its UTC offset; the header `expires` (the
//!   instant in ISO 8601, a string given as it is) and the property `expiration` (the
//!   milliseconds left at the push, at least 0, as a string);
//! - `time_limit`, `soft_time_limit`: seconds, the header `timelimit` `[hard, soft]`;
//! - `ignore_result`, `retries`, `shadow`: the headers of those names;
//! - `priority` 0..=9: the property `priority`, and the message goes to kombu's list of that
//!   priority (`<queue>\x06\x16<step>`, the steps 0, 3, 6 and 9 of kombu's default
//!   `priority_steps`; 0, 1 and 2 to the queue's own list), which a stock worker reads before the
//!   next step's (0 first).

use std::io::Write as _;

use chrono::{DateTime, Datelike as _, FixedOffset, TimeDelta, Timelike as _, Utc};
use serde_json::{Number, Value};

use super::super::{refuse_unknown_options, Unfit};
use crate::job::{Job, Options};

/// The options of celery's `apply_async` this layout carries.
pub(super) const OPTIONS: [&str; 7] = [
    "expires",
    "time_limit",
    "soft_time_limit",
    "ignore_result",
    "retries",
    "shadow",
    "priority",
];

/// kombu's Redis transport's priority steps (its default `priority_steps`) with what follows
/// the queue's name in the key of each step's list (`sep`, `\x06\x16`, then the step; step 0 is
/// the queue's own list): `_q_for_pri` gives a message of priority `p` the list of the highest
/// step not above `p`.
const PRIORITY_LISTS: [(u64, &str); 4] = [
    (0, ""),
    (3, "\x06\x163"),
    (6, "\x06\x166"),
    (9, "\x06\x169"),
];

/// The highest priority kombu's Redis transport tells apart (`max_priority`).
const MAX_PRIORITY: u64 = 9;

/// A job's options, checked, as the message carries them.
#[derive(Debug, Default)]
pub(super) struct Opts<'a> {
    pub(super) expires: Option<Expires<'a>>,
    pub(super) time_limit: Option<&'a Number>,
    pub(super) soft_time_limit: Option<&'a Number>,
    pub(super) ignore_result: bool,
    pub(super) retries: u64,
    pub(super) shadow: Option<&'a str>,
    pub(super) priority: u64,
}

/// When a task expires.
#[derive(Debug)]
pub(super) enum Expires<'a> {
    /// Seconds after the row's `created_at`.
    After(f64),
    /// An instant, as the row wrote it (ISO 8601 with its offset) and parsed.
    At(&'a str, DateTime<FixedOffset>),
}

/// A refusal of option `name`: `option "<name>" for the celery layout; must be <what>, not
/// <value>`.
fn misfit(name: &str, what: &str, value: &Value) -> Unfit {
    Unfit(format!(
        "option {name:?} for the celery layout; must be {what}, not {value}"
    ))
}

/// Seconds: a finite number >= 0.
fn seconds<'a>(name: &str, v: &'a Value) -> Result<&'a Number, Unfit> {
    match v {
        Value::Number(n) if n.as_f64().is_some_and(|s| s.is_finite() && s >= 0.0) => Ok(n),
        _ => Err(misfit(name, "seconds (a number >= 0)", v)),
    }
}

impl<'a> Opts<'a> {
    /// The options of `options`, or the first refusal: an unknown name, a value of another
    /// type, `soft_time_limit` above `time_limit` (celery's `apply_async` refuses it too).
    pub(super) fn of(options: &'a Options) -> Result<Opts<'a>, Unfit> {
        refuse_unknown_options("celery", &OPTIONS, options)?;
        let mut o = Opts::default();
        for (name, v) in options {
            match name.as_str() {
                "expires" => {
                    o.expires = Some(match v {
                        Value::Number(n) => Expires::After(
                            n.as_f64()
                                .filter(|s| s.is_finite())
                                .ok_or_else(|| misfit(name, EXPIRES, v))?,
                        ),
                        Value::String(s) => Expires::At(
                            s,
                            DateTime::parse_from_rfc3339(s)
                                .map_err(|_| misfit(name, EXPIRES, v))?,
                        ),
                        _ => return Err(misfit(name, EXPIRES, v)),
                    })
                }
                "time_limit" => o.time_limit = Some(seconds(name, v)?),
                "soft_time_limit" => o.soft_time_limit = Some(seconds(name, v)?),
                "ignore_result" => {
                    o.ignore_result = v
                        .as_bool()
                        .ok_or_else(|| misfit(name, "true or false", v))?
                }
                "retries" => {
                    o.retries = v
                        .as_u64()
                        .ok_or_else(|| misfit(name, "an integer >= 0", v))?
                }
                "shadow" => {
                    o.shadow = Some(
                        v.as_str()
                            .filter(|s| !s.is_empty())
                            .ok_or_else(|| misfit(name, "a non-empty string", v))?,
                    )
                }
                "priority" => {
                    o.priority = v.as_u64().filter(|p| *p <= MAX_PRIORITY).ok_or_else(|| {
                        misfit(name, "an integer 0..=9 (kombu's Redis priorities)", v)
                    })?
                }
                _ => unreachable!("refuse_unknown_options let only OPTIONS pass"),
            }
        }
        if let (Some(hard), Some(soft)) = (o.time_limit, o.soft_time_limit) {
            if soft.as_f64() > hard.as_f64() {
                return Err(Unfit(format!(
                    "option \"soft_time_limit\" for the celery layout; must be at most \
                     time_limit, not {soft} > {hard}"
                )));
            }
        }
        Ok(o)
    }

    /// The header `shadow`'s value.
    pub(super) fn write_shadow(&self, buf: &mut Vec<u8>) -> Result<(), Unfit> {
        match self.shadow {
            Some(s) => super::json_str(s, buf),
            None => {
                buf.extend_from_slice(b"null");
                Ok(())
            }
        }
    }

    /// The instant the task expires, for a job created at `created_at`.
    fn expires_at(&self, created_at: DateTime<Utc>) -> Result<Option<DateTime<Utc>>, Unfit> {
        Ok(match &self.expires {
            None => None,
            Some(Expires::At(_, t)) => Some(t.with_timezone(&Utc)),
            Some(Expires::After(s)) => {
                // To the microsecond, as Python's timedelta; a datetime of Python's range.
                let at = Some(TimeDelta::microseconds((s * 1e6).round() as i64))
                    .and_then(|d| created_at.checked_add_signed(d))
                    .filter(|t| (1..=9999).contains(&t.year()));
                Some(at.ok_or_else(|| {
                    Unfit(format!(
                        "option \"expires\" for the celery layout; {s} seconds after the row's \
                         created_at is outside the years 1..=9999 (Python's datetime)"
                    ))
                })?)
            }
        })
    }

    /// The header `expires`'s value: the instant as `datetime.isoformat()` writes it in UTC
    /// (`2026-01-01T00:00:00.250000+00:00`, no fraction at a whole second), or the row's
    /// string; `null` without.
    pub(super) fn write_expires(&self, job: &Job, buf: &mut Vec<u8>) -> Result<(), Unfit> {
        match (&self.expires, self.expires_at(job.created_at)?) {
            (Some(Expires::At(s, _)), _) => super::json_str(s, buf)?,
            (_, Some(t)) => {
                let _ = write!(
                    buf,
                    "\"{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
                    t.year(),
                    t.month(),
                    t.day(),
                    t.hour(),
                    t.minute(),
                    t.second()
                );
                let micros = t.timestamp_subsec_micros();
                if micros != 0 {
                    let _ = write!(buf, ".{micros:06}");
                }
                buf.extend_from_slice(b"+00:00\"");
            }
            _ => buf.extend_from_slice(b"null"),
        }
        Ok(())
    }

    /// The header `timelimit`: `[hard, soft]`, `null` for one not given.
    pub(super) fn write_timelimit(&self, buf: &mut Vec<u8>) {
        fn limit(n: Option<&Number>, buf: &mut Vec<u8>) {
            match n {
                Some(n) => {
                    let _ = write!(buf, "{n}");
                }
                None => buf.extend_from_slice(b"null"),
            }
        }
        buf.push(b'[');
        limit(self.time_limit, buf);
        buf.push(b',');
        limit(self.soft_time_limit, buf);
        buf.push(b']');
    }

    /// The property `expiration` with its comma, before `delivery_info`, for a job that
    /// expires: the milliseconds from `now` to the instant, at least 0, as a string (kombu's
    /// `str(int(expiration * 1000))`; Redis brokers do not read it).
    pub(super) fn write_expiration(
        &self,
        job: &Job,
        now: DateTime<Utc>,
        buf: &mut Vec<u8>,
    ) -> Result<(), Unfit> {
        if let Some(t) = self.expires_at(job.created_at)? {
            let ms = (t - now).num_milliseconds().max(0);
            let _ = write!(buf, "\"expiration\":\"{ms}\",");
        }
        Ok(())
    }
}

/// What follows the queue's name in the key of the list a message of `priority` goes to.
pub(super) fn list_suffix(priority: u64) -> &'static str {
    PRIORITY_LISTS
        .iter()
        .rev()
        .find(|(step, _)| *step <= priority)
        .map_or("", |(_, suffix)| suffix)
}

/// What `expires` must be.
const EXPIRES: &str = "seconds after the row's created_at (a number) or an ISO 8601 date and \
                       time with its offset (\"2026-01-01T00:00:00+00:00\")";
