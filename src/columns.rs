//! A pending row's columns, defined once. Every statement that lists them (the claim and its
//! `RETURNING`, hand-backs, dead letters, the producer's insert, requeue) is rendered from
//! [`COLUMNS`], and row decoding reads them at the positions named here.

use std::ops::Range;

/// The outbox table's columns, in the table's own order (migration 1).
pub(crate) const COLUMNS: [&str; 14] = [
    "id",
    "uuid",
    "queue",
    "job_type",
    "payload",
    "parent_uuid",
    "predecessor_uuid",
    "dead_parent",
    "run_at",
    "headers",
    "created_at",
    "attempts",
    "available_at",
    "last_error",
];

/// Every column.
pub(crate) const ALL: Range<usize> = 0..14;
/// What a producer writes: the job, `uuid` through `headers`.
pub(crate) const JOB: Range<usize> = 1..10;
/// What requeueing a dead letter moves: the job and `created_at`.
pub(crate) const JOB_AND_CREATED: Range<usize> = 1..11;
/// What the claim returns, in this order: `id` through `attempts`.
pub(crate) const CLAIMED: Range<usize> = 0..12;

/// Positions in [`COLUMNS`] (and in the claim's `RETURNING` list) that decoding reads.
pub(crate) mod at {
    pub(crate) const ID: usize = 0;
    pub(crate) const UUID: usize = 1;
    pub(crate) const QUEUE: usize = 2;
    pub(crate) const JOB_TYPE: usize = 3;
    pub(crate) const PAYLOAD: usize = 4;
    pub(crate) const PARENT_UUID: usize = 5;
    pub(crate) const PREDECESSOR_UUID: usize = 6;
    pub(crate) const DEAD_PARENT: usize = 7;
    pub(crate) const RUN_AT: usize = 8;
    pub(crate) const HEADERS: usize = 9;
    pub(crate) const CREATED_AT: usize = 10;
    pub(crate) const ATTEMPTS: usize = 11;
}

/// The element type of the array that carries a column into `unnest`: `headers` travels as
/// text (cast to jsonb on the way in), `available_at` as a delay in seconds.
fn array_type(column: &str) -> &'static str {
    match column {
        "id" => "int8",
        "uuid" | "parent_uuid" | "predecessor_uuid" => "uuid",
        "payload" => "bytea",
        "dead_parent" => "bool",
        "run_at" | "created_at" => "timestamptz",
        "attempts" => "int4",
        "available_at" => "float8",
        _ => "text",
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

/// `unnest($1::int8[], ...) AS u(id, ...)` over the columns in `range`, parameters from `$1`.
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
        "available_at" => "now() + u.delay * interval '1 second'".to_owned(),
        c => format!("u.{c}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_name_their_columns() {
        let named = [
            (at::ID, "id"),
            (at::UUID, "uuid"),
            (at::QUEUE, "queue"),
            (at::JOB_TYPE, "job_type"),
            (at::PAYLOAD, "payload"),
            (at::PARENT_UUID, "parent_uuid"),
            (at::PREDECESSOR_UUID, "predecessor_uuid"),
            (at::DEAD_PARENT, "dead_parent"),
            (at::RUN_AT, "run_at"),
            (at::HEADERS, "headers"),
            (at::CREATED_AT, "created_at"),
            (at::ATTEMPTS, "attempts"),
        ];
        for (i, name) in named {
            assert_eq!(COLUMNS[i], name);
            assert!(CLAIMED.contains(&i), "{name} is returned by the claim");
        }
    }

    #[test]
    fn unnest_lists_arrays_and_names_in_step() {
        assert_eq!(
            unnest(JOB),
            "unnest($1::uuid[], $2::text[], $3::text[], $4::bytea[], $5::uuid[], $6::uuid[], \
             $7::bool[], $8::timestamptz[], $9::text[]) AS u(uuid, queue, job_type, payload, \
             parent_uuid, predecessor_uuid, dead_parent, run_at, headers)"
        );
        assert!(unnest(ALL).ends_with("attempts, delay, last_error)"));
        assert!(from_unnest(ALL).contains("now() + u.delay * interval '1 second'"));
    }
}
