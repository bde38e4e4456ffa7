//! The Grafana dashboard (`deploy/grafana/jobrelay.json`): a data source variable, the panels an
//! operator needs (drain rate, lag, pending rows, oldest pending and claimable age, failures by
//! kind and by reason, dead letters, dependency state), every metric of docs/metrics.md on a
//! panel, and every query valid PromQL (promtool). That its queries name metrics a relay exports
//! is `queries.rs`.

use super::alerts::promtool;
use super::deploy::repo_file;
use super::promql::read;
use super::*;

const DASHBOARD: &str = "deploy/grafana/jobrelay.json";
const DATASOURCE: &str = "${DS_PROMETHEUS}";

fn dashboard() -> serde_json::Value {
    serde_json::from_str(&repo_file(DASHBOARD)).unwrap_or_else(|e| panic!("{DASHBOARD}: {e}"))
}

/// The panels that show data (rows left out).
fn panels(d: &serde_json::Value) -> Vec<&serde_json::Value> {
    d["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| std::iter::once(p).chain(p["panels"].as_array().into_iter().flatten()))
        .filter(|p| p["type"] != "row")
        .collect()
}

/// Every PromQL query of the dashboard as `(where, expr)`: the panels' targets and the query
/// variables (`label_values(m, l)` read as `group by (l) (m)`).
pub(super) fn dashboard_queries() -> Vec<(String, String)> {
    let d = dashboard();
    let mut out = Vec::new();
    for p in panels(&d) {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().unwrap_or_default().to_owned();
            out.push((
                format!("{DASHBOARD}: panel {}, {}", p["title"], t["refId"]),
                expr,
            ));
        }
    }
    for v in d["templating"]["list"]
        .as_array()
        .expect("templating")
        .iter()
    {
        if v["type"] == "query" {
            let q = v["query"]["query"]
                .as_str()
                .or(v["query"].as_str())
                .unwrap_or_default();
            let args = q
                .strip_prefix("label_values(")
                .and_then(|r| r.strip_suffix(')'))
                .unwrap_or_else(|| {
                    panic!(
                        "variable {}: use label_values(metric, label): {q}",
                        v["name"]
                    )
                });
            let (metric, label) = args.rsplit_once(',').expect("label_values(metric, label)");
            let expr = format!("group by ({}) ({})", label.trim(), metric.trim());
            out.push((format!("{DASHBOARD}: variable {}", v["name"]), expr));
        }
    }
    out
}

/// The query with Grafana's variables replaced: intervals by `5m`, others by `.+`.
fn substituted(expr: &str) -> String {
    let mut out = expr.to_owned();
    for (var, value) in [
        ("$__rate_interval", "5m"),
        ("$__interval", "5m"),
        ("$__range", "5m"),
        ("${job}", ".+"),
        ("$job", ".+"),
    ] {
        out = out.replace(var, value);
    }
    assert!(!out.contains('$'), "a variable left in {out}");
    out
}

