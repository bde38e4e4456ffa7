//! The relay's SQL, rendered once per table.

use super::claim_kind::ClaimKind;
use crate::columns::{self, ALL, CLAIMED};
use crate::sink::ClaimNeeds;
use crate::table::TableName;

/// What a claimed row is counted as besides its payload, headers and options, against the
/// batch's byte cap: the other columns, the keys and route the script call carries for it (an
/// estimate).
pub const ROW_OVERHEAD_BYTES: i64 = 200;

/// SQL statements for one outbox table.
#[derive(Debug, Clone)]
pub struct Queries {
    /// When `$5` is not 0, first takes the first free of `$5` claim slots for the transaction
    /// (transaction-level advisory locks `(CLAIM_SLOT_CLASS + slot, hashtext(<channel>))`,
    /// released at commit or rollback, and by the server when the relay's session dies) and
    /// claims nothing without one, in the same round trip. Whether it got one is also left in
    /// the transaction's setting `jobrelay.slot_held` ([`Queries::slot_held`]), which the
    /// relay reads only when the claim came back empty.
    /// Claims and deletes claimable rows with `id >= $6` ([`super::cursor`]) in `id` order,
    /// skipping locked ones: at most `$1`
    /// rows and, past the first row, at most `$3` bytes (payloads, headers and options, plus
    /// [`ROW_OVERHEAD_BYTES`] a row); when `$2` (seconds) is not null, only rows created at
    /// least that long ago, and rows whose `created_at` no age can be taken of (beyond the
    /// range a job can carry: `infinity`, year 10000; the relay dead-letters them). A row whose payload is over `$4` bytes (`--max-job-size`) is moved
    /// to the dead-letter table by the same statement, without its payload ever leaving
    /// Postgres: it comes back with an empty payload and the flag `buried` true. The flag
    /// `capped` says the byte cap cut the batch short (more rows are waiting). The columns
    /// come first, then the flags (`columns::CLAIMED`, `columns::CLAIM_FLAGS`). The delete
    /// only becomes visible at commit, which the relay issues after Redis acknowledged the
    /// jobs; until then the rows stay locked, and a rollback brings them back untouched.
    /// A keyed row is taken only at the head of its key, with the run of its key's rows
    /// behind it ([`ClaimKind::Runs`]); the flag `held` says the claim locked rows of a key it
    /// did not take.
    pub claim: String,
    /// [`Queries::claim`] taking a keyed row only at the head of its key, one row per key
    /// ([`ClaimKind::Heads`]); its flag `held` says it locked rows of a key behind the rows
    /// it took.
    pub claim_heads: String,
    /// [`Queries::claim_heads`] over a window of `$1` rows, each keyed head followed by the
    /// next `$7` rows of its key as far as they are claimable and free
    /// ([`ClaimKind::Follow`]); `window_end` is the highest id of the window.
    pub claim_follow: String,
    /// [`Queries::claim`] for rows without an ordering key only: it leaves keyed rows alone
    /// and plans faster ([`ClaimKind::Unkeyed`]). The flag `keyed` of the four says whether
    /// keyed rows wait from `$6` on (those that take keyed rows look up to the last row they
    /// locked); which claim a worker runs: [`ClaimKind::next`].
    pub claim_unkeyed: String,
    /// Puts refused rows back with their new attempts, delay and error.
    pub retry: String,
    /// Moves rows to the dead-letter table.
    pub dead_letter: String,
    /// After a claim in the same transaction: whether it held a claim slot (`"true"`).
    pub slot_held: String,
    /// Deletes the rows of ids `$1` (whose jobs Redis acknowledged) that no other transaction
    /// holds, when a batch's hand-back failed and it was rolled back (`Batcher`).
    pub settle_acknowledged: String,
    /// The id and age in seconds (`float8`, at least 0) of the first row with `id >= $1` that
    /// a claim could take now: not parked by a retry's backoff (`available_at`), due for a
    /// runner whose rows wait until they are ([`ClaimNeeds::holds_until_due`]), with a finite `created_at`;
    /// no row when there is none (`jobrelay_oldest_claimable_age_seconds`,
    /// [`super::backlog::Backlog`]). It walks the primary key from `$1` and stops at the first
    /// such row: it reads the rows parked ahead of it and the dead index entries there, never
    /// the table. Run in a transaction opened with [`BEGIN`], as every statement on the
    /// outbox. A conveyor parent whose children are still pending counts as claimable (its
    /// children are). A keyed row counts only at the head of its key, due, its key held by no
    /// dead letter (docs/guarantees.md#per-key-order): the rows behind a key's head wait for
    /// it, not for a relay.
    pub oldest_claimable: String,
    /// The named claims' tag, drawn at random when they are rendered, which every row they
    /// return carries last (`statement`): a row with another tag, or none, came from another
    /// client's statement of the same name ([`super::prepared`]).
    pub claim_tag: i64,
    /// The four claims as named statements (`--prepared-statements`), in the order of
    /// [`ClaimKind::ALL`]: their text differs from the unnamed ones', so that a connection's
    /// cache of named statements, which sqlx looks in first, never answers for an unnamed claim.
    named_claims: [String; 4],
}

