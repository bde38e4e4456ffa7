//! What the binary says: the guarantee in the same words in `--help` and the docs, each
//! subcommand's own options first in its help, and a missing outbox table in one line that
//! names `jobrelay migrate` (docs/cli.md).

use super::*;

/// The guarantee as docs/guarantees.md#delivery words it.
const GUARANTEE: &str = "at least once, and exactly once per uuid while its dedup marker lives";

/// `--help` and the docs state the guarantee in the same words, and nothing the user reads
/// claims "exactly once per uuid" without its window.
#[tokio::test]
async fn the_guarantee_reads_the_same_in_help_and_docs() {
    let (code, help, _) = run_relay(&["--help"], &[]).await;
    assert_eq!(code, 0);
    assert!(help.contains(GUARANTEE), "{help}");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let guarantees = std::fs::read_to_string(root.join("docs/guarantees.md")).unwrap();
    let guarantees = guarantees.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        guarantees.contains(&format!("**{GUARANTEE}**")),
        "docs/guarantees.md#delivery"
    );
    let mut texts = vec![("--help".to_owned(), help)];
    // The README, docs/**/*.md (as the docs test finds them) and the configuration's sources.
    let mut paths: Vec<_> = crate::docs::blocks::doc_files()
        .into_iter()
        .map(|p| root.join(p))
        .collect();
    for entry in std::fs::read_dir(root.join("src/config")).unwrap() {
        paths.push(entry.unwrap().path());
    }
    for path in paths {
        texts.push((
            path.display().to_string(),
            std::fs::read_to_string(&path).unwrap(),
        ));
    }
    for (name, text) in texts {
        // One line of prose at a time, joined where a sentence wraps.
        let prose = text.replace('\n', " ").replace("///", " ");
        let prose = prose.split_whitespace().collect::<Vec<_>>().join(" ");
        for (at, _) in prose.match_indices("exactly once per uuid") {
            let rest = &prose[at..(at + 80).min(prose.len())];
            assert!(
                rest.contains("while"),
                "{name} claims exactly once without its window: {rest:?}"
            );
        }
    }
}

/// A subcommand's help lists its own options before the shared ones, which come under
/// headings of their own.
#[tokio::test]
async fn subcommand_help_shows_its_own_options_first() {
    for (args, own) in [
        (&["dead-letter", "list", "--help"][..], "--queue <QUEUE>"),
        (&["dead-letter", "requeue", "--help"][..], "--id <ID>"),
        (&["status", "--help"][..], "--json"),
        (&["peek", "--help"][..], "--scheduled"),
    ] {
        let (code, help, _) = run_relay(args, &[]).await;
        assert_eq!(code, 0, "{args:?}");
        let at = |needle: &str| {
            help.find(needle)
                .unwrap_or_else(|| panic!("{args:?}: no {needle:?} in\n{help}"))
        };
        assert!(at(own) < at("Connection options:"), "{args:?}:\n{help}");
        assert!(at("Connection options:") < at("Relay options:"), "{help}");
        assert!(at("Relay options:") < at("--batch-size"), "{help}");
        assert!(at("Connection options:") < at("--database-url"), "{help}");
    }
}

/// `status` and `dead-letter` on a database without the outbox (or without its dead letters):
/// one line naming the missing relation and `jobrelay migrate`, exit 1.
#[sqlx::test(migrations = false)]
async fn a_missing_table_is_one_line_naming_migrate(pool: PgPool) {
    let db = database_url_of(&pool).await;
    let env = [("DATABASE_URL", db.as_str())];
    let one_line = |code: i32, err: &str, relation: &str| {
        assert_eq!(code, 1, "{err}");
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "one line: {err}");
        assert!(
            lines[0].starts_with(&format!("jobrelay: relation \"{relation}"))
                && lines[0].contains("run `jobrelay migrate`"),
            "{err}"
        );
    };
    for args in [
        &["status"][..],
        &["status", "--json"],
        &["dead-letter", "list"],
        &["dead-letter", "requeue", "--all"],
        &["dead-letter", "purge", "--id", "7"],
    ] {
        let (code, out, err) = run_relay(args, &env).await;
        assert_eq!(out, "", "{args:?}");
        // The outbox's or its dead letters', whichever the command reads first.
        one_line(code, &err, "pending_jobs");
    }
    // The outbox without its dead letters: the one missing is named.
    sqlx::query("CREATE TABLE pending_jobs (id bigint, queue text, created_at timestamptz)")
        .execute(&pool)
        .await
        .unwrap();
    let (code, _, err) = run_relay(&["status"], &env).await;
    one_line(code, &err, "pending_jobs_dead\" does not exist");
    let (code, _, err) = run_relay(&["dead-letter", "list"], &env).await;
    one_line(code, &err, "pending_jobs_dead\" does not exist");
}

/// `--help`'s `--dedup-ttl` names the marker of every layout, as docs/layouts/markers.md and
/// the runners' pages do (a key of its own, or a member of a set), not one layout's.
#[tokio::test]
async fn the_dedup_ttl_help_names_every_layouts_marker() {
    let (code, help, err) = run_relay(&["--help"], &[]).await;
    assert_eq!(code, 0, "{err}");
    let line = help
        .lines()
        .find(|l| l.trim_start().starts_with("--dedup-ttl"))
        .unwrap_or_else(|| panic!("{help}"));
    for marker in [
        "<ns>jobs:<uuid> (jobrelay)",
        "<ns>jobrelay:job:<uuid> (conveyor)",
        "<ns>jobrelay:sidekiq:<uuid> (sidekiq)",
        "<ns>jobrelay:celery:<uuid> (celery)",
        "<ns>jobrelay:bullmq:marks:<ttl>:<interval>:<digit> (bullmq)",
        "<ns>jobrelay:rq:marks:<ttl>:<interval>:<digit> (rq)",
    ] {
        assert!(line.contains(marker), "{marker:?} not in {line}");
    }
    assert!(!line.contains("`jobs:<uuid>`"), "{line}");
}
