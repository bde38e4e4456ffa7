//! Celery's `saferepr(value, 1024)` (celery/utils/saferepr.py, celery 5.7) of what a worker
//! decodes from a JSON array or object: the `argsrepr` and `kwargsrepr` headers its client
//! writes (`AMQP.as_task_v2`). One pass over the JSON text, written straight into the answer:
//! no tree of values, no list of tokens.
//!
//! Celery's stream of tokens, each a container's opening or closing, `, `, `: `, a key or a
//! value: while some of the 1,024 characters are left, a token is written and counted, a
//! string, number, `True`, `False` or `None` first cut to what is left
//! (`celery.utils.text.truncate`: at the last space, then `...`). Once none are, a closing is
//! still written (uncounted), and any other token ends the text: `, ...`, then the closings of
//! the containers still open. A container three levels deep shows as `[...]` or `{...}`, never
//! cut. An object whose key repeats keeps the key's first place and its last value (Python's
//! `json.loads`). Strings are quoted `'...'` with only `'` escaped, as celery does.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use super::super::Unfit;

/// Celery's `argsrepr_maxsize` and `kwargsrepr_maxsize` (celery/app/amqp.py).
const MAXLEN: i64 = 1024;

/// Celery's `task_repr_maxlevels` default: deeper lists and dicts show as `[...]`, `{...}`.
const MAXLEVELS: usize = 3;

/// An object with at most this many keys is checked for a repeated key pair by pair.
const FEW_KEYS: usize = 16;

/// `saferepr(json.loads(json), 1024)`, appended to `out`. `json` is valid JSON (the payload was
/// parsed before); text that is not is refused, never a panic.
pub(super) fn saferepr(json: &str, out: &mut String) -> Result<(), Unfit> {
    let mut r = Repr {
        json,
        at: 0,
        out,
        left: MAXLEN,
        cut: false,
    };
    r.value(0)?;
    Ok(())
}

/// The pass: where it is in the JSON text, and what it has written.
struct Repr<'j, 'o> {
    json: &'j str,
    /// Byte offset of the next character to read.
    at: usize,
    out: &'o mut String,
    /// Celery's `maxlen`: characters left; at or below 0 nothing but closings is written.
    left: i64,
    /// `, ...` written: only the closings of the containers still open follow.
    cut: bool,
}

/// The reason for refusing text that is not JSON.
fn malformed(what: &str) -> Unfit {
    Unfit(format!("the payload's args or kwargs: {what}"))
}

