//! Building jobs: defaults, every field, delays, refusals naming the field, traceparent.

use super::*;

#[test]
fn builder_defaults_and_every_field() {
    let job = JobBuilder::new("default", "ProcessThing").build().unwrap();
    assert_eq!(job.uuid.get_version_num(), 4, "generated uuids are v4");
    assert!(job.payload.is_empty());
    assert_eq!(
        (
            job.parent_uuid,
            job.predecessor_uuid,
            job.dead_parent,
            job.run_at
        ),
        (None, None, false, None)
    );
    assert!(job.headers.is_empty());

    let uuid = Uuid::new_v4();
    let parent = Uuid::new_v4();
    let pred = Uuid::new_v4();
    let at = DateTime::from_timestamp(2_000_000_000, 123_456_789).unwrap();
    let job = JobBuilder::new("q.1:x-y_z", "Resize")
        .uuid(uuid)
        .json(&serde_json::json!({ "id": 7, "name": "x" }))
        .parent(parent)
        .predecessor(pred)
        .dead_parent(true)
        .run_at(at)
        .header("tenant", "acme")
        .headers([("a", "1"), ("b", "2")])
        .build()
        .unwrap();
    assert_eq!(job.uuid, uuid);
    assert_eq!(job.queue, "q.1:x-y_z");
    assert_eq!(job.job_type, "Resize");
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&job.payload).unwrap(),
        serde_json::json!({ "id": 7, "name": "x" })
    );
    assert_eq!(job.parent_uuid, Some(parent));
    assert_eq!(job.predecessor_uuid, Some(pred));
    assert!(job.dead_parent);
    // Kept to the microsecond: what Postgres stores, so both paths marshal the same bytes.
    assert_eq!(
        job.run_at,
        Some(DateTime::from_timestamp(2_000_000_000, 123_456_000).unwrap())
    );
    assert_eq!(job.headers.len(), 3);

    let raw = JobBuilder::new("default", "Raw")
        .payload(vec![0u8, 159, 255])
        .build()
        .unwrap();
    assert_eq!(raw.payload, vec![0u8, 159, 255]);
}

#[test]
fn a_delay_becomes_run_at() {
    let before = Utc::now();
    let job = JobBuilder::new("default", "Later")
        .delay(Duration::from_secs(90))
        .build()
        .unwrap();
    let after = Utc::now();
    let run_at = job.run_at.unwrap();
    assert!(run_at >= before + chrono::TimeDelta::seconds(90) - chrono::TimeDelta::microseconds(1));
    assert!(run_at <= after + chrono::TimeDelta::seconds(90));
    let now = JobBuilder::new("default", "Now")
        .delay(Duration::ZERO)
        .build()
        .unwrap();
    assert_eq!(now.run_at, None, "a zero delay means no run_at");
}

#[test]
fn invalid_input_is_refused_when_built_naming_the_field() {
    let own = Uuid::new_v4();
    let mut bad_map = std::collections::HashMap::new();
    bad_map.insert((1, 2), 3);
    let cases: Vec<(&str, JobBuilder)> = vec![
        ("queue", JobBuilder::new("", "T")),
        ("queue", JobBuilder::new("has space", "T")),
        ("queue", JobBuilder::new("q".repeat(129), "T")),
        ("job_type", JobBuilder::new("q", "")),
        ("job_type", JobBuilder::new("q", "x".repeat(257))),
        ("job_type", JobBuilder::new("q", "nul\0inside")),
        ("uuid", JobBuilder::new("q", "T").uuid(Uuid::nil())),
        ("payload", JobBuilder::new("q", "T").json(&bad_map)),
        ("parent_uuid", JobBuilder::new("q", "T").parent(Uuid::nil())),
        (
            "parent_uuid",
            JobBuilder::new("q", "T").uuid(own).parent(own),
        ),
        (
            "predecessor_uuid",
            JobBuilder::new("q", "T").uuid(own).predecessor(own),
        ),
        (
            "run_at",
            JobBuilder::new("q", "T").run_at("+10000-01-01T00:00:00Z".parse().unwrap()),
        ),
        ("run_at", JobBuilder::new("q", "T").delay(Duration::MAX)),
        ("headers", JobBuilder::new("q", "T").header("", "x")),
        ("headers", JobBuilder::new("q", "T").header("k", "v\0")),
    ];
    for (field, builder) in cases {
        let shown = format!("{builder:?}");
        let e = builder.build().expect_err(&shown);
        assert_eq!(e.class(), ErrorClass::Permanent);
        assert!(e.to_string().contains(field), "{e}");
        assert_eq!(field_of(e), field, "{shown}");
    }
}