/// [`PLANNER_SETTINGS`] as `SET LOCAL` statements (a literal, for `concat!`).
macro_rules! planner_set_local {
    () => {
        "SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off; SET LOCAL jit = off"
    };
}

/// Opens a relay transaction (claim, settle, commit): the planner settings every statement
/// on the outbox needs, for this transaction only ([`PLANNER_SETTINGS`]).
pub const BEGIN: &str = concat!("BEGIN; ", planner_set_local!());

/// The `SET LOCAL`s of [`BEGIN`] alone, for a transaction that makes other settings too.
pub const PLANNER_SET_LOCAL: &str = planner_set_local!();

/// The settings [`BEGIN`] makes, transaction-scoped (`SET LOCAL`: nothing outlives the
/// transaction, so a pooled connection behind PgBouncer's transaction mode is left as found).
///
/// An outbox is nearly empty most of the time and holds 100,000 rows after an outage: a plan
/// made (and cached) while it held a few rows, or with statistics gathered then, reads it
/// whole with a Seq Scan, or a bitmap of the whole primary key and a sort. Every statement on
/// the outbox reaches its rows through the primary key's order (the claim), tuple ids (the
/// claim's delete) or id lookups (the fast path); with these two access paths priced out, no
/// statistics and no cached plan can choose a scan bounded by the table instead of the batch.
/// Pricing a path out adds 1e10 to a plan's cost, which would switch on JIT compilation
/// (tens of milliseconds per statement) wherever no other path exists: `jit = off` too.
pub const PLANNER_SETTINGS: [(&str, &str); 3] = [
    ("enable_seqscan", "off"),
    ("enable_bitmapscan", "off"),
    ("jit", "off"),
];

/// First key of claim slot 0; slot `n` is `CLAIM_SLOT_CLASS + n` (`--claim-slots` is at most
/// 64, so the keys 27251..=27314 follow the wake-up lock's 27250).
pub const CLAIM_SLOT_CLASS: i32 = 0x6A73;

impl Queries {
    /// The claim statement of `kind`; with `named`, its text for a named statement
    /// ([`super::prepared`]).
    pub fn claim_for(&self, kind: ClaimKind, named: bool) -> &str {
        match (kind, named) {
            (kind, true) => &self.named_claims[kind.to_u8() as usize],
            (ClaimKind::Unkeyed, false) => &self.claim_unkeyed,
            (ClaimKind::Heads, false) => &self.claim_heads,
            (ClaimKind::Runs, false) => &self.claim,
            (ClaimKind::Follow, false) => &self.claim_follow,
        }
    }

    /// Renders the statements for `table`, for a runner that needs nothing of the claim.
    pub fn new(table: &TableName) -> Self {
        Queries::for_needs(table, ClaimNeeds::default())
    }