impl<'j> Repr<'j, '_> {
    // --- Celery's tokens. Each answers false once the text has ended (`, ...` written).

    /// Whether a token other than a closing is written: while characters are left; at the
    /// first one after, `, ...` ends the text.
    fn room(&mut self) -> bool {
        if self.cut {
            return false;
        }
        if self.left <= 0 {
            self.out.push_str(", ...");
            self.cut = true;
            return false;
        }
        true
    }

    /// An opening, `, `, `: ` or a container too deep: written whole.
    fn literal(&mut self, s: &str) -> bool {
        if !self.room() {
            return false;
        }
        self.out.push_str(s);
        self.left -= s.len() as i64;
        true
    }

    /// A container's closing: always written (counted while characters are left, which
    /// changes nothing once none are).
    fn close(&mut self, s: &str) {
        self.out.push_str(s);
        self.left -= s.len() as i64;
    }

    /// A string (`quoted`: a string value or key), a number, `True`, `False` or `None`: cut to
    /// the characters left.
    fn text(&mut self, s: &str, quoted: bool) -> bool {
        if !self.room() {
            return false;
        }
        let s = truncate(s, self.left as usize);
        let start = self.out.len();
        if quoted {
            self.out.push('\'');
            if memchr::memchr(b'\'', s.as_bytes()).is_none() {
                self.out.push_str(&s);
            } else {
                self.out.push_str(&s.replace('\'', "\\'"));
            }
            self.out.push('\'');
        } else {
            self.out.push_str(&s);
        }
        self.left -= self.out[start..].chars().count() as i64;
        true
    }

    // --- The JSON text.

    fn peek(&self) -> Option<u8> {
        self.json.as_bytes().get(self.at).copied()
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    /// Consumes `byte`, after any whitespace.
    fn expect(&mut self, byte: u8) -> Result<(), Unfit> {
        self.skip_ws();
        if self.peek() != Some(byte) {
            return Err(malformed(&format!("expected '{}'", byte as char)));
        }
        self.at += 1;
        Ok(())
    }

    /// The string starting here (at its `"`), unescaped.
    fn string(&mut self) -> Result<Cow<'j, str>, Unfit> {
        let bytes = self.json.as_bytes();
        let start = self.at;
        let mut i = start + 1;
        let mut escaped = false;
        let end = loop {
            let rest = bytes.get(i..).unwrap_or_default();
            match memchr::memchr2(b'"', b'\\', rest) {
                None => return Err(malformed("unterminated string")),
                Some(j) if rest[j] == b'"' => break i + j,
                Some(j) => {
                    escaped = true;
                    i += j + 2;
                }
            }
        };
        self.at = end + 1;
        let quoted = &self.json[start..=end];
        if escaped {
            serde_json::from_str::<String>(quoted)
                .map(Cow::Owned)
                .map_err(|e| malformed(&e.to_string()))
        } else {
            Ok(Cow::Borrowed(&quoted[1..quoted.len() - 1]))
        }
    }

    /// The number, `true`, `false` or `null` starting here.
    fn scalar(&mut self) -> &'j str {
        let start = self.at;
        while !matches!(
            self.peek(),
            None | Some(b',' | b']' | b'}' | b':' | b' ' | b'\t' | b'\n' | b'\r')
        ) {
            self.at += 1;
        }
        &self.json[start..self.at]
    }

    /// Passes over the value starting here.
    fn skip_value(&mut self) -> Result<(), Unfit> {
        self.skip_ws();
        match self.peek() {
            Some(b'"') => self.string().map(drop),
            Some(b'[' | b'{') => {
                let mut depth = 0usize;
                loop {
                    match self.peek() {
                        None => return Err(malformed("unterminated array or object")),
                        Some(b'"') => {
                            self.string()?;
                            continue;
                        }
                        Some(b'[' | b'{') => depth += 1,
                        Some(b']' | b'}') => {
                            depth -= 1;
                            if depth == 0 {
                                self.at += 1;
                                return Ok(());
                            }
                        }
                        Some(_) => {}
                    }
                    self.at += 1;
                }
            }
            _ => {
                self.scalar();
                Ok(())
            }
        }
    }

    // --- Values, written as they are read. Each answers Ok(false) once the text has ended.

    fn value(&mut self, level: usize) -> Result<bool, Unfit> {
        self.skip_ws();
        match self.peek() {
            Some(b'[') => self.list(level),
            Some(b'{') => self.dict(level),
            Some(b'"') => {
                let s = self.string()?;
                Ok(self.text(&s, true))
            }
            _ => {
                let scalar = self.scalar();
                let shown: Cow<'_, str> = match scalar {
                    "true" => "True".into(),
                    "false" => "False".into(),
                    "null" => "None".into(),
                    n => py_number(n)?,
                };
                Ok(self.text(&shown, false))
            }
        }
    }

    fn list(&mut self, level: usize) -> Result<bool, Unfit> {
        if level >= MAXLEVELS {
            self.skip_value()?;
            return Ok(self.literal("[...]"));
        }
        self.at += 1;
        if !self.literal("[") {
            return Ok(false);
        }
        self.skip_ws();
        if self.peek() == Some(b']') {
            self.at += 1;
            self.close("]");
            return Ok(true);
        }
        loop {
            if !self.value(level + 1)? {
                self.close("]");
                return Ok(false);
            }
            self.skip_ws();
            match self.peek() {
                Some(b']') => {
                    self.at += 1;
                    self.close("]");
                    return Ok(true);
                }
                Some(b',') => {
                    self.at += 1;
                    if !self.literal(", ") {
                        self.close("]");
                        return Ok(false);
                    }
                }
                _ => return Err(malformed("expected ',' or ']'")),
            }
        }
    }

    fn dict(&mut self, level: usize) -> Result<bool, Unfit> {
        if level >= MAXLEVELS {
            self.skip_value()?;
            return Ok(self.literal("{...}"));
        }
        // The members first (key, where its value starts): a later repeat of a key changes
        // what an earlier place shows.
        self.at += 1;
        let mut members: Vec<(Cow<'j, str>, usize)> = Vec::new();
        self.skip_ws();
        if self.peek() == Some(b'}') {
            self.at += 1;
        } else {
            loop {
                self.skip_ws();
                if self.peek() != Some(b'"') {
                    return Err(malformed("expected a key"));
                }
                let key = self.string()?;
                self.expect(b':')?;
                self.skip_ws();
                members.push((key, self.at));
                self.skip_value()?;
                self.skip_ws();
                match self.peek() {
                    Some(b'}') => {
                        self.at += 1;
                        break;
                    }
                    Some(b',') => self.at += 1,
                    _ => return Err(malformed("expected ',' or '}'")),
                }
            }
        }
        let end = self.at;
        python_dict(&mut members);
        if !self.literal("{") {
            return Ok(false);
        }
        for (i, (key, value_at)) in members.iter().enumerate() {
            self.at = *value_at;
            let shown = (i == 0 || self.literal(", "))
                && self.text(key, true)
                && self.literal(": ")
                && self.value(level + 1)?;
            if !shown {
                self.close("}");
                return Ok(false);
            }
        }
        self.at = end;
        self.close("}");
        Ok(true)
    }
}

