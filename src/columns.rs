//! A pending row's columns, defined once. Every statement that lists them (the claim and its
//! `RETURNING`, hand-backs, dead letters, the producer's insert, requeue) is rendered from
//! [`COLUMNS`], the catalog check ([`crate::db::OUTBOX_COLUMNS`]) reads their types from
//! [`TYPED`], and row decoding reads them at the positions named here ([`at`]).

use std::ops::Range;

/// The outbox table's columns and their types, as `format_type` prints them (`timestamptz`
/// for `timestamp with time zone`), in the table's own order (migration 1; docs/schema.md),
/// except `options` and `ordering_key`: migrations 8 and 9 added them at the end of the table,
/// they are listed here with the job's other columns (statements name their columns, so the
/// table's order does not matter).
pub(crate) const TYPED: [(&str, &str); 16] = [
    ("id", "bigint"),
    ("uuid", "uuid"),
    ("queue", "text"),
    ("job_type", "text"),
    ("payload", "bytea"),
    ("parent_uuid", "uuid"),
    ("predecessor_uuid", "uuid"),
    ("dead_parent", "boolean"),
    ("run_at", "timestamptz"),
    ("headers", "jsonb"),
    ("options", "jsonb"),
    ("ordering_key", "text"),
    ("created_at", "timestamptz"),
    ("attempts", "integer"),
    ("available_at", "timestamptz"),
    ("last_error", "text"),
];

/// The columns' names, in the table's order: [`TYPED`] without the types.
pub(crate) const COLUMNS: [&str; 16] = names(TYPED);

/// Every column.
pub(crate) const ALL: Range<usize> = 0..COLUMNS.len();
/// What a producer writes: the job, `uuid` through `ordering_key`.
pub(crate) const JOB: Range<usize> = at::UUID..at::ORDERING_KEY + 1;
/// What requeueing a dead letter moves: the job and `created_at`.
pub(crate) const JOB_AND_CREATED: Range<usize> = at::UUID..at::CREATED_AT + 1;
/// The columns the claim returns first, in this order: `id` through `attempts`. Two flags
/// follow them ([`CLAIM_FLAGS`]).
pub(crate) const CLAIMED: Range<usize> = at::ID..at::ATTEMPTS + 1;
/// What the claim returns after the columns of [`CLAIMED`], in this order: whether the claim
/// moved the row to the dead letters itself (`buried`), whether the byte cap cut the batch
/// short (`capped`), whether it locked rows it left for their key's earlier rows (`held`),
/// whether rows with an ordering key wait at or above where it looked (`keyed`), and the
/// highest id it looked at in `id` order (`window_end`: the follow claim's rows above it
/// followed their key).
/// A named claim returns its tag last ([`at::STATEMENT`]).
pub(crate) const CLAIM_FLAGS: [&str; 5] = ["buried", "capped", "held", "keyed", "window_end"];

/// Positions in [`COLUMNS`] (and in the claim's `RETURNING` list) that decoding reads, each
/// found by its column's name when the crate compiles.
pub(crate) mod at {
    use super::{position, CLAIMED, CLAIM_FLAGS, COLUMNS};

    pub(crate) const ID: usize = position(&COLUMNS, "id");
    pub(crate) const UUID: usize = position(&COLUMNS, "uuid");
    pub(crate) const QUEUE: usize = position(&COLUMNS, "queue");
    pub(crate) const JOB_TYPE: usize = position(&COLUMNS, "job_type");
    pub(crate) const PAYLOAD: usize = position(&COLUMNS, "payload");
    pub(crate) const PARENT_UUID: usize = position(&COLUMNS, "parent_uuid");
    pub(crate) const PREDECESSOR_UUID: usize = position(&COLUMNS, "predecessor_uuid");
    pub(crate) const DEAD_PARENT: usize = position(&COLUMNS, "dead_parent");
    pub(crate) const RUN_AT: usize = position(&COLUMNS, "run_at");
    pub(crate) const HEADERS: usize = position(&COLUMNS, "headers");
    pub(crate) const OPTIONS: usize = position(&COLUMNS, "options");
    pub(crate) const ORDERING_KEY: usize = position(&COLUMNS, "ordering_key");
    pub(crate) const CREATED_AT: usize = position(&COLUMNS, "created_at");
    pub(crate) const ATTEMPTS: usize = position(&COLUMNS, "attempts");
    /// The claim's flag `buried`, after the columns of [`CLAIMED`].
    pub(crate) const BURIED: usize = CLAIMED.end + position(&CLAIM_FLAGS, "buried");
    /// The claim's flag `capped`, after the columns of [`CLAIMED`].
    pub(crate) const CAPPED: usize = CLAIMED.end + position(&CLAIM_FLAGS, "capped");
    /// The claim's flag `held`, after the columns of [`CLAIMED`].
    pub(crate) const HELD: usize = CLAIMED.end + position(&CLAIM_FLAGS, "held");
    /// The claim's flag `keyed`, after the columns of [`CLAIMED`].
    pub(crate) const KEYED: usize = CLAIMED.end + position(&CLAIM_FLAGS, "keyed");
    /// The claim's `window_end`, after the columns of [`CLAIMED`].
    pub(crate) const WINDOW_END: usize = CLAIMED.end + position(&CLAIM_FLAGS, "window_end");
    /// A named claim's tag `statement`, after the flags ([`crate::relay::Queries::claim_tag`]).
    pub(crate) const STATEMENT: usize = CLAIMED.end + CLAIM_FLAGS.len();
}

