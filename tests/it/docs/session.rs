//! The `sh` and `sql` blocks of one file, run in order as a reader would paste them: one
//! temporary directory, one fresh database with the schema, one fresh Redis namespace, this
//! build's `jobrelay` first on `PATH`; exported variables and the working directory carry over
//! from block to block. Everything the session created is removed at the end.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use sqlx::{Connection, Executor, PgConnection};

use super::blocks::{Block, Kind};
use crate::common;

/// How long one block may run.
const BLOCK_TIMEOUT: Duration = Duration::from_secs(180);

/// The session of one file.
pub struct Session {
    dir: tempfile::TempDir,
    admin_url: String,
    /// Databases to drop at the end: the fresh one, and the renamed ones.
    databases: Vec<String>,
    /// Redis namespaces to empty at the end.
    namespaces: Vec<String>,
    /// The file's `db=`/`ns=` names and their unique replacements.
    renames: Vec<(String, String)>,
    env: Vec<(String, String)>,
    blocks_run: usize,
}

/// `url` with its database replaced by `db`.
fn with_database(url: &str, db: &str) -> String {
    let mut u = url::Url::parse(url).expect("DATABASE_URL is a URL");
    u.set_path(&format!("/{db}"));
    u.to_string()
}

impl Session {
    /// A fresh database (migrated) and namespace, and the renames of `directives`.
    pub async fn start(directives: &[(String, String)]) -> Session {
        let admin_url = std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| jobrelay::defaults::DEFAULT_DATABASE_URL.to_owned());
        let tag = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
        let db = format!("jobrelay_docs_{tag}");
        let mut admin = PgConnection::connect(&admin_url).await.expect("postgres");
        admin
            .execute(format!("CREATE DATABASE {db}").as_str())
            .await
            .expect("CREATE DATABASE");
        let db_url = with_database(&admin_url, &db);
        let pool = sqlx::PgPool::connect(&db_url)
            .await
            .expect("the new database");
        jobrelay::db::migrate(&pool, &jobrelay::TableName::default())
            .await
            .expect("migrations");
        pool.close().await;
        let ns = format!("docs{tag}:");
        let mut s = Session {
            dir: tempfile::tempdir().expect("a temporary directory"),
            admin_url,
            databases: vec![db],
            namespaces: vec![ns.clone()],
            renames: Vec::new(),
            env: Vec::new(),
            blocks_run: 0,
        };
        for (key, name) in directives {
            let unique = match name.strip_suffix(':') {
                Some(base) => format!("{base}_{tag}:"),
                None => format!("{name}_{tag}"),
            };
            match key.as_str() {
                "db" => s.databases.push(unique.clone()),
                "ns" => s.namespaces.push(unique.clone()),
                other => panic!("unknown docs-test directive {other}={name}"),
            }
            s.renames.push((name.clone(), unique));
        }
        let bin = Path::new(common::relay_bin())
            .parent()
            .expect("the binary's directory");
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        s.env = vec![
            ("DATABASE_URL".into(), db_url),
            ("REDIS_URL".into(), common::redis_url()),
            ("JOBRELAY_NAMESPACE".into(), ns),
            ("PATH".into(), path),
        ];
        s
    }

    /// How many blocks ran.
    pub fn blocks_run(&self) -> usize {
        self.blocks_run
    }

    /// `text` with the file's names replaced by the session's.
    fn renamed(&self, text: &str) -> String {
        let mut longest_first = self.renames.clone();
        longest_first.sort_by_key(|(from, _)| std::cmp::Reverse(from.len()));
        let mut out = text.to_owned();
        for (i, (from, _)) in longest_first.iter().enumerate() {
            out = out.replace(from, &format!("\u{0}{i}\u{0}"));
        }
        for (i, (_, to)) in longest_first.iter().enumerate() {
            out = out.replace(&format!("\u{0}{i}\u{0}"), to);
        }
        out
    }

    /// The bash script that runs `block`: the session's state, then the block, then the
    /// state saved for the next block.
    fn script(&self, block: &Block) -> (PathBuf, String) {
        let n = self.blocks_run;
        let body = self.dir.path().join(format!("block{n}"));
        std::fs::write(&body, self.renamed(&block.body)).expect("write the block");
        let state = self.dir.path().join("state.sh");
        let run = match &block.kind {
            Kind::Sh => format!(". {}", q(&body)),
            Kind::Sql if has_parameters(&block.body) => {
                let stmt = self.renamed(block.body.trim().trim_end_matches(';'));
                std::fs::write(&body, format!("PREPARE docs_block AS {stmt};\n"))
                    .expect("write the statement");
                format!(
                    "psql \"$DATABASE_URL\" -X -q -v ON_ERROR_STOP=1 -f {}",
                    q(&body)
                )
            }
            Kind::Sql => format!(
                "psql \"$DATABASE_URL\" -X -v ON_ERROR_STOP=1 -f {}",
                q(&body)
            ),
            other => unreachable!("not a session block: {other:?}"),
        };
        let save = format!(
            "export -p | grep '^declare -x ' > {s}; printf 'cd %q\\n' \"$PWD\" >> {s}",
            s = q(&state)
        );
        let script = format!(
            "if [ -f {s} ]; then . {s}; else cd {d}; fi\nset -eo pipefail\ntrap {save} EXIT\n{run}\n",
            s = q(&state),
            d = q(self.dir.path()),
            save = quote(&save),
        );
        (body, script)
    }

    /// Runs `block`; the error says what failed, with its output.
    pub async fn run(&mut self, block: &Block) -> Result<(), String> {
        let (_, script) = self.script(block);
        self.blocks_run += 1;
        let out_path = self.dir.path().join(format!("output{}", self.blocks_run));
        let out = std::fs::File::create(&out_path).expect("an output file");
        let mut cmd = tokio::process::Command::new("bash");
        cmd.arg("-c")
            .arg(script)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("a second handle"))
            .stderr(out)
            .process_group(0)
            .kill_on_drop(true);
        for (k, _) in std::env::vars() {
            if k.starts_with("JOBRELAY_") || k.ends_with("_URL_FILE") || k.starts_with("PG") {
                cmd.env_remove(k);
            }
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        let mut child = cmd.spawn().expect("bash runs");
        let group = child.id().expect("a pid").to_string();
        let status = tokio::time::timeout(BLOCK_TIMEOUT, child.wait()).await;
        let left_running = kill_group(&group);
        let output = std::fs::read_to_string(&out_path).unwrap_or_default();
        match status {
            Err(_) => Err(format!("still running after {BLOCK_TIMEOUT:?}:\n{output}")),
            Ok(Ok(s)) if !s.success() => Err(format!("exited with {s}:\n{output}")),
            Ok(_) if left_running => Err(format!(
                "left processes running (a block must stop what it starts):\n{output}"
            )),
            Ok(_) => Ok(()),
        }
    }

    /// Drops the session's databases and deletes its namespaces' keys.
    pub async fn finish(self) {
        let mut admin = PgConnection::connect(&self.admin_url)
            .await
            .expect("postgres");
        for db in &self.databases {
            admin
                .execute(format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)").as_str())
                .await
                .expect("DROP DATABASE");
        }
        for ns in &self.namespaces {
            drop(common::Namespace::new().with_prefix(ns));
        }
    }
}

/// Whether a SQL block has `$1`-style parameters (a statement to bind, not to paste).
fn has_parameters(sql: &str) -> bool {
    sql.as_bytes()
        .windows(2)
        .any(|w| w[0] == b'$' && w[1].is_ascii_digit())
}

/// `p`, quoted for bash.
fn q(p: &Path) -> String {
    quote(&p.display().to_string())
}

/// `s`, quoted for bash.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Kills what is left of the process group `group`; whether anything was.
fn kill_group(group: &str) -> bool {
    let signal = |sig: &str| {
        std::process::Command::new("kill")
            .args([sig, "--", &format!("-{group}")])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let alive = signal("-0");
    if alive {
        signal("-KILL");
    }
    alive
}