#[test]
fn add_refuses_a_uuid_twice_and_add_all_is_all_or_nothing() {
    let mut jobs = Producer::default().pending();
    let uuid = jobs.add(JobBuilder::new("default", "A")).unwrap();
    assert_eq!(
        field_of(
            jobs.add(JobBuilder::new("default", "B").uuid(uuid))
                .unwrap_err()
        ),
        "uuid"
    );
    let e = jobs
        .add_all(vec![
            JobBuilder::new("default", "C"),
            JobBuilder::new("bad queue", "D"),
        ])
        .unwrap_err();
    assert_eq!(field_of(e), "queue");
    assert_eq!(jobs.len(), 1, "a refused add_all adds nothing");
    let twice = Uuid::new_v4();
    let e = jobs
        .add_all(vec![
            JobBuilder::new("default", "E").uuid(twice),
            JobBuilder::new("default", "F").uuid(twice),
        ])
        .unwrap_err();
    assert_eq!(field_of(e), "uuid");
    assert_eq!(jobs.len(), 1);
    // A hand-made Job goes through the same checks.
    let mut job = JobBuilder::new("default", "G").build().unwrap();
    job.queue = "no spaces".into();
    assert_eq!(field_of(jobs.add(job).unwrap_err()), "queue");
}

#[cfg(feature = "otel")]
#[test]
fn traceparent_comes_from_the_current_span() {
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
    };
    let sc = SpanContext::new(
        TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
        SpanId::from_hex("00f067aa0ba902b7").unwrap(),
        TraceFlags::SAMPLED,
        true,
        TraceState::from_key_value([("vendor", "abc")]).unwrap(),
    );
    let cx = opentelemetry::Context::new().with_remote_span_context(sc);

    let outside = JobBuilder::new("default", "T").build().unwrap();
    assert!(
        !outside.headers.contains_key("traceparent"),
        "no span, no header"
    );

    let explicit = JobBuilder::new("default", "T")
        .trace_context(&cx)
        .build()
        .unwrap();
    {
        let _attached = cx.clone().attach();
        let inside = JobBuilder::new("default", "T").build().unwrap();
        for job in [&inside, &explicit] {
            assert_eq!(
                job.headers["traceparent"],
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
            );
            assert_eq!(job.headers["tracestate"], "vendor=abc");
        }
        let own = JobBuilder::new("default", "T")
            .header("traceparent", "mine")
            .build()
            .unwrap();
        assert_eq!(
            own.headers["traceparent"], "mine",
            "an explicit header wins"
        );
    }
    let after = JobBuilder::new("default", "T").build().unwrap();
    assert!(!after.headers.contains_key("traceparent"));
}

/// `sidekiq_args`: the payload is Sidekiq's `args`, a JSON array; anything else, or an array
/// nested deeper than Sidekiq's JSON parser takes, is refused naming `payload`.
#[test]
fn sidekiq_args_are_a_json_array() {
    #[derive(serde::Serialize)]
    struct Order {
        id: u64,
        note: &'static str,
    }
    let job = JobBuilder::new("default", "ChargeJob")
        .sidekiq_args(&(42, "é\"", Order { id: 7, note: "x" }, None::<u8>))
        .build()
        .unwrap();
    assert_eq!(
        String::from_utf8(job.payload).unwrap(),
        r#"[42,"é\"",{"id":7,"note":"x"},null]"#
    );
    let job = JobBuilder::new("default", "NoArgs")
        .sidekiq_args(&[0u8; 0])
        .build()
        .unwrap();
    assert_eq!(job.payload, b"[]");

    let deep = (0..jobrelay::broker::layout::SIDEKIQ_MAX_ARGS_DEPTH)
        .fold(serde_json::json!(1), |v, _| serde_json::json!([v]));
    assert!(JobBuilder::new("q", "T")
        .sidekiq_args(&deep)
        .build()
        .is_ok());
    let too_deep = serde_json::json!([deep]);
    for (builder, says) in [
        (
            JobBuilder::new("q", "T").sidekiq_args(&serde_json::json!({"id": 1})),
            "an object, not an array",
        ),
        (
            JobBuilder::new("q", "T").sidekiq_args(&42),
            "a number, not an array",
        ),
        (
            JobBuilder::new("q", "T").sidekiq_args("x"),
            "a string, not an array",
        ),
        (
            JobBuilder::new("q", "T").sidekiq_args(&too_deep),
            "levels deep",
        ),
    ] {
        let e = builder.build().unwrap_err();
        assert!(e.to_string().contains(says), "{e}");
        assert_eq!(field_of(e), "payload");
    }
}
