//! The README and docs/**/*.md as a reader uses them: every fenced code block runs, or is
//! compiled, compared, parsed or syntax-checked, by its info string; every relative link and
//! `#anchor` resolves. The rules: docs/README.md#code-blocks.

pub(crate) mod blocks;
mod checks;
mod links;
mod session;

use std::path::Path;

use self::blocks::{doc_files, root, Block, Kind};
use self::session::Session;

/// Checks every block of `file` (relative to the root, its text `text`): `file:line: why` for
/// each failure; the `no-run` blocks as `file:line`; how many blocks ran.
async fn check_file(file: &Path, text: &str) -> (Vec<String>, Vec<String>, usize) {
    let blocks = blocks::parse(file, text);
    let mut failures = Vec::new();
    let mut no_run = Vec::new();
    let mut session: Option<Session> = None;
    // After a failed sh or sql block, the file's later ones are skipped: they build on it.
    let mut session_failed = false;
    for block in &blocks {
        let result = match block.kind {
            Kind::Sh | Kind::Sql if session_failed => continue,
            Kind::Sh | Kind::Sql => {
                if session.is_none() {
                    session = Some(Session::start(&blocks::directives(text)).await);
                }
                let r = session.as_mut().expect("started").run(block).await;
                session_failed = r.is_err();
                r
            }
            Kind::NoRun => {
                no_run.push(block.at());
                Ok(())
            }
            _ => checks::check(block),
        };
        if let Err(why) = result {
            failures.push(format!("{}: {why}", block.at()));
        }
    }
    let ran = session.as_ref().map_or(0, Session::blocks_run);
    if let Some(s) = session {
        s.finish().await;
    }
    (failures, no_run, ran)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_code_block_of_the_readme_and_docs_runs() {
    let mut failures = Vec::new();
    let mut no_run = Vec::new();
    let mut ran = 0;
    for file in doc_files() {
        let text = std::fs::read_to_string(root().join(&file)).expect("the file");
        let (f, n, r) = check_file(&file, &text).await;
        failures.extend(f);
        no_run.extend(n);
        ran += r;
    }
    // Few, and each says why in its text (docs/README.md#code-blocks).
    eprintln!(
        "{ran} blocks ran; not run ({}): {}",
        no_run.len(),
        no_run.join(", ")
    );
    assert!(ran >= 5, "the quickstart's blocks ran ({ran} blocks)");
    assert!(no_run.len() <= 8, "too many no-run blocks: {no_run:?}");
    assert!(failures.is_empty(), "\n{}", failures.join("\n\n"));
}

/// The docs' subfolders are read too: docs/layouts/ has a page per runner.
#[test]
fn the_pages_of_docs_subfolders_are_checked() {
    let files = doc_files();
    for page in [
        "README",
        "algorithm",
        "markers",
        "jobrelay",
        "conveyor",
        "sidekiq",
        "celery",
        "bullmq",
        "rq",
    ] {
        let path = Path::new("docs/layouts").join(format!("{page}.md"));
        assert!(files.contains(&path), "{} not in {files:?}", path.display());
    }
}

/// The worker tests read their SQL from the runner pages (common::exactly_once::doc_sql): each
/// page still holds the block after the heading or comment they name.
#[test]
fn the_runner_pages_hold_the_sql_the_worker_tests_run() {
    use crate::common::exactly_once::doc_sql;
    for (page, marker) in [
        ("celery.md", "\n## From a Django app"),
        ("bullmq.md", "\n## Producing a BullMQ job"),
        ("rq.md", "\n## Producing an RQ job"),
        ("sidekiq.md", "<!-- sidekiq-insert -->"),
        ("README.md", "<!-- shard-insert -->"),
    ] {
        let sql = doc_sql(page, marker);
        assert!(
            sql.trim_start().starts_with("INSERT INTO pending_jobs"),
            "{page}: {sql}"
        );
    }
}

#[test]
fn every_relative_link_and_anchor_of_the_readme_and_docs_resolves() {
    let broken: Vec<String> = doc_files().iter().flat_map(|f| links::broken(f)).collect();
    assert!(broken.is_empty(), "\n{}", broken.join("\n"));
}

/// The harness can fail, and says where: a file of broken blocks, each named by its line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_block_fails_with_its_file_and_line() {
    let text = "# T\n\n```sh\ntrue\n```\n\n```sql\nSELECT * FROM things;\n```\n\n\
                ```cobol\nDISPLAY 'HI'.\n```\n\n```json\n{\"a\": }\n```\n\n\
                ```rust file=examples/things.rs\nfn main() {}\n```\n\n```sh no-run\nsleep 1d\n```\n\n\
                ```lua\nreturn 1 +\n```\n";
    let (failures, no_run, ran) = check_file(Path::new("T.md"), text).await;
    let lines: Vec<&str> = failures
        .iter()
        .map(|f| f.split(": ").next().unwrap())
        .collect();
    assert_eq!(
        lines,
        ["T.md:7", "T.md:11", "T.md:15", "T.md:19", "T.md:27"],
        "{failures:#?}"
    );
    assert!(
        failures[0].contains(r#"relation "things" does not exist"#),
        "{}",
        failures[0]
    );
    assert!(failures[1].contains("cobol"), "{}", failures[1]);
    assert!(
        failures[3].contains("differs from examples/things.rs"),
        "{}",
        failures[3]
    );
    assert!(failures[4].contains("syntax error"), "{}", failures[4]);
    assert_eq!(no_run, ["T.md:23"]);
    assert_eq!(ran, 2);

    // A block that leaves a process behind fails too, and the process is gone.
    let text = "```sh\nsleep 300 &\n```\n";
    let (failures, _, _) = check_file(Path::new("U.md"), text).await;
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert!(
        failures[0].starts_with("U.md:1: left processes running"),
        "{failures:?}"
    );
}

#[test]
fn anchors_follow_githubs_rules() {
    let text = "# Replicas: `--redis-wait-replicas`\n## What *each* layout costs\n\
                ## Keys\n## Keys\n### The [`jobrelay_up`](x.md) gauge\n<a id=\"own\"></a>\n\
                ```sh\n# not a heading\n```\n";
    assert_eq!(
        links::anchors(text),
        [
            "replicas---redis-wait-replicas",
            "what-each-layout-costs",
            "keys",
            "keys-1",
            "the-jobrelay_up-gauge",
            "own"
        ]
    );
    let targets = links::targets("[a](b.md#c) `[x](y)` [d]: e.md\n```\n[f](g)\n```\n");
    assert_eq!(targets, [(1, "b.md#c".to_owned())]);
    let targets = links::targets("[d]: e.md#f\n");
    assert_eq!(targets, [(1, "e.md#f".to_owned())]);
}

/// The README's rust block is the example itself (not a paraphrase of it).
#[test]
fn the_readme_names_the_producer_example_it_shows() {
    let text = std::fs::read_to_string(root().join("README.md")).unwrap();
    let blocks: Vec<Block> = blocks::parse(Path::new("README.md"), &text);
    let rust: Vec<&Block> = blocks.iter().filter(|b| b.kind == Kind::Rust).collect();
    assert_eq!(rust.len(), 1);
    assert_eq!(
        rust[0].same_as.as_deref(),
        Some("examples/producer-crate/src/main.rs")
    );
}

/// The README's first block gives the two commands of a fresh machine (the relay, the tests),
/// and its test command is the one CI runs: .ci/run's last command, verbatim, a program of the
/// repository.
#[test]
fn the_readmes_test_command_is_the_one_ci_runs() {
    use std::os::unix::fs::PermissionsExt;

    fn commands(text: &str) -> Vec<&str> {
        text.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect()
    }
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let blocks = blocks::parse(Path::new("README.md"), &readme);
    assert_eq!(blocks[0].kind, Kind::NoRun, "{}", blocks[0].at());
    let first = commands(&blocks[0].body);
    assert_eq!(
        first.len(),
        2,
        "{}: the relay, the tests: {first:?}",
        blocks[0].at()
    );
    let test = first[1];

    let ci = std::fs::read_to_string(root().join(".ci/run")).unwrap();
    assert_eq!(
        commands(&ci).last(),
        Some(&test),
        ".ci/run ends with the README's test command"
    );

    let program = root().join(test.split_whitespace().next().unwrap());
    let mode = std::fs::metadata(&program).unwrap().permissions().mode();
    assert!(mode & 0o111 != 0, "{} is not executable", program.display());
}
