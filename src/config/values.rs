//! Parsers of option values: durations, byte sizes, booleans, bounded whole numbers. Each
//! error is the reason alone; the caller names the culprit.

use std::time::Duration;

/// Parses a humantime duration; a bare `0` is zero.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    if s.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("{s:?} is not a duration like 500ms, 30s, 5m or 1h30m ({e})"))
}

pub(super) fn duration_at_least(s: &str, min: Duration) -> Result<Duration, String> {
    duration_between(s, min, Duration::MAX)
}

pub(super) fn duration_between(s: &str, min: Duration, max: Duration) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < min {
        return Err(format!(
            "{s:?} is shorter than {}",
            humantime::format_duration(min)
        ));
    }
    if d > max {
        return Err(format!(
            "{s:?} is longer than {}",
            humantime::format_duration(max)
        ));
    }
    Ok(d)
}

/// Parses a size in bytes: a whole number with an optional unit, case-insensitive: `b`,
/// `k`/`kb`/`kib`, `m`/`mb`/`mib`, `g`/`gb`/`gib`, all powers of 1024 as in Redis's own
/// configuration (`proto-max-bulk-len 1mb` is 1048576 bytes).
pub fn parse_byte_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let bad = || format!("{s:?} is not a size like 16MiB, 512kb or 1048576");
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let unit_bytes: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1024,
        "m" | "mb" | "mib" => 1024 * 1024,
        "g" | "gb" | "gib" => 1024 * 1024 * 1024,
        _ => return Err(bad()),
    };
    n.checked_mul(unit_bytes)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(bad)
}

pub(super) fn byte_size_between(s: &str, min: usize, max: usize) -> Result<usize, String> {
    let n = parse_byte_size(s)?;
    if n < min || n > max {
        return Err(format!(
            "{s:?} ({n} bytes) is out of range {min}..={max} bytes"
        ));
    }
    Ok(n)
}

/// `true`/`false` (also `1`/`0`, `yes`/`no`, `on`/`off`), any case.
pub(super) fn parse_bool(s: &str) -> Result<bool, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(format!("{s:?} is not true or false")),
    }
}

pub(super) fn bounded_int(s: &str, min: usize, max: usize) -> Result<usize, String> {
    let n: usize = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a whole number"))?;
    if n < min || n > max {
        return Err(format!("{n} is out of range {min}..={max}"));
    }
    Ok(n)
}
