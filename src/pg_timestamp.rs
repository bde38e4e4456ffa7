//! A `timestamptz` exactly as Postgres stores it, for rows read from and written back to the
//! outbox tables.
//!
//! sqlx's chrono decoder panics on values chrono cannot hold (`infinity` and `-infinity`, which
//! Postgres stores as `i64::MAX` and `i64::MIN`, and years beyond chrono's ±262,143), and one such
//! row would stop every relay worker that claims it. This type keeps Postgres's binary value (an
//! `i64` of microseconds since 2000-01-01 00:00:00 UTC) untouched: decoding cannot fail on any
//! value, a row handed back to Postgres keeps its exact value (`infinity` stays `infinity`), and
//! the conversion to chrono happens where a failure can be reported
//! ([`PgTimestamp::to_relayable`]).

use std::fmt;

use chrono::{DateTime, Utc};
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::{
    PgArgumentBuffer, PgHasArrayType, PgTypeInfo, PgValueFormat, PgValueRef, Postgres,
};
use sqlx::{Decode, Encode, Type};

/// Microseconds per day.
const DAY: i64 = 86_400_000_000;
/// Days from 1970-01-01 (the Unix epoch) to 2000-01-01 (Postgres's epoch).
const PG_EPOCH_DAYS: i64 = 10_957;
/// Microseconds from the Unix epoch to Postgres's.
const PG_EPOCH_UNIX_MICROS: i64 = PG_EPOCH_DAYS * DAY;

/// What a `google.protobuf.Timestamp` carries, for error messages (docs/wire.md).
pub(crate) const RELAYABLE_RANGE: &str = "protobuf Timestamp carries 0001-01-01..9999-12-31";

/// The first instant a protobuf Timestamp carries, 0001-01-01T00:00:00Z, in Postgres's
/// microseconds: 730,119 days before 2000-01-01.
const RELAYABLE_MIN: i64 = -730_119 * DAY;
/// The last instant Postgres can store within a protobuf Timestamp's range,
/// 9999-12-31T23:59:59.999999Z: one microsecond before 10000-01-01, 2,921,940 days after
/// 2000-01-01.
const RELAYABLE_MAX: i64 = 2_921_940 * DAY - 1;

/// A `timestamptz` as Postgres stores it: microseconds since 2000-01-01 00:00:00 UTC, with
/// `i64::MAX` for `infinity` and `i64::MIN` for `-infinity`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct PgTimestamp(i64);

impl PgTimestamp {
    /// Postgres's `infinity`.
    pub(crate) const INFINITY: PgTimestamp = PgTimestamp(i64::MAX);
    /// Postgres's `-infinity`.
    pub(crate) const NEG_INFINITY: PgTimestamp = PgTimestamp(i64::MIN);

    /// The value with Postgres's raw representation `micros`.
    pub(crate) const fn from_raw(micros: i64) -> Self {
        PgTimestamp(micros)
    }

    /// Postgres's raw representation.
    pub(crate) const fn raw(self) -> i64 {
        self.0
    }

    /// Neither `infinity` nor `-infinity`.
    pub(crate) const fn is_finite(self) -> bool {
        self.0 != i64::MAX && self.0 != i64::MIN
    }

    /// The instant, when a protobuf Timestamp can carry it (0001-01-01T00:00:00Z ..=
    /// 9999-12-31T23:59:59.999999Z), else `None`. Cheap: a range check and integer arithmetic.
    pub(crate) fn to_relayable(self) -> Option<DateTime<Utc>> {
        if !(RELAYABLE_MIN..=RELAYABLE_MAX).contains(&self.0) {
            return None;
        }
        DateTime::from_timestamp_micros(self.0.checked_add(PG_EPOCH_UNIX_MICROS)?)
    }

    /// The instant, when chrono can hold it (any finite value within chrono's years), else
    /// `None`.
    pub(crate) fn to_datetime(self) -> Option<DateTime<Utc>> {
        if !self.is_finite() {
            return None;
        }
        DateTime::from_timestamp_micros(self.0.checked_add(PG_EPOCH_UNIX_MICROS)?)
    }

