//! Settings from environment variables: unset and empty mean the default.

use std::time::Duration;

use super::BoxError;

/// The value of `name`, unless unset or empty.
pub fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|s| !s.is_empty())
}

/// The value of `name`, or `default`.
pub fn or(name: &str, default: &str) -> String {
    var(name).unwrap_or_else(|| default.to_owned())
}

/// `name` parsed, or `default`; an error names the variable and its value.
pub fn num<T: std::str::FromStr>(name: &str, default: T) -> Result<T, BoxError>
where
    T::Err: std::fmt::Display,
{
    match var(name) {
        None => Ok(default),
        Some(v) => v.parse().map_err(|e| format!("{name}={v:?}: {e}").into()),
    }
}

/// `name` as a duration (`30s`, `5m`, `50ms`), or `default`.
pub fn duration(name: &str, default: Duration) -> Result<Duration, BoxError> {
    match var(name) {
        None => Ok(default),
        Some(v) => Ok(humantime::parse_duration(&v).map_err(|e| format!("{name}={v:?}: {e}"))?),
    }
}
