//! The fenced code blocks of a Markdown file, with their info strings, and the file's
//! `<!-- docs-test: ... -->` directives (docs/README.md#code-blocks).

use std::path::{Path, PathBuf};

/// The repository's root.
pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every docs/**/*.md (docs/layouts/ and any other folder), as paths relative to
/// the root, sorted.
pub fn doc_files() -> Vec<PathBuf> {
    let mut files = vec![PathBuf::from("README.md")];
    let mut docs = Vec::new();
    markdown_under(Path::new("docs"), &mut docs);
    docs.sort();
    files.extend(docs);
    files
}

/// Every `.md` file under `dir` (relative to the root), its subfolders included.
fn markdown_under(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(root().join(dir)).unwrap_or_else(|e| panic!("{dir:?}: {e}")) {
        let entry = entry.expect("a directory entry");
        let path = dir.join(entry.file_name());
        if entry.file_type().expect("a file type").is_dir() {
            markdown_under(&path, out);
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
}

/// What the test does with a block, by its info string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// `sh`: run with bash in the file's session.
    Sh,
    /// `sql`: run with psql in the file's session (prepared, when it has `$1` parameters).
    Sql,
    /// `rust file=PATH`: identical to PATH, which CI compiles.
    Rust,
    /// `toml`: a `--config` file; `toml file=PATH`: a fragment of the manifest PATH.
    Toml,
    /// `json`: parsed.
    Json,
    /// `python`, `ruby`, `js`, `lua`: syntax-checked by their interpreter (Lua: Redis's).
    Syntax(&'static str),
    /// No language, or `text`: output shown to the reader.
    Text,
    /// `<lang> no-run`: not run; listed.
    NoRun,
    /// Anything else: a failure.
    Unknown(String),
}

/// One fenced block.
#[derive(Debug, Clone)]
pub struct Block {
    /// The Markdown file, relative to the root.
    pub file: PathBuf,
    /// The line of its opening fence, from 1.
    pub line: usize,
    pub kind: Kind,
    /// `file=PATH`, if given.
    pub same_as: Option<String>,
    /// The lines between the fences, the fence's indentation removed, each ending in `\n`.
    pub body: String,
}

impl Block {
    /// `file:line`, how every failure names the block.
    pub fn at(&self) -> String {
        format!("{}:{}", self.file.display(), self.line)
    }
}

fn kind(info: &str) -> (Kind, Option<String>) {
    let mut words = info.split_whitespace();
    let lang = words.next().unwrap_or("");
    let mut no_run = false;
    let mut same_as = None;
    for w in words {
        match w.split_once('=') {
            Some(("file", path)) => same_as = Some(path.to_owned()),
            _ if w == "no-run" => no_run = true,
            _ => return (Kind::Unknown(info.to_owned()), None),
        }
    }
    let kind = match lang {
        _ if no_run => Kind::NoRun,
        "sh" => Kind::Sh,
        "sql" => Kind::Sql,
        "rust" => Kind::Rust,
        "toml" => Kind::Toml,
        "json" => Kind::Json,
        "python" => Kind::Syntax("python"),
        "ruby" => Kind::Syntax("ruby"),
        "js" => Kind::Syntax("js"),
        "lua" => Kind::Syntax("lua"),
        "" | "text" => Kind::Text,
        other => Kind::Unknown(other.to_owned()),
    };
    (kind, same_as)
}

/// The opening fence of `line`: its indentation, backtick count and info string.
fn fence(line: &str) -> Option<(usize, usize, &str)> {
    let indent = line.len() - line.trim_start_matches(' ').len();
    let rest = &line[indent..];
    let ticks = rest.len() - rest.trim_start_matches('`').len();
    (ticks >= 3).then(|| (indent, ticks, rest[ticks..].trim()))
}

/// The fenced blocks of `text` (the file `file`), in order.
pub fn parse(file: &Path, text: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((i, line)) = lines.next() {
        let Some((indent, ticks, info)) = fence(line) else {
            continue;
        };
        let (kind, same_as) = kind(info);
        let mut body = String::new();
        for (_, l) in lines.by_ref() {
            if matches!(fence(l), Some((_, t, "")) if t >= ticks) {
                break;
            }
            let cut = l.len() - l.trim_start_matches(' ').len();
            body.push_str(&l[cut.min(indent)..]);
            body.push('\n');
        }
        blocks.push(Block {
            file: file.to_owned(),
            line: i + 1,
            kind,
            same_as,
            body,
        });
    }
    blocks
}

/// `text` without its fenced blocks (each line replaced by an empty one, so that line numbers
/// hold).
pub fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut open: Option<usize> = None;
    for line in text.lines() {
        match (open, fence(line)) {
            (None, Some((_, ticks, _))) => open = Some(ticks),
            (Some(t), Some((_, ticks, ""))) if ticks >= t => open = None,
            (None, None) => out.push_str(line),
            _ => {}
        }
        out.push('\n');
    }
    out
}

/// The `<!-- docs-test: db=NAME ns=PREFIX -->` settings of `text`: (key, value) pairs.
pub fn directives(text: &str) -> Vec<(String, String)> {
    prose(text)
        .lines()
        .filter_map(|l| l.trim().strip_prefix("<!-- docs-test:"))
        .filter_map(|l| l.strip_suffix("-->"))
        .flat_map(|l| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
        .filter_map(|w| w.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
        .collect()
}
