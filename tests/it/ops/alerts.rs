//! The shipped alert rules (`deploy/prometheus/rules.yaml`, and its PrometheusRule copy
//! `deploy/prometheus-rules.yaml`): every alert opens its section of `docs/runbook.md`, promtool
//! accepts the rules, and their unit tests (`deploy/prometheus/rules_test.yaml`) fire every alert
//! and keep every one quiet when all is well. That the rules query only metrics a relay exports
//! is `queries.rs`.

use std::collections::HashMap;

use super::deploy::{manifests, repo_file};
use super::*;

pub(super) const RULES: &str = "deploy/prometheus/rules.yaml";
const RULES_TEST: &str = "deploy/prometheus/rules_test.yaml";
const RUNBOOK: &str = "docs/runbook.md";
/// Where every `runbook_url` points, followed by the alert's section anchor.
const RUNBOOK_URL: &str = "https://github.com/jobrelay/jobrelay/blob/main/docs/runbook.md#";

/// Every rule of the plain rules file.
pub(super) fn alert_rules() -> Vec<serde_json::Value> {
    let file = &manifests(RULES)[0];
    let rules: Vec<serde_json::Value> = file["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").iter().cloned())
        .collect();
    assert!(!rules.is_empty(), "{RULES} holds no rule");
    rules
}

/// Runs promtool (Debian's `prometheus` package, which `script/setup` installs; or `$PROMTOOL`) in
/// `dir`, with `input` on its standard input. A missing promtool fails the test: what it checks
/// would go unchecked.
pub(super) fn promtool(args: &[&str], dir: &Path, input: &str) -> String {
    use std::io::Write;
    let bin = std::env::var("PROMTOOL").unwrap_or_else(|_| "promtool".to_owned());
    let mut child = std::process::Command::new(&bin)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {bin} ({e}): install Debian's prometheus package \
                 (apt-get install prometheus; script/setup does) or set PROMTOOL"
            )
        });
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

/// GitHub's anchor of a heading: lowercase, punctuation other than `-` and `_` dropped, spaces
/// to `-`.
fn github_anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's headings (code blocks skipped; a repeated anchor gets `-1`,
/// `-2`, ... as on GitHub).
pub(super) fn anchors(markdown: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut in_code = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
        } else if !in_code && line.starts_with('#') {
            let base = github_anchor(line.trim_start_matches('#'));
            let n = seen.entry(base.clone()).or_insert(0);
            out.push(if *n == 0 { base } else { format!("{base}-{n}") });
            *n += 1;
        }
    }
    out
}

/// The text of the `## <heading>` section of `markdown`, up to the next `## `.
fn section<'a>(markdown: &'a str, heading: &str) -> Option<&'a str> {
    let start = markdown.find(&format!("\n## {heading}\n"))? + 1;
    let rest = &markdown[start + 3..];
    Some(&markdown[start..start + 3 + rest.find("\n## ").unwrap_or(rest.len())])
}

