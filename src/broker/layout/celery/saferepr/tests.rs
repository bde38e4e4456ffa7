use super::*;

fn repr(json: &str) -> String {
    let mut out = String::new();
    saferepr(json, &mut out).unwrap();
    out
}

/// Each checked against celery 5.7's `saferepr(json.loads(...), 1024)`.
#[test]
fn reprs_as_celery_does() {
    let cases = [
        (r#"[]"#, "[]"),
        (
            r#"[1, -17, 1.0, 1e5, 1.5E-7, 1e16, 123.456, 0.0001, -0.0, -0, 12345678901234567890123, 1e400]"#,
            "[1, -17, 1.0, 100000.0, 1.5e-07, 1e+16, 123.456, 0.0001, -0.0, 0, 12345678901234567890123, inf]",
        ),
        (
            r#"["it's", "a\"b", "\u00e9\n"]"#,
            "['it\\'s', 'a\"b', '\u{e9}\n']",
        ),
        (
            r#"[[[[1]]], {"a": {"b": {"c": 1}}}]"#,
            "[[[[...]]], {'a': {'b': {...}}}]",
        ),
        (r#"[[], [[]], [[[]]], [[[[]]]]]"#, "[[], [[]], [[[...]]], [[[...]]]]"),
        (r#"{"z": 1, "a": 2, "z": 3}"#, "{'z': 3, 'a': 2}"),
        (r#" { "a" : [ true , false , null ] } "#, "{'a': [True, False, None]}"),
    ];
    for (json, want) in cases {
        assert_eq!(repr(json), want, "{json}");
    }
}

/// At 1,024 characters, each checked against celery 5.7: a value cut at its last space
/// (or where the limit falls), `, ...` at the first token after the limit but a closing,
/// and the closings of the containers still open.
#[test]
fn cuts_as_celery_does() {
    let x = |n: usize| "x".repeat(n);
    let words = "word ".repeat(300);
    let cases = [
        // The cut value is the last of its container: closed, no `, ...`.
        (format!(r#"["{}"]"#, x(1030)), format!("['{}...']", x(1023))),
        (format!(r#"["{}"]"#, x(1021)), format!("['{}']", x(1021))),
        // Cut at a space; the list after it is not shown, nor its closing.
        (
            format!(r#"["{words}", [1, 2]]"#),
            format!("['{}...', ...]", vec!["word"; 204].join(" ")),
        ),
        (
            format!(r#"["{}", [1, 2], 3]"#, x(1030)),
            format!("['{}...', ...]", x(1023)),
        ),
        // Closings right after the limit, then `, ...` before the next element.
        (
            format!(r#"[[["{}"]], 1]"#, x(1030)),
            format!("[[['{}...']], ...]", x(1021)),
        ),
        (
            format!(r#"[[["{}"]]]"#, x(1030)),
            format!("[[['{}...']]]", x(1021)),
        ),
        // Opened containers close; the too-deep one after the limit is not shown.
        (
            format!(r#"["{}", [[[1]]], [[[2]]]]"#, x(1017)),
            format!("['{}', [[, ...]]]", x(1017)),
        ),
        // The limit reached by `, `: the next value is not shown.
        (
            format!(r#"["{}", 1]"#, x(1019)),
            format!("['{}', , ...]", x(1019)),
        ),
        // Numbers and keys are cut like strings.
        (
            format!(r#"["{}", 123456789]"#, "y".repeat(1015)),
            format!("['{}', 1234...]", "y".repeat(1015)),
        ),
        (
            format!(r#"{{"{}": 1, "b": 2}}"#, "k".repeat(1030)),
            format!("{{'{}...', ...}}", "k".repeat(1023)),
        ),
        // Characters, not bytes; an escaped quote counts as two.
        (
            format!(r#"["{}"]"#, "é".repeat(1030)),
            format!("['{}...']", "é".repeat(1023)),
        ),
        (
            format!(r#"["{}", 1]"#, "'".repeat(600)),
            format!("['{}', ...]", "\\'".repeat(600)),
        ),
    ];
    for (json, want) in cases {
        assert_eq!(repr(&json), want, "{json}");
    }
    let many = format!(
        "[{}]",
        (0..400)
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let shown: Vec<String> = (0..226).map(|i| i.to_string()).collect();
    assert_eq!(repr(&many), format!("[{}, 226..., ...]", shown.join(", ")));
}

#[test]
fn a_repeated_key_keeps_its_first_place_and_last_value() {
    // Pair by pair, and (over FEW_KEYS keys) by a set.
    assert_eq!(repr(r#"{"a": 1, "b": 2, "\u0061": 3}"#), "{'a': 3, 'b': 2}");
    let keys: Vec<String> = (0..20).map(|i| format!("\"k{i}\": {i}")).collect();
    let json = format!("{{{}, \"k3\": \"last\"}}", keys.join(", "));
    let want: Vec<String> = (0..20)
        .map(|i| match i {
            3 => "'k3': 'last'".to_owned(),
            _ => format!("'k{i}': {i}"),
        })
        .collect();
    assert_eq!(repr(&json), format!("{{{}}}", want.join(", ")));
}

#[test]
fn text_that_is_not_json_is_refused() {
    for bad in [
        "",
        "[",
        "[1,",
        "[1 2]",
        "{\"a\" 1}",
        "{1: 2}",
        "[tru]",
        "[\"a]",
        "[\"\\ud800\"]",
    ] {
        let mut out = String::new();
        assert!(saferepr(bad, &mut out).is_err(), "{bad:?}: {out}");
    }
}
