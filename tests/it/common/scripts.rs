//! Programs for a runner's own client or API (Node, Python, Ruby), kept as files beside the
//! tests that run them (`include_str!`), and given their parameters as constants prepended to
//! them: numbers, strings and arrays of them, written as JSON (which these languages read as
//! their own literals); and [`run`], which runs one.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

/// `script` (JavaScript) after a `const NAME = <value>;` line per constant.
pub fn js(constants: &[(&str, Value)], script: &str) -> String {
    let mut out: String = constants
        .iter()
        .map(|(name, value)| format!("const {name} = {value};\n"))
        .collect();
    out.push_str(script);
    out
}

/// `script` (Python or Ruby) after a `NAME = <value>` line per constant.
pub fn py(constants: &[(&str, Value)], script: &str) -> String {
    let mut out: String = constants
        .iter()
        .map(|(name, value)| {
            assert!(
                !matches!(value, Value::Bool(_) | Value::Null),
                "{name}: {value}"
            );
            format!("{name} = {value}\n")
        })
        .collect();
    out.push_str(script);
    out
}

/// Runs `interpreter` on `script`, written to `dir`/`name`, in `dir` with `env`, at most 30 s;
/// its standard output. Panics, with its standard error, if it fails.
pub fn run(
    interpreter: &Path,
    dir: &Path,
    env: &[(&'static str, String)],
    name: &str,
    script: &str,
) -> String {
    let path = dir.join(name);
    std::fs::write(&path, script).unwrap();
    let mut child = Command::new(interpreter)
        .arg(&path)
        .current_dir(dir)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{} starts: {e}", interpreter.display()));
    // Read while it runs: output beyond a pipe's buffer would stall it.
    let read = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = read(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = read(child.stderr.take().map(|p| Box::new(p) as _));
    let every = Duration::from_millis(20);
    let exited = super::poll_blocking(Duration::from_secs(30), every, || child.try_wait().unwrap());
    let Some(status) = exited else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{name} still running after 30 s");
    };
    let (stdout, stderr) = (stdout.join().unwrap(), stderr.join().unwrap());
    assert!(
        status.success(),
        "{name} failed: {status}\n{}",
        String::from_utf8_lossy(&stderr)
    );
    String::from_utf8(stdout).unwrap()
}