/// The names of `typed`.
const fn names<const N: usize>(typed: [(&'static str, &'static str); N]) -> [&'static str; N] {
    let mut out = [""; N];
    let mut i = 0;
    while i < N {
        out[i] = typed[i].0;
        i += 1;
    }
    out
}

/// Where `name` is in `names`; fails the build when it is not there.
const fn position(names: &[&str], name: &str) -> usize {
    let mut i = 0;
    while i < names.len() {
        if same(names[i], name) {
            return i;
        }
        i += 1;
    }
    panic!("no such column")
}

const fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// The type of `column` ([`TYPED`]).
fn sql_type(column: &str) -> &'static str {
    TYPED
        .iter()
        .find(|(name, _)| *name == column)
        .map(|(_, ty)| *ty)
        .expect("a column of TYPED")
}

/// The element type of the array that carries a column into `unnest`: the column's own type,
/// except that `headers` and `options` travel as text (cast to jsonb on the way in) and
/// `available_at` as a delay in seconds.
fn array_type(column: &str) -> &'static str {
    match column {
        "headers" | "options" => "text",
        "available_at" => "float8",
        c => sql_type(c),
    }
}

/// The name a column has among `unnest`'s outputs (`available_at` arrives as `delay`).
fn unnest_name(column: &str) -> &str {
    match column {
        "available_at" => "delay",
        c => c,
    }
}

/// `a, b, c` for the columns in `range`.
pub(crate) fn list(range: Range<usize>) -> String {
    COLUMNS[range].join(", ")
}

/// `f(a), f(b), f(c)` for the columns in `range`.
pub(crate) fn list_with(range: Range<usize>, f: impl Fn(&str) -> String) -> String {
    COLUMNS[range]
        .iter()
        .map(|c| f(c))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `unnest($1::bigint[], ...) AS u(id, ...)` over the columns in `range`, parameters from `$1`.
pub(crate) fn unnest(range: Range<usize>) -> String {
    unnest_as(range, "AS u", "")
}

/// [`unnest`] `WITH ORDINALITY`: `u.n` numbers the elements from 1, in array order.
pub(crate) fn unnest_numbered(range: Range<usize>) -> String {
    unnest_as(range, "WITH ORDINALITY AS u", ", n")
}

fn unnest_as(range: Range<usize>, alias: &str, extra: &str) -> String {
    let columns = &COLUMNS[range];
    let arrays: Vec<String> = columns
        .iter()
        .enumerate()
        .map(|(i, c)| format!("${}::{}[]", i + 1, array_type(c)))
        .collect();
    let names: Vec<&str> = columns.iter().map(|c| unnest_name(c)).collect();
    format!(
        "unnest({}) {alias}({}{extra})",
        arrays.join(", "),
        names.join(", ")
    )
}

/// The `SELECT` list that turns `unnest`'s outputs back into column values.
pub(crate) fn from_unnest(range: Range<usize>) -> String {
    list_with(range, |c| match c {
        "headers" => "u.headers::jsonb".to_owned(),
        "options" => "u.options::jsonb".to_owned(),
        "available_at" => "now() + u.delay * interval '1 second'".to_owned(),
        c => format!("u.{c}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_name_their_columns_and_the_claim_returns_them_first() {
        for (i, name) in [
            (at::ID, "id"),
            (at::PAYLOAD, "payload"),
            (at::HEADERS, "headers"),
            (at::OPTIONS, "options"),
            (at::ORDERING_KEY, "ordering_key"),
            (at::ATTEMPTS, "attempts"),
        ] {
            assert_eq!(COLUMNS[i], name);
        }
        // The claim returns every column before `available_at`, then its flags.
        assert_eq!((CLAIMED.start, COLUMNS[CLAIMED.end]), (0, "available_at"));
        assert_eq!(
            (
                at::BURIED,
                at::CAPPED,
                at::HELD,
                at::KEYED,
                at::WINDOW_END,
                at::STATEMENT
            ),
            (14, 15, 16, 17, 18, 19)
        );
        assert_eq!(list(JOB_AND_CREATED), format!("{}, created_at", list(JOB)));
    }

    #[test]
    fn unnest_lists_arrays_and_names_in_step() {
        assert_eq!(
            unnest(JOB),
            "unnest($1::uuid[], $2::text[], $3::text[], $4::bytea[], $5::uuid[], $6::uuid[], \
             $7::boolean[], $8::timestamptz[], $9::text[], $10::text[], $11::text[]) AS u(uuid, \
             queue, job_type, payload, parent_uuid, predecessor_uuid, dead_parent, run_at, \
             headers, options, ordering_key)"
        );
        assert!(unnest(ALL).starts_with("unnest($1::bigint[], "));
        assert!(unnest(ALL).contains("$14::integer[], $15::float8[], $16::text[]"));
        assert!(unnest(ALL).ends_with("attempts, delay, last_error)"));
        assert!(from_unnest(ALL).contains("now() + u.delay * interval '1 second'"));
    }
}
