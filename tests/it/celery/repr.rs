//! argsrepr and kwargsrepr (the short reprs of a task's arguments in its message headers) are
//! what celery makes of them, on random payloads.

use super::*;
use crate::common::random_json::{RandomJson, Space};

/// argsrepr and kwargsrepr, the relay's against celery's own: 3,000 random payloads (nesting,
/// repeated keys, quotes, escapes, non-ASCII, integers and floats of every form, sizes on both
/// sides of the 1,024-character limit), each encoded by the layout and given to celery 5's
/// `AMQP.as_task_v2` with the args and kwargs `json.loads` reads from it.
#[test]
fn argsrepr_and_kwargsrepr_are_celerys() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(19);
    let cases: Vec<(String, String)> = (0..3000)
        .map(|_| {
            let size = [4, 40, 400, 1500][rng.random_range(0..4)];
            let args = JSON.container(&mut rng, b'[', 0, size);
            let kwargs = JSON.container(&mut rng, b'{', 0, size);
            (args, kwargs)
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cases.json");
    std::fs::write(&path, serde_json::to_string(&cases).unwrap()).unwrap();
    let script = scripts::py(
        &[("PATH", json!(path.display().to_string()))],
        include_str!("as_task_v2.py"),
    );
    let out = crate::common::celery::python(&script);
    let celerys: Vec<(String, String)> = serde_json::from_str(&out).unwrap();
    assert_eq!(celerys.len(), cases.len());
    let layout = LayoutKind::Celery.layout();
    let mut cut = 0;
    for ((args, kwargs), want) in cases.iter().zip(&celerys) {
        let job = JobBuilder::new("q", "t")
            .payload(format!(r#"{{"args": {args}, "kwargs": {kwargs}}}"#))
            .build()
            .unwrap();
        let mut buf = Vec::new();
        layout.encode(&job, &mut buf).unwrap();
        let message: Value = serde_json::from_slice(&buf).unwrap();
        let got = (
            message["headers"]["argsrepr"].as_str().unwrap().to_owned(),
            message["headers"]["kwargsrepr"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
        assert_eq!(&got, want, "args {args}\nkwargs {kwargs}");
        cut += usize::from(want.0.chars().count() > 1000 || want.1.chars().count() > 1000);
    }
    eprintln!("{cut} of {} cut at the limit", cases.len());
    // The limit was met often enough to mean something.
    assert!(cut > 300, "{cut} cut");
}

/// The payloads' parts: numbers of every form Python's json reads (huge integers, `1e400` as
/// infinity), strings with escapes and non-ASCII.
const JSON: RandomJson = RandomJson {
    numbers: &[
        "0",
        "-0",
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
        "12345678901234567890123",
        "5e-324",
        "1e400",
    ],
    pieces: &[
        "a",
        "b",
        "word",
        " ",
        " ",
        "'",
        "\\\"",
        "\\\\",
        "\\n",
        "\\t",
        "\\/",
        "é",
        "\\u00e9",
        "😀",
        "\\ud83d\\ude00",
        "\\u0027",
        "ü",
        "x",
    ],
    space: Space::AroundItems,
};
