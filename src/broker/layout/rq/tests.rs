use super::super::test_job;
use super::*;
use std::collections::BTreeMap;
use std::io::Read as _;

fn job(payload: &str) -> Job {
    Job {
        created_at: DateTime::from_timestamp(1_700_000_000, 654_321_000).unwrap(),
        ..test_job("emails", "app.tasks.send_welcome", payload.as_bytes())
    }
}

fn encoded(j: &Job) -> Vec<Vec<u8>> {
    let mut buf = Vec::new();
    Rq::encode_fields(j, &mut buf).unwrap();
    fields(&buf).iter().map(|f| f.to_vec()).collect()
}

fn unzip(z: &[u8]) -> String {
    // A reader of our own would prove nothing: check the stream's framing by hand and
    // its checksum against the data.
    assert_eq!(&z[..2], &[0x78, 0x01]);
    let mut out = Vec::new();
    let mut at = 2;
    loop {
        let last = z[at] & 1 == 1;
        assert_eq!(z[at] >> 1, 0, "stored block");
        let len = u16::from_le_bytes([z[at + 1], z[at + 2]]) as usize;
        let nlen = u16::from_le_bytes([z[at + 3], z[at + 4]]) as usize;
        assert_eq!(len, !nlen & 0xffff);
        out.extend_from_slice(&z[at + 5..at + 5 + len]);
        at += 5 + len;
        if last {
            break;
        }
    }
    let mut sum = [0u8; 4];
    (&z[at..]).read_exact(&mut sum).unwrap();
    assert_eq!(u32::from_be_bytes(sum), adler32(&out));
    assert_eq!(at + 4, z.len());
    String::from_utf8(out).unwrap()
}

