//! Python's `repr()` of what `json.loads` makes of a JSON text, for RQ's job `description`
//! (`get_call_string` in rq/utils.py: `func(repr(arg), ..., key=repr(value), ...)`).
//!
//! Exact for what JSON carries: `None`, `True`, `False`, integers (up to 64 bits; a larger one is
//! read as a float by this parser, where Python keeps an int; `-0` shows as Python's `0` would
//! as `-0.0`, the parser's reading of it), floats (`repr(float)`: the
//! shortest digits, positional for exponents -4..16), strings (quoted `'...'`, or `"..."` when
//! the text has a `'` and no `"`, escaped as Python does for ASCII; of the non-ASCII characters
//! only the usual non-printable ones are escaped), lists and dicts (in the text's order; a key
//! that repeats keeps its first place and its last value, as in Python).

use std::collections::HashMap;
use std::fmt::{self, Write as _};

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// A JSON value as Python sees it, in the text's order.
pub(super) enum Py {
    None,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    List(Vec<Py>),
    Dict(Vec<(String, Py)>),
}

impl<'de> Deserialize<'de> for Py {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Py, D::Error> {
        d.deserialize_any(PyVisitor)
    }
}

struct PyVisitor;

impl<'de> Visitor<'de> for PyVisitor {
    type Value = Py;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E>(self) -> Result<Py, E> {
        Ok(Py::None)
    }
    fn visit_bool<E>(self, b: bool) -> Result<Py, E> {
        Ok(Py::Bool(b))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Py, E> {
        Ok(Py::Int(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Py, E> {
        Ok(Py::Int(v.into()))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Py, E> {
        Ok(Py::Float(v))
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Py, E> {
        Ok(Py::Str(s.to_owned()))
    }
    fn visit_string<E>(self, s: String) -> Result<Py, E> {
        Ok(Py::Str(s))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Py, A::Error> {
        let mut v = Vec::new();
        while let Some(x) = seq.next_element()? {
            v.push(x);
        }
        Ok(Py::List(v))
    }
    /// A key that repeats keeps its first place and takes its last value, as Python's dict.
    /// Small objects look a key up by scanning; past `SCAN_KEYS` keys, by a map.
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Py, A::Error> {
        const SCAN_KEYS: usize = 16;
        let mut v: Vec<(String, Py)> = Vec::new();
        let mut at: HashMap<String, usize> = HashMap::new();
        while let Some((k, x)) = map.next_entry::<String, Py>()? {
            let found = if v.len() <= SCAN_KEYS {
                v.iter().position(|(have, _)| *have == k)
            } else {
                if at.is_empty() {
                    at.extend(v.iter().enumerate().map(|(i, (k, _))| (k.clone(), i)));
                }
                at.get(&k).copied()
            };
            match found {
                Some(i) => v[i].1 = x,
                None => {
                    if !at.is_empty() {
                        at.insert(k.clone(), v.len());
                    }
                    v.push((k, x));
                }
            }
        }
        Ok(Py::Dict(v))
    }
}

impl Py {
    /// Python's `repr(self)` into `out`; stops early (leaving more than `limit` bytes
    /// written) once `out` holds more than `limit` bytes.
    pub(super) fn repr(&self, out: &mut String, limit: usize) {
        if out.len() > limit {
            return;
        }
        match self {
            Py::None => out.push_str("None"),
            Py::Bool(true) => out.push_str("True"),
            Py::Bool(false) => out.push_str("False"),
            Py::Int(i) => {
                let _ = write!(out, "{i}");
            }
            Py::Float(f) => py_float(*f, out),
            Py::Str(s) => py_str(s, out, limit),
            Py::List(items) => {
                out.push('[');
                for (i, x) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    x.repr(out, limit);
                    if out.len() > limit {
                        return;
                    }
                }
                out.push(']');
            }
            Py::Dict(items) => {
                out.push('{');
                for (i, (k, x)) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    py_str(k, out, limit);
                    if out.len() > limit {
                        return;
                    }
                    out.push_str(": ");
                    x.repr(out, limit);
                    if out.len() > limit {
                        return;
                    }
                }
                out.push('}');
            }
        }
    }
}

/// Python's `repr(str)`.
///
/// Stops once `out` holds more than `limit` bytes (the closing quote then left out). Runs of
/// characters that stand for themselves are copied whole.
fn py_str(s: &str, out: &mut String, limit: usize) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    let mut rest = s;
    loop {
        if out.len() > limit {
            return;
        }
        // The longest prefix of printable ASCII characters other than the quote and `\\`.
        let plain = rest
            .bytes()
            .position(|b| !(b' '..0x7f).contains(&b) || b == b'\\' || b == quote as u8)
            .unwrap_or(rest.len());
        let room = (limit - out.len()).saturating_add(1);
        if plain >= room {
            out.push_str(&rest[..room]);
            return;
        }
        out.push_str(&rest[..plain]);
        rest = &rest[plain..];
        let Some(c) = rest.chars().next() else {
            break;
        };
        rest = &rest[c.len_utf8()..];
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if c < ' ' || c == '\x7f' => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if !c.is_ascii() && !printable(c) => {
                let u = c as u32;
                let _ = if u < 0x100 {
                    write!(out, "\\x{u:02x}")
                } else if u < 0x10000 {
                    write!(out, "\\u{u:04x}")
                } else {
                    write!(out, "\\U{u:08x}")
                };
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// Python's `str.isprintable` for a non-ASCII character, for the usual suspects: C1 controls,
/// separators (Zs, Zl, Zp), format characters that come up in text (soft hyphen, zero-width
/// and direction marks, BOM) and private use.
fn printable(c: char) -> bool {
    let u = c as u32;
    !(c.is_whitespace()
        || (0x80..=0xa0).contains(&u)
        || u == 0xad
        || (0x200b..=0x200f).contains(&u)
        || (0x202a..=0x202e).contains(&u)
        || (0x2060..=0x2064).contains(&u)
        || u == 0xfeff
        || (0xe000..=0xf8ff).contains(&u)
        || (0xd800..=0xdfff).contains(&u))
}

/// Python's `repr(float)`: the shortest digits that read back the same, in positional notation
/// for exponents -4..16 (with at least one decimal), else as `1.5e+16`, `1e-05`.
pub(super) fn py_float(f: f64, out: &mut String) {
    if f.is_nan() {
        out.push_str("nan");
        return;
    }
    if f.is_infinite() {
        out.push_str(if f > 0.0 { "inf" } else { "-inf" });
        return;
    }
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if f.is_sign_negative() {
        out.push('-');
    }
    if (-4..16).contains(&exp) {
        let point = exp + 1;
        if point <= 0 {
            out.push_str("0.");
            out.push_str(&"0".repeat((-point) as usize));
            out.push_str(&digits);
        } else if point as usize >= digits.len() {
            out.push_str(&digits);
            out.push_str(&"0".repeat(point as usize - digits.len()));
            out.push_str(".0");
        } else {
            out.push_str(&digits[..point as usize]);
            out.push('.');
            out.push_str(&digits[point as usize..]);
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(out, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repr(json: &str) -> String {
        let v: Py = serde_json::from_str(json).unwrap();
        let mut out = String::new();
        v.repr(&mut out, usize::MAX);
        out
    }

    /// Each right-hand side is what CPython 3.11 prints for `repr(json.loads(left))`.
    #[test]
    fn as_python_prints_them() {
        for (json, want) in [
            ("null", "None"),
            ("true", "True"),
            (
                "[1, -2, 2.50, 1e16, 1e-5, 0.0001, 123456789012345678]",
                "[1, -2, 2.5, 1e+16, 1e-05, 0.0001, 123456789012345678]",
            ),
            ("-0.0", "-0.0"),
            ("1E2", "100.0"),
            (r#""it's""#, r#""it's""#),
            (r#""it's \"q\"""#, r#"'it\'s "q"'"#),
            (r#""a\\b\n\t\u0001\u007f""#, r"'a\\b\n\t\x01\x7f'"),
            ("\"é€😀\\u00a0\"", "'é€😀\\xa0'"),
            (
                r#"{"b": 1, "a": [true, null, {}], "c": []}"#,
                "{'b': 1, 'a': [True, None, {}], 'c': []}",
            ),
        ] {
            assert_eq!(repr(json), want, "{json}");
        }
    }

    /// Cut short at any limit, a repr is the start of the whole one, longer than the limit.
    #[test]
    fn a_limit_cuts_the_repr_short_and_nothing_else() {
        for json in [
            r#"["it's", "say \"hi\"", "a\\b\tc", "caf\u00e9 \u00a0 \ud83d\ude00", "\u0001x"]"#,
            r#"{"k": "plain text that goes on and on", "n": [1, 2.5, null, true], "k2": {"a": "'"}}"#,
            r#""a long plain string, longer than every limit tried here, and then some more""#,
        ] {
            let whole = repr(json);
            let v: Py = serde_json::from_str(json).unwrap();
            for limit in 0..whole.len() + 2 {
                let mut out = String::new();
                v.repr(&mut out, limit);
                assert!(whole.starts_with(&out), "{json} at {limit}: {out}");
                assert!(
                    out.len() > limit || out == whole,
                    "{json} at {limit}: {out}"
                );
            }
        }
    }

    /// Past 16 keys a repeated key is found by a map: first place, last value, either way.
    #[test]
    fn a_repeated_key_keeps_its_place_in_small_and_large_objects() {
        assert_eq!(repr(r#"{"a": 1, "b": 2, "a": 3}"#), "{'a': 3, 'b': 2}");
        let keys: Vec<String> = (0..20).map(|i| format!("\"k{i}\": {i}")).collect();
        let json = format!(
            "{{{}, \"k3\": 30, \"k19\": 190, \"new\": 0}}",
            keys.join(", ")
        );
        let want: Vec<String> = (0..20)
            .map(|i| match i {
                3 => "'k3': 30".to_owned(),
                19 => "'k19': 190".to_owned(),
                i => format!("'k{i}': {i}"),
            })
            .collect();
        assert_eq!(repr(&json), format!("{{{}, 'new': 0}}", want.join(", ")));
    }
}