/// Python's dict of `members` (key, where its value starts), in place: a repeated key keeps
/// its first place and takes its last value.
fn python_dict(members: &mut Vec<(Cow<'_, str>, usize)>) {
    let n = members.len();
    let repeats = if n <= FEW_KEYS {
        (1..n).any(|i| members[..i].iter().any(|(k, _)| *k == members[i].0))
    } else {
        let mut seen = HashSet::with_capacity(n);
        !members.iter().all(|(k, _)| seen.insert(k.as_ref()))
    };
    if !repeats {
        return;
    }
    let mut dict: Vec<(Cow<'_, str>, usize)> = Vec::with_capacity(n);
    let mut place: HashMap<String, usize> = HashMap::with_capacity(n);
    for (key, at) in members.drain(..) {
        match place.get(key.as_ref()) {
            Some(&i) => dict[i].1 = at,
            None => {
                place.insert(key.clone().into_owned(), dict.len());
                dict.push((key, at));
            }
        }
    }
    *members = dict;
}

/// celery.utils.text.truncate: `s` cut to `maxlen` characters at its last space, then `...`,
/// when it has at least `maxlen` characters.
fn truncate(s: &str, maxlen: usize) -> Cow<'_, str> {
    // A character is at least a byte: shorter in bytes is shorter in characters.
    if maxlen == 0 || s.len() < maxlen {
        return Cow::Borrowed(s);
    }
    match s.char_indices().nth(maxlen) {
        // Fewer than maxlen + 1 characters: exactly maxlen is cut too, anything shorter not.
        None if s.chars().count() < maxlen => Cow::Borrowed(s),
        end => {
            let cut = &s[..end.map_or(s.len(), |(i, _)| i)];
            let head = cut.rsplit_once(' ').map_or(cut, |(h, _)| h);
            Cow::Owned(format!("{head}..."))
        }
    }
}

/// Python's `str()` of the number JSON writes as `n`: an integer as written (`-0` is `0`),
/// anything with a fraction or exponent as a float.
fn py_number(n: &str) -> Result<Cow<'_, str>, Unfit> {
    if n.bytes().any(|b| matches!(b, b'.' | b'e' | b'E')) {
        let f: f64 = n
            .parse()
            .map_err(|_| malformed(&format!("not a number: {n}")))?;
        return Ok(Cow::Owned(py_float(f)));
    }
    let digits = n.strip_prefix('-').unwrap_or(n);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(malformed(&format!("not a value: {n}")));
    }
    Ok(Cow::Borrowed(if n == "-0" { "0" } else { n }))
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
    let sci = format!("{:e}", f.abs()); // shortest round-trip digits: "1.2345e-7"
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let mut s = String::from(if f.is_sign_negative() { "-" } else { "" });
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
mod tests;