    /// Renders the statements for `table` and what the runner `needs` of the claim. With
    /// [`ClaimNeeds::flows_in_order`], the claim takes a row only once no other pending row
    /// names it as its parent or predecessor: a flow's children and heirs reach the runner
    /// before the job they wait for, and never after it might have finished. The two partial
    /// indexes of migration 7 keep that test to two index probes per row. With
    /// [`ClaimNeeds::holds_until_due`], it takes a row only once its `run_at` has passed.
    pub fn for_needs(table: &TableName, needs: ClaimNeeds) -> Self {
        let claim_tag = uuid::Uuid::new_v4().as_u64_pair().0 as i64;
        let t = table.pending();
        let d = table.dead();
        let row_columns = columns::list(ALL);
        // The buried row, as the statement's snapshot saw it, with its attempt counted and why.
        let buried_values = columns::list_with(ALL, |c| match c {
            "attempts" => "attempts + 1".to_owned(),
            "last_error" => "format('job too large: payload of %s bytes, over --max-job-size \
                             (%s bytes)', octet_length(payload), $4::int8)"
                .to_owned(),
            c => c.to_owned(),
        });
        // What the claim returns, decoded by position (`columns::at`): a payload over `$4`
        // comes back empty (it was buried), the headers and options as JSON text.
        let returning = columns::list_with(CLAIMED, |c| match c {
            "payload" => {
                "CASE WHEN octet_length(payload) > $4::int8 THEN ''::bytea ELSE payload END \
                 AS payload"
                    .to_owned()
            }
            "headers" => "headers::text AS headers".to_owned(),
            "options" => "options::text AS options".to_owned(),
            c => c.to_owned(),
        });
        // Then the flags, in the order of `columns::CLAIM_FLAGS` (`at::BURIED`, `at::CAPPED`):
        // whether the claim moved the row to the dead letters (its payload over `$4`), and
        // whether the byte cap left locked rows out of this batch.
        // `held`: the claim locked rows it left for their key's earlier rows; `keyed`: rows
        // with an ordering key wait from `$6` on (which claim a worker runs next:
        // `ClaimKind::next`); `window_end` (follow): the last candidate's id, above which its
        // rows were taken following their key (the cursor moves by the rows below). The
        // unkeyed claim asks the partial index of keyed rows: nothing to read in a table whose
        // rows have no key. The claims that take keyed rows look where
        // their own scan went, from `$6` to the last row they locked, through the primary key:
        // no more rows than the claim read (a keyed row is usually the first); there the key's
        // index would hold the dead entries of every keyed row claimed since the last vacuum.
        // That test is written so that it implies no `ordering_key IS NOT NULL`, which would
        // let a plan walk that index instead. Keyed rows above wait for a later claim: the
        // next one from a higher mark, or the one after a claim that came back empty.
        let flags = |kind: ClaimKind| {
            columns::CLAIM_FLAGS
                .map(|flag| match (flag, kind) {
                    ("buried", _) => "octet_length(payload) > $4::int8 AS buried".to_owned(),
                    ("capped", _) => "NOT (SELECT all_fit FROM fits) AS capped".to_owned(),
                    ("held", ClaimKind::Runs) => "EXISTS (SELECT 1 FROM passed) AS held".to_owned(),
                    ("held", ClaimKind::Heads) => {
                        "(SELECT count(*) FROM candidates) > (SELECT count(*) FROM locked) AS held"
                            .to_owned()
                    }
                    // Rows the follow claim took above its window were not candidates.
                    ("held", ClaimKind::Follow) => "(SELECT count(*) FROM candidates) > \
                         (SELECT count(*) FROM locked \
                          WHERE id <= (SELECT max(id) FROM candidates)) AS held"
                        .to_owned(),
                    ("held", ClaimKind::Unkeyed) => "false AS held".to_owned(),
                    ("keyed", ClaimKind::Unkeyed) => format!(
                        "EXISTS (SELECT 1 FROM {t} WHERE ordering_key IS NOT NULL \
                         AND id >= $6::int8) AS keyed"
                    ),
                    ("keyed", _) => format!(
                        "EXISTS (SELECT 1 FROM {t} WHERE id >= $6::int8 \
                         AND id <= (SELECT max(id) FROM candidates) \
                         AND COALESCE(ordering_key, '') <> '') AS keyed"
                    ),
                    ("window_end", ClaimKind::Follow) => {
                        "(SELECT max(id) FROM candidates) AS window_end".to_owned()
                    }
                    ("window_end", _) => "NULL::int8 AS window_end".to_owned(),
                    (other, _) => unreachable!("claim flag {other}"),
                })
                .join(", ")
        };
        let unnest = columns::unnest(ALL);
        let from_unnest = columns::from_unnest(ALL);
        // While no pending row names a parent or a predecessor (one look into each partial
        // index, once per statement: an InitPlan), no row needs the per-row test: a claim of
        // plain jobs costs what it costs without flows.
        let flows = if needs.flows_in_order {
            format!(
                "AND ((SELECT NOT EXISTS (SELECT 1 FROM {t} WHERE parent_uuid IS NOT NULL)
                              AND NOT EXISTS (SELECT 1 FROM {t} WHERE predecessor_uuid IS NOT NULL))
                          OR (NOT EXISTS (SELECT 1 FROM {t} d
                                          WHERE d.parent_uuid = {t}.uuid AND d.id <> {t}.id)
                              AND NOT EXISTS (SELECT 1 FROM {t} d
                                              WHERE d.predecessor_uuid = {t}.uuid AND d.id <> {t}.id)))"
            )
        } else {
            String::new()
        };
        // A runner without a scheduled set gets a job once it is due: the row waits here.
        let due = if needs.holds_until_due {
            "AND (run_at IS NULL OR run_at <= now())"
        } else {
            ""
        };
        // The four claims (`super::claim_kind`) are one statement, but for which rows they
        // lock and which of them they take; the smaller plan faster (docs/benchmarks.md,
        // "Ordering keys").
        // A key with a dead letter holds its rows; the dead letters are probed per key only
        // while they hold a keyed row at all (one look per statement).
        let key_dead = |alias: &str| {
            format!(
                "(SELECT EXISTS (SELECT 1 FROM {d} WHERE ordering_key IS NOT NULL))
                                            AND EXISTS (SELECT 1 FROM {d} x
                                                        WHERE x.ordering_key = {alias}.ordering_key)"
            )
        };
        // What makes a row claimable now, but for where the claim looks and keys: not parked by
        // a retry's backoff, due for a runner that holds rows until they are, old enough for
        // the sweep (`$2`), and free of a flow's pending children and heirs.
        let claimable = format!(
            "available_at <= now() {due}
                       AND ($2::float8 IS NULL OR created_at <= now() - $2 * interval '1 second'
                            OR created_at NOT BETWEEN '0001-01-01 00:00:00+00'
                                                  AND '9999-12-31 23:59:59.999999+00')
                       {flows}"
        );
        // A locked row's flag `oversize` (payload over `$4`) and what it counts against the
        // byte cap, `counted`.
        let sized = format!(
            "octet_length(payload) > $4::int8 AS oversize,
                            CASE WHEN octet_length(payload) > $4::int8 THEN 0
                                 ELSE octet_length(payload) END
                            + pg_column_size(headers) + pg_column_size(options)
                            + {ROW_OVERHEAD_BYTES} AS counted"
        );
        let claim = |kind: ClaimKind| {
            // The rows it locks, in `id` order (named `name`, with `ordering_key` where the
            // keyed claim needs it, and `keys`: which rows with a key it may lock).
            let lock = |name: &str, key_column: &str, keys: &str| {
                // Headers and options count at their size as stored, read from their
                // headers without detoasting them (Postgres 13 has no way to read a compressed
                // value's full size so cheaply; one compressed from about 2 kB counts
                // compressed). Counting the text the claim returns instead cost 0.2 us a row
                // on rows holding `{}` (`EXPLAIN ANALYZE` of 1,000-row claims, medians of 40:
                // 1.99 against 1.83 ms; 1.78 ms counting neither).
                format!(
                    "                 ), {name} AS MATERIALIZED (
                     SELECT ctid, id, {key_column}{sized}
                     FROM {t}
                     WHERE (SELECT held FROM slot)
                       AND id >= $6::int8
                       AND {keys}
                       AND {claimable}
                     ORDER BY id
                     LIMIT $1
                     FOR UPDATE SKIP LOCKED
"
                )
            };
            // A keyed row is taken only once due, and only at the head of its key. `Heads`
            // locks the candidates and takes each keyed one only when no earlier row of its key
            // is pending (one probe of the key's index per keyed row): one row per key. The
            // probe reads the key's index backwards from the row: a row behind another of its
            // key finds that one first, not the dead entries of every row of the key claimed
            // since the last vacuum (a hot key: a thousand probes over them each).
            // `Runs` takes a key's run: per key of the candidates (evaluated once, at the key's
            // first candidate, and carried to its other rows by a window), the first id not to
            // take, `stop`. That is the key's first candidate when an earlier row of the key
            // is pending outside the claim (another worker's, backing off, not due) or the key
            // has a dead letter; else the first pending row of the key between its first and
            // last candidates that is not a candidate (another worker's); else none. (Each
            // bound keeps a probe on the key's index whatever plan is made: a probe of all ids
            // below the last candidate was planned, generic, as a walk of the primary key.)
            // Rows locked but not taken are left untouched until the commit (`held`).
            let candidates = || {
                lock(
                    "candidates",
                    "ordering_key, ",
                    "(ordering_key IS NULL OR run_at IS NULL OR run_at <= now())",
                )
            };
            // The candidates a claim of heads takes, as `name` (with `extra` columns): a keyed
            // one only when no earlier row of its key is pending and no dead letter holds it.
            let heads = |name: &str, extra: &str| {
                format!(
                    "                 ), {name} AS MATERIALIZED (
                     SELECT ctid, id, oversize, counted{extra} FROM candidates c
                     WHERE c.ordering_key IS NULL
                        OR ((SELECT p.id FROM {t} p
                             WHERE p.ordering_key = c.ordering_key AND p.id < c.id
                             ORDER BY p.ordering_key DESC, p.id DESC LIMIT 1) IS NULL
                            AND NOT ({key_dead}))
",
                    key_dead = key_dead("c")
                )
            };
            let rows = match kind {
                ClaimKind::Unkeyed => lock("locked", "", "ordering_key IS NULL"),
                ClaimKind::Heads => candidates() + &heads("locked", ""),
                // `Follow` takes the heads among its candidates (a window of `$1` rows, which
                // the relay keeps small while keys come in runs), then reads each keyed head's
                // next `$7` rows through the key's index (`next`), locks those that are
                // claimable, skipping rows another worker holds (`next_locked`, by tuple id),
                // and takes of each key the rows up to the first it could not lock: a row
                // another worker holds, backing off, not due, or changed since the statement's
                // snapshot. Every row before a taken one in its key is taken too, so the key's
                // order holds as with heads, with one probe per key instead of one per row.
                // The window's own rows behind a head are followed like the others (locked
                // again by the same transaction). A key's rows are told by their head's id, not
                // their key: the test of gaps sorts integers, not text (0.5 us a row less,
                // docs/benchmarks.md, "Ordering keys"). Rows locked but not taken stay locked,
                // untouched, until the commit.
                ClaimKind::Follow => {
                    candidates()
                        + &heads("heads", ", ordering_key")
                        + &format!(
                            "                 ), next AS MATERIALIZED (
                     SELECT n.ctid, n.id, h.id AS head
                     FROM heads h CROSS JOIN LATERAL (
                         SELECT p.ctid, p.id FROM {t} p
                         WHERE p.ordering_key = h.ordering_key AND p.id > h.id
                         ORDER BY p.ordering_key, p.id
                         LIMIT $7) n
                     WHERE h.ordering_key IS NOT NULL
                 ), next_locked AS MATERIALIZED (
                     SELECT id, {sized}
                     FROM {t}
                     WHERE ctid = ANY(ARRAY(SELECT ctid FROM next))
                       AND (run_at IS NULL OR run_at <= now())
                       AND {claimable}
                     FOR UPDATE SKIP LOCKED
                 ), followed AS (
                     SELECT n.ctid, n.id, l.oversize, l.counted,
                            bool_and(l.id IS NOT NULL)
                                OVER (PARTITION BY n.head ORDER BY n.id) AS unbroken
                     FROM next n LEFT JOIN next_locked l ON l.id = n.id
                 ), locked AS MATERIALIZED (
                     SELECT ctid, id, oversize, counted FROM heads
                     UNION ALL
                     SELECT ctid, id, oversize, counted FROM followed WHERE unbroken
"
                        )
                }
                ClaimKind::Runs => {
                    candidates()
                        + &format!(
                            "                 ), keyed AS (
                     SELECT id, ordering_key,
                            min(id) OVER (PARTITION BY ordering_key) AS lo,
                            max(id) OVER (PARTITION BY ordering_key) AS hi
                     FROM candidates WHERE ordering_key IS NOT NULL
                 ), stops AS (
                     SELECT id, max(stop) OVER (PARTITION BY ordering_key) AS stop
                     FROM (SELECT id, ordering_key,
                                  CASE WHEN id <> lo THEN NULL
                                       WHEN EXISTS (SELECT 1 FROM {t} p
                                                    WHERE p.ordering_key = k.ordering_key
                                                      AND p.id < k.lo)
                                            OR ({key_dead})
                                            THEN lo
                                       WHEN lo = hi THEN hi + 1
                                       ELSE COALESCE((SELECT min(p.id) FROM {t} p
                                                      WHERE p.ordering_key = k.ordering_key
                                                        AND p.id > k.lo AND p.id < k.hi
                                                        AND p.id NOT IN (SELECT id FROM candidates)),
                                                     hi + 1)
                                  END AS stop
                           FROM keyed k) f
                 ), passed AS MATERIALIZED (
                     SELECT id FROM stops WHERE id >= stop
                 ), locked AS MATERIALIZED (
                     SELECT ctid, id, oversize, counted FROM candidates
                     WHERE id NOT IN (SELECT id FROM passed)
",
                            key_dead = key_dead("k")
                        )
                }
            };
            format!(
                "WITH slot AS (
                     SELECT set_config('jobrelay.slot_held', ($5::int4 = 0 OR EXISTS (
                         SELECT 1 FROM generate_series(0, $5::int4 - 1) AS s
                         WHERE pg_try_advisory_xact_lock({CLAIM_SLOT_CLASS} + s, hashtext({channel}))
                     ))::text, true)::bool AS held
{rows}                 ), fits AS (
                     SELECT COALESCE(sum(counted), 0) <= $3::int8 AS all_fit,
                            COALESCE(bool_or(oversize), false) AS any_oversize
                     FROM locked
                 ), taken AS (
                     SELECT ctid, oversize FROM locked WHERE (SELECT all_fit FROM fits)
                     UNION ALL
                     SELECT ctid, oversize FROM (
                         SELECT ctid, oversize, counted,
                                sum(counted) OVER (ORDER BY id ROWS UNBOUNDED PRECEDING) AS running
                         FROM locked WHERE NOT (SELECT all_fit FROM fits)) s
                     WHERE running <= $3::int8 OR running = counted
                 ), buried AS (
                     INSERT INTO {d} ({row_columns})
                     SELECT {buried_values}
                     FROM {t}
                     WHERE (SELECT any_oversize FROM fits)
                       AND ctid = ANY(ARRAY(SELECT ctid FROM taken WHERE oversize))
                 )
                 DELETE FROM {t}
                 WHERE ctid = ANY(CASE WHEN (SELECT all_fit FROM fits)
                                       THEN ARRAY(SELECT ctid FROM locked)
                                       ELSE ARRAY(SELECT ctid FROM taken) END)
                 RETURNING {returning}, {flags}",
                channel = sql_literal(&table.channel()),
                flags = flags(kind)
            )
        };
        Queries {
            // The rows are locked in `id` order, then deleted by their tuple ids: a TID scan,
            // where joining on `id` would descend the primary key once more per row (measured:
            // half the statement's time for 1,000 rows). A locked row cannot move before the
            // delete; a row that another transaction updated after this statement's snapshot
            // is locked but not deleted, hence not returned, hence not pushed: it is claimed
            // again later. Rows locked beyond the byte cap stay locked, untouched, until the
            // commit. `octet_length` of a stored payload reads its length, not its bytes.
            // The running sum (a window over the locked rows) is only computed when the
            // locked rows do not all fit, and `buried` only runs when one is oversize: in the
            // common case the statement costs one pass more than a plain claim (measured with
            // pgbench, 2,000-row claims rolled back, medians of 6 alternating rounds: 8.4 ms
            // plain, 10.2 ms with the window and `buried` always evaluated, 9.8 ms like this).
            // An oversize row is copied to the dead letters by `buried` (which reads the row
            // as the statement's snapshot saw it) and deleted by the main DELETE with the
            // others; the DELETE returns it without its payload, flagged.
            // Rows come back in physical order; the relay sorts them by `id`.
            // `ClaimedRow` decodes the RETURNING list by the positions `columns::at` names.
            claim: claim(ClaimKind::Runs),
            claim_heads: claim(ClaimKind::Heads),
            claim_follow: claim(ClaimKind::Follow),
            claim_unkeyed: claim(ClaimKind::Unkeyed),
            retry: format!(
                "INSERT INTO {t} ({row_columns}) SELECT {from_unnest} FROM {unnest} \
                 WHERE (SELECT set_config('jobrelay.ordering_lock', 'off', true)) IS NOT NULL"
            ),
            slot_held: "SELECT current_setting('jobrelay.slot_held', true)".to_owned(),
            dead_letter: format!(
                "INSERT INTO {d} ({row_columns}) SELECT {from_unnest} FROM {unnest}"
            ),
            // A row another worker claimed meanwhile is waited for (in `id` order, so two
            // settles never wait on each other in a cycle): if that worker commits, the row
            // is gone and nothing is deleted here; if it rolls back (its own hand-back failing
            // too, on the same full disk), the row is deleted here. Skipping it instead let two
            // workers hand the rows to each other until the markers expired, and the jobs were
            // pushed again (seen: 1,978 pushes for 999 jobs).
            settle_acknowledged: format!(
                "DELETE FROM {t} WHERE ctid = ANY(ARRAY(
                     SELECT ctid FROM {t} WHERE id = ANY($1::int8[]) ORDER BY id FOR UPDATE))"
            ),
            oldest_claimable: format!(
                "SELECT id, GREATEST(EXTRACT(EPOCH FROM now() - created_at)::float8, 0)
                 FROM {t} r
                 WHERE id >= $1::int8 AND available_at <= now() {due} AND isfinite(created_at)
                   AND (ordering_key IS NULL
                        OR ((run_at IS NULL OR run_at <= now())
                            AND NOT EXISTS (SELECT 1 FROM {t} p
                                            WHERE p.ordering_key = r.ordering_key AND p.id < r.id)
                            AND NOT EXISTS (SELECT 1 FROM {d} x
                                            WHERE x.ordering_key = r.ordering_key)))
                 ORDER BY id
                 LIMIT 1"
            ),
            claim_tag,
            // The tag last, after the flags: only named claims carry it (a constant per row).
            named_claims: ClaimKind::ALL.map(|kind| {
                format!(
                    "/* named */ {}, {claim_tag}::int8 AS statement",
                    claim(kind)
                )
            }),
        }
    }
}

