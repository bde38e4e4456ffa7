//! The job hash's `description` and `data` are what RQ makes of them, on random payloads.

use super::*;
use crate::common::random_json::{RandomJson, Space};

/// The job hash's `description` and `data`, the relay's against RQ's own: 2,000 random payloads
/// (nesting, repeated keys, quotes, escapes, non-ASCII and non-printable characters, numbers of
/// every form, values on both sides of the 75-character cut) enqueued in the rq layout, then
/// read by RQ 2.12's Python: `data` through `zlib.decompress` and `json.loads`, the description
/// against `rq.utils.get_call_string(func, args, kwargs, max_length=75)`.
#[tokio::test]
async fn descriptions_and_data_are_what_rq_makes_of_them() {
    use rand::{Rng, SeedableRng};
    let ns = Namespace::new();
    let enqueuer = rq_enqueuer(&ns);
    let mut con = ns.con().await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(23);
    let mut jobs = Vec::new();
    let mut payloads = Vec::new();
    for _ in 0..2000 {
        let size = [4, 40, 200][rng.random_range(0..3)];
        let args = JSON.container(&mut rng, b'[', 0, size);
        let kwargs = JSON.container(&mut rng, b'{', 0, size);
        let payload = format!(r#"{{"args": {args}, "kwargs": {kwargs}}}"#);
        jobs.push(
            JobBuilder::new("desc", "app.tasks.f")
                .payload(payload.clone())
                .build()
                .unwrap(),
        );
        payloads.push(payload);
    }
    for r in enqueuer.enqueue_batch(&mut con, &jobs).await.unwrap() {
        assert_eq!(r.unwrap(), Outcome::Queued);
    }
    let ids: Vec<String> = jobs.iter().map(|j| j.uuid.to_string()).collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ids.json");
    std::fs::write(&path, serde_json::to_string(&(&ids, &payloads)).unwrap()).unwrap();
    let app = RqApp::new(&ns.url);
    let script = scripts::py(
        &[
            ("PATH", json!(path.display().to_string())),
            ("PREFIX", json!(ns.prefix)),
        ],
        include_str!("descriptions.py"),
    );
    let out = app.python(&script);
    let out: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(out["n"], 2000, "{out}");
    assert_eq!(out["nbad"], 0, "{out:#}");
}

/// The payloads' parts: numbers of every form (integers beyond 64 bits' reach and doubles'),
/// strings with escapes, non-ASCII and non-printable characters.
const JSON: RandomJson = RandomJson {
    numbers: &[
        "0",
        "7",
        "-17",
        "2.50",
        "-0.0",
        "0.1",
        "1e5",
        "1E-7",
        "1e16",
        "1.5e+16",
        "123456789.123",
        "1e-5",
        "0.0001",
        "9007199254740993",
        "-9223372036854775808",
        "18446744073709551615",
        "5e-324",
        "1e308",
    ],
    pieces: &[
        "a",
        "b",
        "word",
        " ",
        "'",
        "\\\"",
        "\\\\",
        "\\n",
        "\\t",
        "\\r",
        "\\/",
        "é",
        "\\u00e9",
        "😀",
        "\\ud83d\\ude00",
        "\\u0027",
        "ü",
        "x",
        "\\u0001",
        "\\u007f",
        "\\u00a0",
        "\\u00ad",
        "\\u0085",
        "\\u2028",
        "\\u200b",
        "\\ufeff",
        "\\u3000",
        "€",
        "日本",
    ],
    space: Space::BeforeItems,
};