    /// The value Postgres stores for `t` (sub-microsecond digits dropped, as Postgres does).
    /// Every chrono instant fits: chrono's years span less than an `i64` of microseconds.
    pub(crate) fn from_datetime(t: DateTime<Utc>) -> Self {
        // Saturating only to rule out a panic: no chrono value comes near either end.
        PgTimestamp(t.timestamp_micros().saturating_sub(PG_EPOCH_UNIX_MICROS))
    }
}

/// As Postgres prints a `timestamptz` with `TimeZone` UTC: `infinity`, `-infinity`, or
/// `YYYY-MM-DD HH:MM:SS[.ffffff]+00`, with ` BC` for years before 1 (e.g.
/// `294276-12-31 00:00:00+00`, `0001-12-31 23:59:59.999999+00 BC`). Any `i64` prints, not only
/// the values Postgres accepts.
impl fmt::Display for PgTimestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            i64::MAX => return f.write_str("infinity"),
            i64::MIN => return f.write_str("-infinity"),
            _ => {}
        }
        let days = self.0.div_euclid(DAY);
        let time = self.0.rem_euclid(DAY);
        let (year, month, day) = civil_from_days(days + PG_EPOCH_DAYS);
        let secs = time / 1_000_000;
        let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
        // Astronomical year 0 is 1 BC.
        let (shown_year, era) = if year > 0 {
            (year, "")
        } else {
            (1 - year, " BC")
        };
        write!(
            f,
            "{shown_year:04}-{month:02}-{day:02} {h:02}:{m:02}:{s:02}"
        )?;
        let micros = time % 1_000_000;
        if micros != 0 {
            let frac = format!("{micros:06}");
            write!(f, ".{}", frac.trim_end_matches('0'))?;
        }
        write!(f, "+00{era}")
    }
}

/// The proleptic Gregorian (year, month, day) of a day count since 1970-01-01, for any count
/// an `i64` of microseconds can give (H. Hinnant's `civil_from_days`; year 0 is 1 BC).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11], March-based
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

impl Type<Postgres> for PgTimestamp {
    fn type_info() -> PgTypeInfo {
        <DateTime<Utc> as Type<Postgres>>::type_info()
    }
}

impl PgHasArrayType for PgTimestamp {
    fn array_type_info() -> PgTypeInfo {
        <DateTime<Utc> as PgHasArrayType>::array_type_info()
    }
}

impl Encode<'_, Postgres> for PgTimestamp {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        // Binary timestamptz: the raw i64, big-endian; Postgres reads i64::MAX back as infinity.
        <i64 as Encode<Postgres>>::encode_by_ref(&self.0, buf)
    }

    fn size_hint(&self) -> usize {
        std::mem::size_of::<i64>()
    }
}

