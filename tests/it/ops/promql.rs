//! A small reader of the PromQL that the shipped dashboard and alert rules hold: which metrics an
//! expression selects, with their label matchers, and which labels it groups or matches by. It
//! knows selectors, range and subquery brackets, functions, aggregations with `by`/`without`,
//! vector matching (`on`, `ignoring`, `group_left`, `group_right`), keywords, numbers,
//! durations, strings and Grafana variables (`$job`, `${DS}`, `$__rate_interval`). It is not a
//! parser: `promtool check rules` checks the syntax.

/// One label matcher of a selector, e.g. `kind="transient"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Matcher {
    pub label: String,
    pub op: String,
    pub value: String,
}

/// One vector selector: a metric name and its matchers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Selector {
    pub name: String,
    pub matchers: Vec<Matcher>,
}

/// What an expression reads.
#[derive(Debug, Default)]
pub(super) struct Query {
    pub selectors: Vec<Selector>,
    /// Labels named in `by (...)`, `without (...)`, `on (...)`, `ignoring (...)`, `group_*(...)`.
    pub labels: Vec<String>,
}

/// Keywords followed by a parenthesised list of label names.
const LABEL_LISTS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];
/// Aggregation operators, binary keywords and literals: never metric names.
const KEYWORDS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "atan2",
    "inf",
    "nan",
];

fn is_ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_ident(c: char) -> bool {
    is_ident_start(c) || c.is_ascii_digit()
}

/// Reads `expr`.
pub(super) fn read(expr: &str) -> Query {
    let s: Vec<char> = expr.chars().collect();
    let mut q = Query::default();
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        if c == '"' || c == '\'' || c == '`' {
            i = skip_string(&s, i).1;
        } else if c == '#' {
            while i < s.len() && s[i] != '\n' {
                i += 1;
            }
        } else if c == '$' {
            i = skip_variable(&s, i);
        } else if c.is_ascii_digit() || (c == '.' && s.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            while i < s.len() && (is_ident(s[i]) || s[i] == '.') {
                i += 1;
            }
        } else if c == '[' {
            while i < s.len() && s[i] != ']' {
                i += 1;
            }
        } else if c == '{' {
            // A selector without a name: `{__name__="..."}`.
            let (matchers, end) = read_matchers(&s, i);
            i = end;
            if let Some(m) = matchers
                .iter()
                .find(|m| m.label == "__name__" && m.op == "=")
            {
                let name = m.value.clone();
                q.selectors.push(Selector { name, matchers });
            }
        } else if is_ident_start(c) {
            let start = i;
            while i < s.len() && is_ident(s[i]) {
                i += 1;
            }
            let word: String = s[start..i].iter().collect();
            let next = skip_space(&s, i);
            let lower = word.to_ascii_lowercase();
            if LABEL_LISTS.contains(&lower.as_str()) {
                if s.get(next) == Some(&'(') {
                    let end = s[next..]
                        .iter()
                        .position(|&c| c == ')')
                        .map_or(s.len(), |p| next + p);
                    let list: String = s[next + 1..end].iter().collect();
                    q.labels.extend(
                        list.split(',')
                            .map(str::trim)
                            .filter(|l| !l.is_empty())
                            .map(str::to_owned),
                    );
                    i = end + 1;
                }
            } else if KEYWORDS.contains(&lower.as_str()) || s.get(next) == Some(&'(') {
                // An operator, a literal or a function.
            } else {
                let mut matchers = Vec::new();
                if s.get(next) == Some(&'{') {
                    (matchers, i) = read_matchers(&s, next);
                }
                q.selectors.push(Selector {
                    name: word,
                    matchers,
                });
            }
        } else {
            i += 1;
        }
    }
    q
}

fn skip_space(s: &[char], mut i: usize) -> usize {
    while i < s.len() && s[i].is_whitespace() {
        i += 1;
    }
    i
}

/// The string literal starting at `s[i]` (its quote), unescaped, and the index after it.
fn skip_string(s: &[char], i: usize) -> (String, usize) {
    let quote = s[i];
    let mut out = String::new();
    let mut j = i + 1;
    while j < s.len() && s[j] != quote {
        if s[j] == '\\' && quote != '`' && j + 1 < s.len() {
            j += 1;
        }
        out.push(s[j]);
        j += 1;
    }
    (out, j + 1)
}

/// The index after a Grafana variable: `$name`, `${name}`, `${name:format}`, `$__rate_interval`.
fn skip_variable(s: &[char], i: usize) -> usize {
    let mut j = i + 1;
    if s.get(j) == Some(&'{') {
        while j < s.len() && s[j] != '}' {
            j += 1;
        }
        return j + 1;
    }
    while j < s.len() && is_ident(s[j]) {
        j += 1;
    }
    j
}

/// The matchers of the `{...}` starting at `s[i]`, and the index after the `}`.
fn read_matchers(s: &[char], i: usize) -> (Vec<Matcher>, usize) {
    let mut out = Vec::new();
    let mut j = i + 1;
    loop {
        while j < s.len() && (s[j].is_whitespace() || s[j] == ',') {
            j += 1;
        }
        if j >= s.len() || s[j] == '}' {
            return (out, j + 1);
        }
        let start = j;
        while j < s.len() && is_ident(s[j]) {
            j += 1;
        }
        let label: String = s[start..j].iter().collect();
        j = skip_space(s, j);
        let op_start = j;
        while j < s.len() && matches!(s[j], '=' | '!' | '~') {
            j += 1;
        }
        let op: String = s[op_start..j].iter().collect();
        j = skip_space(s, j);
        assert!(
            !label.is_empty() && !op.is_empty() && j < s.len() && matches!(s[j], '"' | '\'' | '`'),
            "not a label matcher at {:?}",
            s[start..].iter().collect::<String>()
        );
        let (value, end) = skip_string(s, j);
        j = end;
        out.push(Matcher { label, op, value });
    }
}

#[test]
fn the_reader_finds_metrics_matchers_and_grouping_labels() {
    let names = |q: &Query| -> Vec<String> { q.selectors.iter().map(|s| s.name.clone()).collect() };
    let q = read(
        r#"histogram_quantile(0.99, sum by (job, le) (rate(x_seconds_bucket{job=~"$job"}[$__rate_interval])))"#,
    );
    assert_eq!(names(&q), ["x_seconds_bucket"]);
    assert_eq!(q.labels, ["job", "le"]);
    assert_eq!(
        q.selectors[0].matchers,
        [Matcher {
            label: "job".into(),
            op: "=~".into(),
            value: "$job".into()
        }]
    );
    let q = read(
        "up_gauge == 0\nand ignoring (instance, pod)\nmax without (instance, pod) (up_gauge) == 1",
    );
    assert_eq!(names(&q), ["up_gauge", "up_gauge"]);
    assert_eq!(q.labels, ["instance", "pod", "instance", "pod"]);
    let q = read(
        r#"sum(rate(a_total{kind="tr\"ans", x!="y"}[5m:30s] offset 1h)) / on() group_left sum(b) > bool 1e3 or absent(c) unless {__name__="d"} # e"#,
    );
    assert_eq!(names(&q), ["a_total", "b", "c", "d"]);
    assert_eq!(q.selectors[0].matchers[0].value, "tr\"ans");
    assert_eq!(q.selectors[0].matchers[1].op, "!=");
    let q = read("sum by(kind)(increase(m:recorded[1h])) * Inf + ${DS} - .5");
    assert_eq!(names(&q), ["m:recorded"]);
    assert_eq!(q.labels, ["kind"]);
}
