//! Every query of the shipped dashboard and alert rules names a metric a running relay exports:
//! a relay relays jobs of every outcome, refuses one and dead-letters two, and each selector of
//! each query must find its metric in that relay's `/metrics`, with the label values it selects
//! (`kind="transient"`, `dependency="redis"`), and group only by labels the metrics carry or
//! Prometheus adds to a target. A histogram's `_bucket`, `_sum` and `_count` are looked up as
//! the exposition writes them. The scrape also passes `promtool check metrics`.

use super::alerts::{alert_rules, promtool, RULES};
use super::dashboard::dashboard_queries;
use super::metrics::{insert_one_row_per_outcome, scrape_once_gauges_caught_up};
use super::promql::read;
use super::*;

/// Labels Prometheus gives every series of a target (the Prometheus Operator's among them).
const TARGET_LABELS: &[&str] = &[
    "job",
    "instance",
    "pod",
    "namespace",
    "service",
    "container",
    "endpoint",
];

/// A scrape as metric name to the label sets of its series.
fn exported(m: &Metrics) -> BTreeMap<String, Vec<BTreeMap<String, String>>> {
    let mut out: BTreeMap<String, Vec<BTreeMap<String, String>>> = BTreeMap::new();
    for series in m.samples.keys() {
        let (name, rest) = series.split_once('{').unwrap_or((series, "}"));
        let mut labels = BTreeMap::new();
        // The exposition's label values here hold no `",` (outcomes, kinds, `le` bounds).
        for pair in rest
            .trim_end_matches('}')
            .split("\",")
            .filter(|p| !p.is_empty())
        {
            let (k, v) = pair
                .split_once("=\"")
                .unwrap_or_else(|| panic!("series {series}"));
            labels.insert(k.to_owned(), v.trim_end_matches('"').to_owned());
        }
        out.entry(name.to_owned()).or_default().push(labels);
    }
    out
}

/// What is wrong with `expr` against the scrape, if anything.
fn problems(expr: &str, scraped: &BTreeMap<String, Vec<BTreeMap<String, String>>>) -> Vec<String> {
    let q = read(expr);
    let mut out = Vec::new();
    if q.selectors.is_empty() {
        out.push("names no metric".to_owned());
    }
    let mut carried: HashSet<&str> = TARGET_LABELS.iter().copied().collect();
    for s in &q.selectors {
        let Some(series) = scraped.get(&s.name) else {
            out.push(format!("{} is not exported", s.name));
            continue;
        };
        carried.extend(series.iter().flat_map(|l| l.keys().map(String::as_str)));
        for m in s.matchers.iter().filter(|m| !m.value.contains('$')) {
            let found = |l: &BTreeMap<String, String>| match m.op.as_str() {
                "=" => l
                    .get(&m.label)
                    .map_or(m.value.is_empty(), |v| *v == m.value),
                _ => l.contains_key(&m.label) || TARGET_LABELS.contains(&m.label.as_str()),
            };
            if !series.iter().any(found) {
                out.push(format!(
                    "no series {}{{{}{}{:?}}}",
                    s.name, m.label, m.op, m.value
                ));
            }
        }
    }
    for l in q.labels.iter().filter(|l| !carried.contains(l.as_str())) {
        out.push(format!("groups by {l}, which none of its metrics carries"));
    }
    out
}