/// What `Queue('emails', serializer=JSONSerializer).enqueue('app.tasks.send_welcome', 42,
/// 'x', lang='de')` writes (RQ 2.12.0): data `["app.tasks.send_welcome", null, [42, "x"],
/// {"lang": "de"}]`, description `app.tasks.send_welcome(42, 'x', lang='de')`.
#[test]
fn writes_what_rq_writes() {
    let f = encoded(&job(r#"{"args": [42, "x"], "kwargs": {"lang": "de"}}"#));
    assert_eq!(f[0], b"2023-11-14T22:13:20.654321Z");
    assert_eq!(
        unzip(&f[1]),
        r#"["app.tasks.send_welcome", null, [42, "x"], {"lang": "de"}]"#
    );
    assert_eq!(f[2], b"app.tasks.send_welcome(42, 'x', lang='de')");
    assert_eq!(f.len(), 3);
}

#[test]
fn an_array_is_the_args_and_headers_are_the_meta() {
    let mut j = job(r#" [1, 2.50, {"b": 1, "a": [true, null]}] "#);
    j.headers = BTreeMap::from([
        ("traceparent".to_owned(), "00-ab".to_owned()),
        ("a\"b".to_owned(), "é".to_owned()),
    ]);
    let f = encoded(&j);
    assert_eq!(
        unzip(&f[1]),
        r#"["app.tasks.send_welcome", null, [1, 2.50, {"b": 1, "a": [true, null]}], {}]"#
    );
    // The description, framed ("\0<its length>:") with the meta after it.
    let description = "app.tasks.send_welcome(1, 2.5, {'b': 1, 'a': [True, None]})";
    let meta = r#"{"a\"b": "é", "traceparent": "00-ab"}"#;
    assert_eq!(
        String::from_utf8(f[2].clone()).unwrap(),
        format!("\0{}:{description}{meta}", description.len())
    );
}

/// A job's options ride on the description argument, after the description (the option's, if
/// it gives one); options that leave RQ's defaults (nulls, `at_front: false`, an empty meta or
/// description) encode as no options; a misfit is refused.
#[test]
fn options_follow_the_description() {
    let with = |options: serde_json::Value| {
        let mut j = job("[1]");
        j.options = serde_json::from_value(options).unwrap();
        j
    };
    let f = encoded(&with(
        serde_json::json!({"description": "mine", "at_front": true}),
    ));
    assert_eq!(f[2], b"\x004:mine\0L");
    let f = encoded(&with(serde_json::json!({"ttl": 60})));
    let call = "app.tasks.send_welcome(1)";
    assert_eq!(
        String::from_utf8(f[2].clone()).unwrap(),
        format!("\0{}:{call}\0F\0ttl\x0060", call.len())
    );
    let plain = encoded(&job("[1]"));
    let defaults = serde_json::json!({
        "at_front": false, "meta": {}, "description": "", "timeout": null, "retry": null,
    });
    assert_eq!(encoded(&with(defaults)), plain);
    let e = RQ
        .encode(&with(serde_json::json!({"ttl": 0})), &mut Vec::new())
        .unwrap_err();
    assert!(e.0.starts_with("option \"ttl\" for the rq layout"), "{e}");
}

#[test]
fn description_cuts_and_sorts_as_get_call_string() {
    let long = "y".repeat(100);
    let mut out = String::new();
    description(
        "f",
        &format!(r#"["{long}"]"#),
        r#"{"z": 1, "b": [1, 2], "a": "x", "b": 3}"#,
        &mut out,
    )
    .unwrap();
    assert_eq!(
        out,
        format!("f('{}..., a='x', b=3, z=1)", &format!("'{long}")[1..75])
    );
    let mut out = String::new();
    description("f", "[]", "{}", &mut out).unwrap();
    assert_eq!(out, "f()");
    let mut out = String::new();
    description("f", "[]", r#"{"k": null}"#, &mut out).unwrap();
    assert_eq!(out, "f(k=None)");
}

#[test]
fn utcformat_writes_what_the_pattern_writes() {
    let pattern = |t: DateTime<Utc>| t.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string();
    let mut times: Vec<DateTime<Utc>> = [
        (1_700_000_000, 654_321_987),
        (0, 0),
        (-62_135_596_800, 1_000),       // 0001-01-01
        (253_402_300_799, 999_999_999), // 9999-12-31T23:59:59
        (253_402_300_800, 5_000),       // year 10000: chrono's own form
        (-62_198_755_200, 0),           // year -1
        (951_782_400, 123_000),         // 2000-02-29
    ]
    .into_iter()
    .map(|(s, n)| DateTime::from_timestamp(s, n).unwrap())
    .collect();
    // A leap second (nanoseconds past 1e9).
    times.push(DateTime::from_timestamp(1_483_228_799, 1_500_000_000).unwrap());
    for t in times {
        let mut buf = Vec::new();
        utcformat(t, &mut buf);
        assert_eq!(String::from_utf8(buf).unwrap(), pattern(t), "{t:?}");
    }
}

#[test]
fn zlib_framing_of_long_and_empty_data() {
    for n in [0, 1, 0xffff, 0x10000, 200_000] {
        let data: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
        let mut z = Vec::new();
        zlib_stored(&data, &mut z);
        // The known checksum of the empty input is 1.
        if n == 0 {
            assert_eq!(&z[z.len() - 4..], &[0, 0, 0, 1]);
        }
        assert_eq!(unzip_bytes(&z), data);
    }
}

fn unzip_bytes(z: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut at = 2;
    loop {
        let last = z[at] & 1 == 1;
        let len = u16::from_le_bytes([z[at + 1], z[at + 2]]) as usize;
        out.extend_from_slice(&z[at + 5..at + 5 + len]);
        at += 5 + len;
        if last {
            break;
        }
    }
    out
}

#[test]
fn rows_that_do_not_fit() {
    for (payload, why) in [
        ("", "not JSON"),
        ("\"x\"", "not \"x\""),
        ("42", "not 42"),
        ("{\"args\": {}}", "\"args\" is not an array"),
        ("{\"kwargs\": []}", "\"kwargs\" is not an object"),
        ("{\"args\": [], \"kwarg\": {}}", "unknown field `kwarg`"),
    ] {
        let mut buf = Vec::new();
        let e = RQ.encode(&job(payload), &mut buf).unwrap_err();
        assert!(
            e.0.contains(why) && e.0.contains("rq layout"),
            "{payload:?}: {e}"
        );
    }
    let mut j = job("[]");
    j.payload = vec![b'[', 0xff, b']'];
    assert!(RQ
        .encode(&j, &mut Vec::new())
        .unwrap_err()
        .0
        .contains("UTF-8"));
    let mut j = job("[]");
    j.predecessor_uuid = Some(j.uuid);
    let e = RQ.encode(&j, &mut Vec::new()).unwrap_err().0;
    assert!(
        e.contains("no flows") && e.contains("predecessor_uuid"),
        "{e}"
    );
    let mut j = job("[]");
    j.parent_uuid = Some(j.uuid);
    assert!(RQ
        .encode(&j, &mut Vec::new())
        .unwrap_err()
        .0
        .contains("parent_uuid"));
}

#[test]
fn keys() {
    assert!(RQ.marks_in_sets());
    assert_eq!(RQ.marker_infix(), "jobrelay:rq:");
    assert_eq!(RQ.queue_key("", "emails"), "rq:queue:emails");
    assert_eq!(RQ.queue_key("x:", "emails"), "x:rq:queue:emails");
}