#[test]
fn every_alert_has_a_runbook_section() {
    let runbook = repo_file(RUNBOOK);
    let anchors = anchors(&runbook);
    let mut names = HashSet::new();
    for rule in alert_rules() {
        let name = rule["alert"]
            .as_str()
            .unwrap_or_else(|| panic!("not an alert: {rule}"));
        assert!(names.insert(name.to_owned()), "alert {name} twice");
        assert!(
            ["warning", "critical"].contains(&rule["labels"]["severity"].as_str().unwrap_or("")),
            "{name}: severity warning or critical"
        );
        let notes = &rule["annotations"];
        for key in ["summary", "description"] {
            assert!(
                notes[key].as_str().is_some_and(|s| !s.is_empty()),
                "{name}: no {key}"
            );
        }
        let url = notes["runbook_url"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: no runbook_url annotation"));
        let anchor = url
            .strip_prefix(RUNBOOK_URL)
            .unwrap_or_else(|| panic!("{name}: runbook_url {url} is not under {RUNBOOK_URL}"));
        assert!(
            anchors.iter().any(|a| a == anchor),
            "{name}: runbook_url {url}: no heading with anchor #{anchor} in {RUNBOOK}"
        );
        assert_eq!(
            anchor,
            github_anchor(name),
            "{name}: its section is named after it"
        );
        let text = section(&runbook, name).unwrap_or_else(|| panic!("no `## {name}` in {RUNBOOK}"));
        for part in [
            "**What it means.**",
            "**Confirm.**",
            "**What to do.**",
            "**What not to do.**",
        ] {
            assert!(text.contains(part), "{RUNBOOK}, {name}: no {part}");
        }
    }
    // No section for an alert that no longer exists.
    for line in runbook
        .lines()
        .filter_map(|l| l.strip_prefix("## Jobrelay"))
    {
        let name = format!("Jobrelay{line}");
        assert!(
            names.contains(&name),
            "{RUNBOOK} has a section for {name}, which is no alert"
        );
    }
}

/// Every link of the runbook to a section of the docs finds its heading.
#[test]
fn the_runbooks_links_resolve() {
    let runbook = repo_file(RUNBOOK);
    let mut checked = 0;
    for (i, _) in runbook.match_indices("](") {
        let rest = &runbook[i + 2..];
        let target = &rest[..rest.find(')').expect("a link ends")];
        if target.starts_with("http") {
            continue;
        }
        let (file, anchor) = target.split_once('#').unwrap_or((target, ""));
        let text = if file.is_empty() {
            runbook.clone()
        } else {
            repo_file(&format!("docs/{file}"))
        };
        if !anchor.is_empty() {
            assert!(
                anchors(&text).iter().any(|a| a == anchor),
                "{RUNBOOK}: link {target}: no such heading"
            );
        }
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} links");
    assert!(
        anchors("## a: b.c (d)\n## a: b.c (d)\n# `x` y_z\n") == ["a-bc-d", "a-bc-d-1", "x-y_z"]
    );
}

/// The PrometheusRule is the plain rules file wrapped for the Prometheus Operator.
#[test]
fn the_prometheus_rule_carries_the_plain_rules_file() {
    let cr = &manifests("deploy/prometheus-rules.yaml")[0];
    assert_eq!(cr["kind"], "PrometheusRule");
    assert_eq!(cr["apiVersion"], "monitoring.coreos.com/v1");
    let plain = &manifests(RULES)[0];
    assert_eq!(
        plain.as_object().unwrap().keys().collect::<Vec<_>>(),
        ["groups"],
        "{RULES} holds groups only"
    );
    assert!(
        cr["spec"] == *plain,
        "deploy/prometheus-rules.yaml's spec differs from {RULES}: edit both together"
    );
}

/// `promtool check rules` and `promtool test rules`; the unit tests see every alert fire once and
/// stay quiet once.
#[test]
fn promtool_checks_the_rules_and_their_unit_tests_pass() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/prometheus");
    let checked = promtool(&["check", "rules", "rules.yaml"], &dir, "");
    let n = alert_rules().len();
    assert!(
        checked.contains(&format!("SUCCESS: {n} rules found")),
        "{checked}"
    );
    let tested = promtool(&["test", "rules", "rules_test.yaml"], &dir, "");
    assert!(tested.contains("SUCCESS"), "{tested}");

    let tests = &manifests(RULES_TEST)[0];
    assert_eq!(tests["rule_files"], serde_json::json!(["rules.yaml"]));
    let cases: Vec<&serde_json::Value> = tests["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().into_iter().flatten())
        .collect();
    for rule in alert_rules() {
        let name = &rule["alert"];
        let of_it = || cases.iter().filter(|c| c["alertname"] == *name);
        let fires =
            |c: &&&serde_json::Value| c["exp_alerts"].as_array().is_some_and(|a| !a.is_empty());
        assert!(
            of_it().any(|c| fires(&c)),
            "{RULES_TEST}: no test fires {name}"
        );
        assert!(
            of_it().any(|c| !fires(&c)),
            "{RULES_TEST}: no test keeps {name} quiet"
        );
    }
}