#[sqlx::test]
async fn every_dashboard_and_alert_query_names_an_exported_metric(pool: PgPool) {
    let mut queries = dashboard_queries();
    for rule in alert_rules() {
        let expr = rule["expr"].as_str().expect("expr").to_owned();
        queries.push((format!("{RULES}: {}", rule["alert"]), expr));
    }
    assert!(queries.len() >= 20, "{} queries", queries.len());

    let ns = Namespace::new();
    insert_one_row_per_outcome(&pool, &ns).await;
    let db = database_url_of(&pool).await;
    let mut d = Daemon::start(
        &["--max-attempts", "2", "--poll-interval", "200ms"],
        &[
            ("DATABASE_URL", &db),
            ("REDIS_URL", &ns.url),
            ("JOBRELAY_NAMESPACE", &ns.prefix),
        ],
    );
    // Every outcome relayed, the poison job refused twice and dead-lettered with the invalid
    // row, the backlog and horizon gauges sampled.
    wait_until(
        "every row relayed or dead-lettered",
        Duration::from_secs(30),
        || async {
            let (pending, _, dead) = rows_state(&pool).await;
            pending == 1 && dead == 2
        },
    )
    .await;
    scrape_once_gauges_caught_up(&d).await;
    wait_until(
        "the xmin horizon sampled",
        Duration::from_secs(15),
        || async {
            d.metrics()
                .await
                .try_get("jobrelay_xmin_horizon_age_xids")
                .is_some()
        },
    )
    .await;
    let m = d.metrics().await;
    // What Prometheus scrapes passes its own lint (names, units, help texts, types).
    let lint = promtool(&["check", "metrics"], Path::new("."), &m.text);
    assert!(lint.trim().is_empty(), "promtool check metrics:\n{lint}");
    let mut scraped = exported(&m);
    assert_eq!(d.terminate(Duration::from_secs(30)).await, Some(0));
    // The jobrelay layout's runner records no consumers: a relay in the sidekiq layout, with a
    // Sidekiq process's heartbeat for its queue, exports jobrelay_queue_consumers.
    let side = sidekiq_side(&pool, &ns).await;
    let lint = promtool(&["check", "metrics"], Path::new("."), &side.text);
    assert!(lint.trim().is_empty(), "promtool check metrics:\n{lint}");
    for (name, series) in exported(&side) {
        scraped.entry(name).or_default().extend(series);
    }
    let mut wrong = Vec::new();
    for (place, expr) in &queries {
        for p in problems(expr, &scraped) {
            wrong.push(format!("{place}: {p}\n    {expr}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "queries a relay cannot answer:\n{}\n\nthe relay exports: {:?}",
        wrong.join("\n"),
        scraped.keys().collect::<Vec<_>>()
    );
}

/// The metrics of a relay in the sidekiq layout that fed queue `watched`, read by a Sidekiq
/// process (its heartbeat written as Sidekiq writes it), once it sampled the queue's Redis side.
async fn sidekiq_side(pool: &PgPool, ns: &Namespace) -> Metrics {
    let mut con = ns.con().await;
    let beat = chrono::Utc::now().timestamp() as f64;
    let () = redis::pipe()
        .cmd("SADD")
        .arg(ns.key("processes"))
        .arg("host:1:abc")
        .cmd("HSET")
        .arg(ns.key("host:1:abc"))
        .arg("info")
        .arg(r#"{"queues":["watched"]}"#)
        .arg("beat")
        .arg(beat)
        .query_async(&mut con)
        .await
        .unwrap();
    sqlx::query("DELETE FROM pending_jobs")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO pending_jobs (queue, job_type, payload) VALUES ('watched', 'W', '[1]')",
    )
    .execute(pool)
    .await
    .unwrap();
    let db = database_url_of(pool).await;
    let mut d = Daemon::start(
        &["--layout", "sidekiq"],
        &[
            ("DATABASE_URL", &db),
            ("REDIS_URL", &ns.url),
            ("JOBRELAY_NAMESPACE", &ns.prefix),
        ],
    );
    d.wait_ready(Duration::from_secs(30)).await;
    let series = "jobrelay_queue_consumers{queue=\"watched\"}";
    wait_until(
        "the queue's consumers sampled",
        Duration::from_secs(30),
        || async { d.metrics().await.try_get(series) == Some(1.0) },
    )
    .await;
    let m = d.metrics().await;
    assert_eq!(d.terminate(Duration::from_secs(30)).await, Some(0));
    m
}
