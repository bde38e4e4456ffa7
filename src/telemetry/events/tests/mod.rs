//! Every event, emitted under a subscriber and a recorder of its own: it writes exactly the log
//! lines and updates exactly the metrics the contract (docs/metrics.md) gives it.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;
use serde_json::Value;
use uuid::Uuid;

use super::*;
use crate::error::{Dependency, Error, ErrorClass, Reason};
use crate::job::Outcome;
use crate::report::Report;
use crate::table::TableName;
use crate::telemetry::events::Horizon;

/// What one event wrote: its log lines (JSON) and the series it set, by name and labels.
struct Emitted {
    logs: Vec<Value>,
    series: BTreeMap<String, f64>,
}

#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Runs `emit` with a JSON subscriber at DEBUG and a Prometheus recorder of its own (this
/// thread only).
fn emitted(emit: impl FnOnce()) -> Emitted {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let buffer = Buffer::default();
    let writer = buffer.clone();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_max_level(tracing::Level::DEBUG)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, || metrics::with_local_recorder(&recorder, emit));
    let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
    let logs = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let series = handle
        .render()
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter(|l| !l.contains("quantile="))
        .map(|l| {
            let (s, v) = l.rsplit_once(' ').unwrap();
            (s.to_owned(), v.parse().unwrap())
        })
        .collect();
    Emitted { logs, series }
}

/// One event and what it must write: `(level, message)` per log line, `(series, value)` per
/// metric (histograms by their `_count` and `_sum`).
struct Case {
    event: &'static str,
    emit: Box<dyn FnOnce()>,
    logs: Vec<(&'static str, &'static str)>,
    series: Vec<(&'static str, f64)>,
}

fn case(
    event: &'static str,
    emit: impl FnOnce() + 'static,
    logs: &[(&'static str, &'static str)],
    series: &[(&'static str, f64)],
) -> Case {
    Case {
        event,
        emit: Box::new(emit),
        logs: logs.to_vec(),
        series: series.to_vec(),
    }
}

mod cases;
use cases::*;

/// An event that forgets its log line or its metric, or writes one it should not, fails here.
#[test]
fn every_event_writes_its_log_lines_and_its_metrics() {
    let mut wrong = Vec::new();
    for c in [
        push_failed_cases(),
        batch_cases(),
        dependency_cases(),
        backlog_cases(),
    ]
    .into_iter()
    .flatten()
    {
        let out = emitted(c.emit);
        let logs: Vec<(String, String)> = out
            .logs
            .iter()
            .map(|l| {
                (
                    l["level"].as_str().unwrap().to_owned(),
                    l["message"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        let want: Vec<(String, String)> = c
            .logs
            .iter()
            .map(|(l, m)| (l.to_string(), m.to_string()))
            .collect();
        if logs != want {
            wrong.push(format!("{}: logged {logs:?}, not {want:?}", c.event));
        }
        let want: BTreeMap<String, f64> =
            c.series.iter().map(|(s, v)| (s.to_string(), *v)).collect();
        if out.series != want {
            wrong.push(format!("{}: set {:?}, not {want:?}", c.event, out.series));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// One batch's answer: every outcome but `late` counted, every failure by kind and reason, and
/// the refusal logged once with the per-job count.
#[test]
fn a_batch_answer_counts_outcomes_and_failures_and_logs_refusals_once() {
    let mut outcomes = [0; Outcome::ALL.len()];
    outcomes[Outcome::Queued.index()] = 5;
    outcomes[Outcome::Duplicate.index()] = 1;
    outcomes[Outcome::Late.index()] = 1;
    let mut failures = Failures::default();
    failures.add(ErrorClass::PerJob, Reason::Other, 2);
    failures.add(ErrorClass::Transient, Reason::Timeout, 1);
    failures.add(ErrorClass::Transient, Reason::OutOfMemory, 2);
    failures.add(ErrorClass::Permanent, Reason::Other, 1);
    let out = emitted(|| {
        BatchAnswered {
            outcomes: &outcomes,
            failures: &failures,
            first_refusal: Some("WRONGTYPE"),
        }
        .emit()
    });
    let f = |kind: &str, reason: &str| {
        format!("jobrelay_job_failures_total{{kind=\"{kind}\",reason=\"{reason}\"}}")
    };
    let want: BTreeMap<String, f64> = [
        (
            "jobrelay_jobs_relayed_total{outcome=\"queued\"}".to_owned(),
            5.0,
        ),
        (
            "jobrelay_jobs_relayed_total{outcome=\"duplicate\"}".to_owned(),
            1.0,
        ),
        (f("per_job", "error"), 2.0),
        (f("transient", "timeout"), 1.0),
        (f("transient", "out of memory"), 2.0),
        (f("permanent", "error"), 1.0),
    ]
    .into();
    assert_eq!(out.series, want);
    assert_eq!(out.logs.len(), 1, "{:?}", out.logs);
    assert_eq!(
        out.logs[0]["message"],
        "jobs refused by redis; kept for retry"
    );
    assert_eq!(out.logs[0]["refused"], 2);
    assert_eq!(out.logs[0]["first_error"], "WRONGTYPE");

    // No refusal, no log line.
    let mut failures = Failures::default();
    failures.add(ErrorClass::Transient, Reason::Unreachable, 4);
    let out = emitted(|| {
        BatchAnswered {
            outcomes: &[0; Outcome::ALL.len()],
            failures: &failures,
            first_refusal: None,
        }
        .emit()
    });
    assert!(out.logs.is_empty(), "{:?}", out.logs);
    assert_eq!(out.series[&f("transient", "unreachable")], 4.0);
}

/// The error of an outage is scrubbed of registered secrets by the event itself.
#[test]
fn a_dependency_down_event_scrubs_its_error() {
    crate::telemetry::redact::register("Ev3nt-S3cret");
    let out = emitted(|| {
        DependencyDown {
            dependency: Dependency::Redis,
            reason: Reason::Authentication,
            error: &"WRONGPASS for Ev3nt-S3cret",
            was_up: true,
        }
        .emit()
    });
    let line = out.logs[0].to_string();
    assert!(!line.contains("Ev3nt-S3cret"), "{line}");
    assert_eq!(out.logs[0]["reason"], "authentication failed");
    assert_eq!(out.logs[0]["dependency"], "redis");
}