/// `text` as an SQL string literal (a table name: letters, digits, `_` and `.` only).
pub(crate) fn sql_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::columns::{at, CLAIM_FLAGS, COLUMNS};

    /// `ClaimedRow` decodes the claim's `RETURNING` list by position: each position must hold
    /// what `columns::at` names it for.
    #[test]
    fn the_claim_returns_its_columns_and_flags_where_decoding_reads_them() {
        for (needs, kind) in ClaimNeeds::ALL
            .into_iter()
            .flat_map(|n| ClaimKind::ALL.map(|k| (n, k)))
        {
            let queries = Queries::for_needs(&TableName::default(), needs);
            let names = |claim: &str| -> Vec<String> {
                let returning = &claim[claim.rfind("RETURNING ").unwrap() + "RETURNING ".len()..];
                top_level_items(returning)
                    .into_iter()
                    .map(|item| item.split_whitespace().last().unwrap().to_owned())
                    .collect()
            };
            let unnamed = names(queries.claim_for(kind, false));
            let mut wanted: Vec<&str> = COLUMNS[CLAIMED].to_vec();
            wanted.extend(CLAIM_FLAGS);
            assert_eq!(unnamed, wanted, "{needs:?} {kind:?}");
            assert_eq!(
                (
                    &*unnamed[at::PAYLOAD],
                    &*unnamed[at::BURIED],
                    &*unnamed[at::CAPPED]
                ),
                ("payload", "buried", "capped")
            );
            // The named claim: the same, then its tag.
            let named = queries.claim_for(kind, true);
            wanted.push("statement");
            assert_eq!(names(named), wanted, "named {needs:?} {kind:?}");
            assert_eq!(names(named)[at::STATEMENT], "statement");
            let tag = format!("{}::int8 AS statement", queries.claim_tag);
            assert!(named.ends_with(&tag), "{named}");
        }
    }

    /// `list` split at its commas outside parentheses.
    fn top_level_items(list: &str) -> Vec<&str> {
        let (mut items, mut depth, mut start) = (Vec::new(), 0i32, 0);
        for (i, c) in list.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                ',' if depth == 0 => {
                    items.push(list[start..i].trim());
                    start = i + 1;
                }
                _ => {}
            }
        }
        items.push(list[start..].trim());
        items
    }
}
