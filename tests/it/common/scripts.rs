//! Programs for a runner's own client or API (Node, Python, Ruby), kept as files beside the
//! tests that run them (`include_str!`), and given their parameters as constants prepended to
//! them: numbers, strings and arrays of them, written as JSON (which these languages read as
//! their own literals).

use serde_json::Value;

/// `script` (JavaScript) after a `const NAME = <value>;` line per constant.
pub fn js(constants: &[(&str, Value)], script: &str) -> String {
    let mut out: String = constants
        .iter()
        .map(|(name, value)| format!("const {name} = {value};\n"))
        .collect();
    out.push_str(script);
    out
}

/// `script` (Python or Ruby) after a `NAME = <value>` line per constant.
pub fn py(constants: &[(&str, Value)], script: &str) -> String {
    let mut out: String = constants
        .iter()
        .map(|(name, value)| {
            assert!(
                !matches!(value, Value::Bool(_) | Value::Null),
                "{name}: {value}"
            );
            format!("{name} = {value}\n")
        })
        .collect();
    out.push_str(script);
    out
}
