//! Relative links and `#anchors` of the Markdown files, resolved as GitHub resolves them.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

use super::blocks::{prose, root};

/// GitHub's anchor of a heading: lower case; inline code, emphasis and link syntax dropped to
/// their text; every character but letters, digits, `-`, `_` and spaces removed; spaces become
/// `-`.
pub fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    // [text](target) -> text
    while let Some(open) = rest.find('[') {
        let Some(close) = rest[open..].find("](").map(|c| open + c) else {
            break;
        };
        let Some(end) = rest[close..].find(')').map(|e| close + e) else {
            break;
        };
        text.push_str(&rest[..open]);
        text.push_str(&rest[open + 1..close]);
        rest = &rest[end + 1..];
    }
    text.push_str(rest);
    text.to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown text: its headings' (with GitHub's `-1`, `-2` ... for repeats)
/// and explicit `<a id="...">` / `<a name="...">` ones.
pub fn anchors(text: &str) -> Vec<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::new();
    for line in prose(text).lines() {
        let hashes = line.len() - line.trim_start_matches('#').len();
        if (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') {
            let base = slug(line[hashes..].trim().trim_end_matches('#').trim());
            let n = seen.entry(base.clone()).or_insert(0);
            out.push(if *n == 0 {
                base.clone()
            } else {
                format!("{base}-{n}")
            });
            *n += 1;
        }
        for attr in ["<a id=\"", "<a name=\""] {
            for (i, _) in line.match_indices(attr) {
                let start = i + attr.len();
                if let Some(len) = line[start..].find('"') {
                    out.push(line[start..start + len].to_owned());
                }
            }
        }
    }
    out
}

/// The link targets of `text` outside code: `[text](target)` and `[label]: target`, with their
/// lines.
pub fn targets(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (i, line) in prose(text).lines().enumerate() {
        // Code spans hold no links.
        let line: String = line
            .split('`')
            .enumerate()
            .map(|(n, part)| if n % 2 == 0 { part } else { "" })
            .collect();
        for (at, _) in line.match_indices("](") {
            let rest = &line[at + 2..];
            let end = rest.find([')', ' ']).unwrap_or(rest.len());
            out.push((i + 1, rest[..end].to_owned()));
        }
        // `[label]: target` on a line of its own.
        let trimmed = line.trim_start();
        if let Some(close) = trimmed.strip_prefix('[').and_then(|r| r.find(']')) {
            if let Some(def) = trimmed[close + 2..].strip_prefix(':') {
                let target = def.split_whitespace().next().unwrap_or("");
                out.push((i + 1, target.to_owned()));
            }
        }
    }
    out
}

/// `path` with `.` and `..` resolved, without touching the file system.
fn normal(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// Every broken relative link or anchor of `file` (relative to the root): `file:line: why`.
pub fn broken(file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(root().join(file)).expect("the file");
    let dir = file.parent().unwrap_or(Path::new(""));
    let mut out = Vec::new();
    for (line, target) in targets(&text) {
        if target.contains("://") || target.starts_with("mailto:") || target.is_empty() {
            continue;
        }
        let (path, anchor) = match target.split_once('#') {
            Some((p, a)) => (p, Some(a)),
            None => (target.as_str(), None),
        };
        let resolved = if path.is_empty() {
            file.to_owned()
        } else {
            normal(&dir.join(path))
        };
        let at = format!("{}:{line}: {target}", file.display());
        if resolved.starts_with("..") || !root().join(&resolved).exists() {
            out.push(format!("{at}: no such file {}", resolved.display()));
            continue;
        }
        let is_md = resolved.extension().is_some_and(|e| e == "md");
        if let (Some(anchor), true) = (anchor, is_md) {
            let target_text =
                std::fs::read_to_string(root().join(&resolved)).expect("the linked file");
            if !anchors(&target_text).iter().any(|a| a == anchor) {
                out.push(format!(
                    "{at}: no heading or anchor #{anchor} in {}",
                    resolved.display()
                ));
            }
        }
    }
    out
}