#[test]
fn the_dashboard_shows_what_an_operator_needs() {
    let d = dashboard();
    let vars = d["templating"]["list"].as_array().unwrap();
    let ds = vars
        .iter()
        .find(|v| v["name"] == "DS_PROMETHEUS")
        .expect("a DS_PROMETHEUS variable");
    assert_eq!(ds["type"], "datasource");
    assert_eq!(ds["query"], "prometheus");
    let mut ids = HashSet::new();
    let mut by_type: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for p in panels(&d) {
        let title = p["title"].as_str().expect("a title");
        assert!(
            ids.insert(p["id"].as_u64().expect("an id")),
            "{title}: id taken"
        );
        assert!(
            p["description"].as_str().is_some_and(|s| !s.is_empty()),
            "{title}: description"
        );
        let g = &p["gridPos"];
        assert!(
            g["x"].as_u64().unwrap() + g["w"].as_u64().unwrap() <= 24,
            "{title}: gridPos"
        );
        assert_eq!(p["datasource"]["uid"], DATASOURCE, "{title}");
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title}: no query");
        let mut refs = HashSet::new();
        for t in targets {
            assert_eq!(t["datasource"]["uid"], DATASOURCE, "{title}");
            assert!(
                refs.insert(t["refId"].as_str().unwrap()),
                "{title}: refId twice"
            );
            let expr = t["expr"].as_str().unwrap();
            by_type
                .entry(p["type"].as_str().unwrap().to_owned())
                .or_default()
                .push(expr.to_owned());
        }
    }
    let all: Vec<&String> = by_type.values().flatten().collect();
    let shows = |needles: &[&str]| all.iter().any(|e| needles.iter().all(|n| e.contains(n)));
    // Drain rate, lag, backlog, failures by kind and reason, dead letters, dependency state.
    assert!(
        shows(&["sum by (outcome) (rate(jobrelay_jobs_relayed_total"]),
        "drain rate"
    );
    assert!(
        shows(&[
            "histogram_quantile(0.99",
            "jobrelay_relay_lag_seconds_bucket"
        ]),
        "lag"
    );
    assert!(
        shows(&["max by (job) (jobrelay_pending_jobs"]),
        "pending rows"
    );
    assert!(
        shows(&["max by (job) (jobrelay_oldest_pending_age_seconds"]),
        "oldest age"
    );
    assert!(
        shows(&["sum by (kind) (rate(jobrelay_job_failures_total"]),
        "failures by kind"
    );
    assert!(
        shows(&["sum by (reason) (rate(jobrelay_job_failures_total"]),
        "failures by reason"
    );
    assert!(
        by_type["stat"]
            .iter()
            .any(|e| e.starts_with("max by (job) (jobrelay_oldest_claimable_age_seconds")),
        "the age the alerts watch, at a glance"
    );
    assert!(
        shows(&["jobrelay_dead_jobs"]) && shows(&["jobrelay_jobs_dead_lettered_total"]),
        "dead letters"
    );
    assert!(
        by_type["state-timeline"]
            .iter()
            .any(|e| e.starts_with("jobrelay_up{")),
        "dependency state"
    );
}

/// Every metric of the contract (docs/metrics.md) is on a panel; a histogram through its
/// `_bucket`, `_sum` or `_count`.
#[test]
fn every_metric_of_the_contract_is_on_a_panel() {
    let shown: HashSet<String> = dashboard_queries()
        .iter()
        .flat_map(|(_, e)| read(e).selectors)
        .map(|s| {
            let n = s.name.as_str();
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|x| n.strip_suffix(x));
            base.unwrap_or(n).to_owned()
        })
        .collect();
    let contract = repo_file("docs/metrics.md");
    let documented: Vec<&str> = contract
        .lines()
        .filter_map(|l| l.strip_prefix("| `jobrelay_"))
        .map(|l| &l[..l.find('`').unwrap()])
        .collect();
    assert!(documented.len() >= 12, "{documented:?}");
    for m in documented {
        assert!(
            shown.contains(&format!("jobrelay_{m}")),
            "jobrelay_{m} is on no panel of {DASHBOARD}"
        );
    }
}

/// Every query of the dashboard, its variables replaced, is one promtool parses (as a recording
/// rule of a scratch rules file).
#[test]
fn every_dashboard_query_is_valid_promql() {
    let queries = dashboard_queries();
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, (_, expr)) in queries.iter().enumerate() {
        let expr = serde_json::to_string(&substituted(expr)).unwrap();
        rules.push_str(&format!(
            "      - record: dashboard:query_{i}\n        expr: {expr}\n"
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    write_file(dir.path(), "dashboard.yaml", &rules);
    let out = promtool(&["check", "rules", "dashboard.yaml"], dir.path(), "");
    let n = queries.len();
    assert!(
        out.contains(&format!("SUCCESS: {n} rules found")),
        "{out}\n{rules}"
    );
    assert!(n >= 15, "{n} queries");
}
