//! An application that only produces jobs depends on the library without the daemon.

use std::process::Command;

/// Crates only the daemon needs.
const DAEMON_ONLY: [&str; 6] = [
    "axum",
    "clap",
    "toml",
    "metrics-exporter-prometheus",
    "tracing-subscriber",
    "hyper-util",
];

fn tree(manifest: &str, extra: &[&str]) -> String {
    let out = Command::new(env!("CARGO"))
        .args(["tree", "--offline", "-e", "normal", "--prefix", "none"])
        .args(["--manifest-path", manifest])
        .args(extra)
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

fn crates_in(tree: &str) -> Vec<&str> {
    tree.lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect()
}

#[test]
fn the_example_producer_crate_pulls_in_nothing_of_the_daemon() {
    let manifest = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/producer-crate/Cargo.toml"
    );
    let producer = tree(manifest, &[]);
    let crates = crates_in(&producer);
    assert!(crates.contains(&"jobrelay"), "{producer}");
    for name in DAEMON_ONLY {
        assert!(
            !crates.contains(&name),
            "the producer crate pulls in {name}:\n{producer}"
        );
    }
    // The same check sees them in the daemon's own build.
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let daemon = tree(root, &["-p", "jobrelay"]);
    for name in DAEMON_ONLY {
        assert!(
            crates_in(&daemon).contains(&name),
            "{name} not in the daemon's tree"
        );
    }
}