impl<'r> Decode<'r, Postgres> for PgTimestamp {
    fn decode(value: PgValueRef<'r>) -> Result<Self, BoxDynError> {
        match value.format() {
            // What prepared statements (every query of the relay) receive: 8 bytes, no parsing.
            PgValueFormat::Binary => {
                let bytes: [u8; 8] = value.as_bytes()?.try_into().map_err(|_| {
                    format!(
                        "timestamptz: expected 8 bytes, got {}",
                        value.as_bytes().map_or(0, <[u8]>::len)
                    )
                })?;
                Ok(PgTimestamp(i64::from_be_bytes(bytes)))
            }
            // Simple-protocol results only: the infinities here, the rest through sqlx's
            // chrono parser (which fails, without panicking, on what chrono cannot hold).
            PgValueFormat::Text => match value.as_str()? {
                "infinity" => Ok(PgTimestamp::INFINITY),
                "-infinity" => Ok(PgTimestamp::NEG_INFINITY),
                _ => Ok(PgTimestamp::from_datetime(<DateTime<Utc> as Decode<
                    Postgres,
                >>::decode(
                    value
                )?)),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(rfc3339: &str) -> DateTime<Utc> {
        rfc3339.parse().unwrap()
    }

    #[test]
    fn the_epochs_agree() {
        assert_eq!(
            PgTimestamp::from_datetime(at("2000-01-01T00:00:00Z")).raw(),
            0
        );
        assert_eq!(
            PgTimestamp::from_raw(0).to_relayable(),
            Some(at("2000-01-01T00:00:00Z"))
        );
        assert_eq!(
            PgTimestamp::from_raw(0).to_string(),
            "2000-01-01 00:00:00+00"
        );
    }

    #[test]
    fn the_first_relayable_instant_and_one_microsecond_before() {
        let first = at("0001-01-01T00:00:00Z");
        let t = PgTimestamp::from_datetime(first);
        assert_eq!(t.raw(), RELAYABLE_MIN);
        assert_eq!(t.to_relayable(), Some(first));
        assert_eq!(t.to_string(), "0001-01-01 00:00:00+00");
        let before = PgTimestamp::from_raw(RELAYABLE_MIN - 1);
        assert_eq!(before.to_relayable(), None);
        assert_eq!(
            before.to_datetime(),
            Some(first - chrono::TimeDelta::microseconds(1)),
            "chrono holds it, protobuf does not"
        );
        assert_eq!(before.to_string(), "0001-12-31 23:59:59.999999+00 BC");
    }

    #[test]
    fn the_last_relayable_instant_and_one_microsecond_after() {
        let last = at("9999-12-31T23:59:59.999999Z");
        let t = PgTimestamp::from_datetime(last);
        assert_eq!(t.raw(), RELAYABLE_MAX);
        assert_eq!(t.to_relayable(), Some(last));
        assert_eq!(t.to_string(), "9999-12-31 23:59:59.999999+00");
        let after = PgTimestamp::from_raw(RELAYABLE_MAX + 1);
        assert_eq!(after.to_relayable(), None);
        assert_eq!(after.to_datetime(), Some(at("+10000-01-01T00:00:00Z")));
        assert_eq!(after.to_string(), "10000-01-01 00:00:00+00");
    }

    #[test]
    fn infinities_convert_to_nothing_and_print_as_postgres_does() {
        for (t, text) in [
            (PgTimestamp::INFINITY, "infinity"),
            (PgTimestamp::NEG_INFINITY, "-infinity"),
        ] {
            assert!(!t.is_finite());
            assert_eq!(t.to_relayable(), None);
            assert_eq!(t.to_datetime(), None);
            assert_eq!(t.to_string(), text);
        }
        assert_eq!(PgTimestamp::INFINITY.raw(), i64::MAX);
        assert_eq!(PgTimestamp::NEG_INFINITY.raw(), i64::MIN);
    }

    #[test]
    fn years_beyond_chrono_print_without_panicking() {
        // Postgres's own ends: 294276-12-31 23:59:59.999999 and 4714-11-24 00:00:00 BC.
        let pg_max = PgTimestamp::from_raw(9_223_371_331_199_999_999);
        assert!(pg_max.is_finite());
        assert_eq!(pg_max.to_relayable(), None);
        assert_eq!(pg_max.to_datetime(), None);
        assert_eq!(pg_max.to_string(), "294276-12-31 23:59:59.999999+00");
        let pg_min = PgTimestamp::from_raw(-211_813_488_000_000_000);
        assert_eq!(pg_min.to_relayable(), None);
        assert_eq!(pg_min.to_string(), "4714-11-24 00:00:00+00 BC");
        // Any i64 prints.
        for raw in [i64::MAX - 1, i64::MIN + 1, -1, 1, 500_000] {
            assert!(!PgTimestamp::from_raw(raw).to_string().is_empty());
        }
        assert_eq!(
            PgTimestamp::from_raw(-500_000).to_string(),
            "1999-12-31 23:59:59.5+00"
        );
    }

    #[test]
    fn round_trips_through_chrono_to_the_microsecond() {
        for s in [
            "1970-01-01T00:00:00Z",
            "1969-12-31T23:59:59.999999Z",
            "2024-02-29T12:34:56.000001Z",
            "1600-03-01T00:00:00Z",
        ] {
            let t = at(s);
            let pg = PgTimestamp::from_datetime(t);
            assert_eq!(pg.to_relayable(), Some(t), "{s}");
            let (y, m, d) = civil_from_days(pg.raw().div_euclid(DAY) + PG_EPOCH_DAYS);
            assert_eq!(format!("{y:04}-{m:02}-{d:02}"), &s[..10]);
        }
    }
}
