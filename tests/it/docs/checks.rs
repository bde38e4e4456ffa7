//! The blocks checked without running them: Rust (identical to a file CI compiles), TOML (a
//! configuration file the relay loads, or a Cargo manifest fragment), JSON, and the syntax of
//! other languages' snippets.

use std::io::Write;
use std::process::{Command, Stdio};

use clap::Parser;
use jobrelay::config::cli::Cli;
use jobrelay::config::Config;

use super::blocks::{root, Block, Kind};

/// Checks `block`, which is not run in a session.
pub fn check(block: &Block) -> Result<(), String> {
    match &block.kind {
        Kind::Rust => same_as_compiled(block),
        Kind::Toml => match &block.same_as {
            Some(path) => manifest_fragment(block, path),
            None => config_file(block),
        },
        Kind::Json => serde_json::Deserializer::from_str(&block.body)
            .into_iter::<serde_json::Value>()
            .try_for_each(|v| v.map(drop))
            .map_err(|e| format!("not JSON: {e}")),
        Kind::Syntax(lang) => syntax(lang, &block.body),
        Kind::Text | Kind::NoRun => Ok(()),
        Kind::Unknown(info) => Err(format!(
            "unknown fence info string {info:?} (docs/README.md#code-blocks lists the known \
             ones; mark a block that cannot run with `no-run`)"
        )),
        Kind::Sh | Kind::Sql => unreachable!("run in a session"),
    }
}

/// The files CI compiles as examples: `examples/*.rs`, `examples/*/main.rs`, and the
/// `[[example]]` paths of Cargo.toml.
fn compiled_examples() -> Vec<String> {
    let manifest: toml::Table = std::fs::read_to_string(root().join("Cargo.toml"))
        .expect("Cargo.toml")
        .parse()
        .expect("Cargo.toml parses");
    let mut paths: Vec<String> = manifest
        .get("example")
        .and_then(|e| e.as_array())
        .into_iter()
        .flatten()
        .filter_map(|e| e.get("path").and_then(|p| p.as_str()).map(str::to_owned))
        .collect();
    for entry in std::fs::read_dir(root().join("examples")).expect("examples/") {
        let name = entry
            .expect("an entry")
            .file_name()
            .to_string_lossy()
            .into_owned();
        if name.ends_with(".rs") {
            paths.push(format!("examples/{name}"));
        } else if root().join("examples").join(&name).join("main.rs").exists() {
            paths.push(format!("examples/{name}/main.rs"));
        }
    }
    paths
}

fn same_as_compiled(block: &Block) -> Result<(), String> {
    let Some(path) = &block.same_as else {
        return Err("a rust block needs `file=PATH`: an example that CI compiles".into());
    };
    if !compiled_examples().contains(path) {
        return Err(format!("{path} is not an example that CI compiles"));
    }
    let file = std::fs::read_to_string(root().join(path)).map_err(|e| format!("{path}: {e}"))?;
    if file != block.body {
        let differs = file
            .lines()
            .zip(block.body.lines())
            .position(|(a, b)| a != b)
            .map_or("in length".to_owned(), |i| {
                format!("from its line {}", i + 1)
            });
        return Err(format!("differs from {path} {differs}"));
    }
    Ok(())
}

/// `value` without its `path` keys, at any depth (a checkout's location differs).
fn without_paths(value: &toml::Value) -> toml::Value {
    match value {
        toml::Value::Table(t) => toml::Value::Table(
            t.iter()
                .filter(|(k, _)| k.as_str() != "path")
                .map(|(k, v)| (k.clone(), without_paths(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn manifest_fragment(block: &Block, path: &str) -> Result<(), String> {
    let parse = |text: &str, what: &str| {
        text.parse::<toml::Table>()
            .map_err(|e| format!("{what} is not TOML: {e}"))
    };
    let fragment = parse(&block.body, "the block")?;
    let text = std::fs::read_to_string(root().join(path)).map_err(|e| format!("{path}: {e}"))?;
    let manifest = parse(&text, path)?;
    for (table, value) in &fragment {
        let theirs = manifest.get(table).map(without_paths);
        if theirs.as_ref() != Some(&without_paths(value)) {
            return Err(format!(
                "[{table}] differs from {path}'s (a `path` key aside)"
            ));
        }
    }
    Ok(())
}

fn config_file(block: &Block) -> Result<(), String> {
    let mut file = tempfile::NamedTempFile::new().expect("a temporary file");
    file.write_all(block.body.as_bytes()).expect("write");
    let path = file.path().to_str().expect("a UTF-8 path");
    let cli = Cli::try_parse_from(["jobrelay", "--config", path]).expect("flags parse");
    Config::resolve(&cli.flags, &|_| None)
        .map(drop)
        .map_err(|e| format!("the relay refuses it as a --config file: {e}"))
}

/// Compiles a Lua block with Redis's own Lua (`loadstring`, so nothing of it runs).
fn lua(body: &str) -> Result<(), String> {
    const COMPILE: &str = "local f, err = loadstring(ARGV[1]) if f then return 'ok' end return err";
    let client = redis::Client::open(crate::common::redis_url()).expect("a Redis URL");
    let mut con = client.get_connection().expect("redis reachable");
    let answer: String = redis::cmd("EVAL")
        .arg(COMPILE)
        .arg(0)
        .arg(body)
        .query(&mut con)
        .expect("EVAL runs");
    match answer.as_str() {
        "ok" => Ok(()),
        error => Err(format!("Redis's Lua finds a syntax error: {error}")),
    }
}

fn syntax(lang: &str, body: &str) -> Result<(), String> {
    if lang == "lua" {
        return lua(body);
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join(format!("block.{lang}"));
    std::fs::write(&file, body).expect("write");
    let (program, args): (&str, Vec<&str>) = match lang {
        "python" => (
            "python3",
            vec!["-c", "import ast, sys; ast.parse(open(sys.argv[1]).read())"],
        ),
        "ruby" => ("ruby", vec!["-c"]),
        "js" => ("node", vec!["--check"]),
        other => unreachable!("no syntax check for {other}"),
    };
    let out = Command::new(program)
        .args(args)
        .arg(&file)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{program} could not run: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} finds a syntax error: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}
