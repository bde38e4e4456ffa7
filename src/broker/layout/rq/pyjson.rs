//! Python's `json.dumps(value)` with its defaults (`ensure_ascii`, separators `", "` and
//! `": "`), as RQ's JSON serializer writes a job's `meta`: what a Python client would store
//! for the same value.
//!
//! Exact but for what JSON's reading loses on the way: an object's keys come in the order the
//! relay reads them (sorted; Python keeps the order they were given in), and an integer beyond
//! 64 bits was read as a float (Python keeps an int).

use std::fmt::Write as _;

use serde_json::Value;

use super::pyrepr::py_float;

/// `json.dumps(v)` appended to `out`.
pub(super) fn dumps(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => {
                let _ = write!(out, "{i}");
            }
            (_, Some(u), _) => {
                let _ = write!(out, "{u}");
            }
            (_, _, Some(f)) => py_float(f, out),
            _ => out.push_str("null"),
        },
        Value::String(s) => dumps_str(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                dumps(x, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, x)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                dumps_str(k, out);
                out.push_str(": ");
                dumps(x, out);
            }
            out.push('}');
        }
    }
}

/// `json.dumps(s)` of a string (`py_encode_basestring_ascii`): `"` and `\` escaped, `\n`, `\r`,
/// `\t`, `\b`, `\f` by name, every other character outside printable ASCII as `\uxxxx` (a pair
/// of surrogates beyond the BMP).
pub(super) fn dumps_str(s: &str, out: &mut String) {
    out.push('"');
    let mut rest = s;
    while !rest.is_empty() {
        let plain = rest
            .bytes()
            .position(|b| !(b' '..0x7f).contains(&b) || b == b'\\' || b == b'"')
            .unwrap_or(rest.len());
        out.push_str(&rest[..plain]);
        rest = &rest[plain..];
        let Some(c) = rest.chars().next() else {
            break;
        };
        rest = &rest[c.len_utf8()..];
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{u:04x}");
                }
            }
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn py(json: &str) -> String {
        let v: Value = serde_json::from_str(json).unwrap();
        let mut out = String::new();
        dumps(&v, &mut out);
        out
    }

    /// Against Python 3.11's `json.dumps(json.loads(text))` (keys given sorted).
    #[test]
    fn as_python_dumps_them() {
        for (text, python) in [
            (
                r#"{"a": [1, 2.50, null, true, false]}"#,
                r#"{"a": [1, 2.5, null, true, false]}"#,
            ),
            (r#"{"b":{"c":{}},"d":[]}"#, r#"{"b": {"c": {}}, "d": []}"#),
            ("1e16", "1e+16"),
            ("1e-5", "1e-05"),
            ("0.1", "0.1"),
            ("2.0", "2.0"),
            ("-17", "-17"),
            ("18446744073709551615", "18446744073709551615"),
            ("-9223372036854775808", "-9223372036854775808"),
            ("123456789.123", "123456789.123"),
            (r#""z\u00fcrich""#, r#""z\u00fcrich""#),
            (r#""日本""#, r#""\u65e5\u672c""#),
            (r#""😀""#, r#""\ud83d\ude00""#),
            (r#""a\"b\\c/d""#, r#""a\"b\\c/d""#),
            (r#""\n\r\t\b\f""#, r#""\n\r\t\b\f""#),
            (
                r#""\u0000\u0001\u001f\u007f\u0080""#,
                r#""\u0000\u0001\u001f\u007f\u0080""#,
            ),
            (r#""it's ~ fine""#, r#""it's ~ fine""#),
        ] {
            assert_eq!(py(text), python, "{text}");
        }
    }
}
