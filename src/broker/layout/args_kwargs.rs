//! The payload of a Python runner's job (celery, rq): a JSON array of args, or an object
//! `{"args": [...], "kwargs": {...}}`, split into the args' and kwargs' JSON text as the row
//! wrote them (not re-encoded).

use serde::Deserialize;
use serde_json::value::RawValue;

use super::Unfit;

/// The object form of a payload.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ArgsKwargs<'a> {
    #[serde(borrow, default)]
    args: Option<&'a RawValue>,
    #[serde(borrow, default)]
    kwargs: Option<&'a RawValue>,
}

/// `args` and `kwargs` of a payload, as JSON text, or why it has none; `shape` says what the
/// layout needs and begins each reason.
pub(super) fn split_payload<'p>(
    payload: &'p [u8],
    shape: &str,
) -> Result<(&'p str, &'p str), Unfit> {
    let text = std::str::from_utf8(payload)
        .map_err(|e| Unfit(format!("{shape}; it is not UTF-8: {e}")))?;
    let raw: &RawValue =
        serde_json::from_str(text).map_err(|e| Unfit(format!("{shape}; it is not JSON: {e}")))?;
    let raw = raw
        .get()
        .trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\r'));
    match raw.as_bytes().first() {
        Some(b'[') => Ok((raw, "{}")),
        Some(b'{') => {
            let o: ArgsKwargs<'_> =
                serde_json::from_str(raw).map_err(|e| Unfit(format!("{shape}: {e}")))?;
            let args = o.args.map_or("[]", RawValue::get);
            let kwargs = o.kwargs.map_or("{}", RawValue::get);
            if !args.starts_with('[') {
                return Err(Unfit(format!("{shape}; \"args\" is not an array")));
            }
            if !kwargs.starts_with('{') {
                return Err(Unfit(format!("{shape}; \"kwargs\" is not an object")));
            }
            Ok((args, kwargs))
        }
        _ => Err(Unfit(format!(
            "{shape}, not {}",
            if raw.len() > 40 {
                format!("{}...", raw.chars().take(40).collect::<String>())
            } else {
                raw.to_owned()
            }
        ))),
    }
}
