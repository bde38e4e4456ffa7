//! The producer's SQL, rendered once per outbox table. Each statement handles any number of
//! jobs through array parameters, so a batch costs one round trip whatever its size.

use crate::columns::{self, JOB};
use crate::table::TableName;

/// Statements for one outbox table.
#[derive(Debug)]
pub(crate) struct Sql {
    /// Inserts one row per array element, in array order (so `id` follows the order the jobs
    /// were added, which is the order the relay claims them), returning `id, uuid, created_at`.
    pub insert: String,
    /// Locks the given `(id, uuid)` rows that are claimable now, skipping rows a relay (or
    /// another fast path) holds; returns their ids.
    pub claim: String,
    /// Deletes the given `(id, uuid)` rows.
    pub delete: String,
    // `claim` and `delete` find their rows by `p.id = ANY($1)`, a condition on the outbox
    // alone, which the primary key answers row by row (joined only on `w.id`, a plan that
    // thinks the table small reads all of it, under the join). They run as unnamed
    // statements (`persistent(false)`), planned at each call for the table as it is then:
    // a plan cached while the table was nearly empty cannot outlive the next outage. The
    // planner sizes a table by its current pages, whatever its statistics, so a fresh plan
    // of this shape is an index scan per id (tests/it/relay/plans.rs).
}

impl Sql {
    pub(super) fn new(table: &TableName) -> Self {
        let t = table.pending();
        Sql {
            // `WITH ORDINALITY` numbers the elements, `n`: rows are inserted in array order.
            insert: format!(
                "INSERT INTO {t} ({columns}) SELECT {values} FROM {unnest} ORDER BY u.n \
                 RETURNING id, uuid, created_at",
                columns = columns::list(JOB),
                values = columns::from_unnest(JOB),
                unnest = columns::unnest_numbered(JOB),
            ),
            // A keyed row only at the head of its key: no earlier row of the key pending (in
            // this set or not: whether this claim got that one is not known here) or
            // dead-lettered (docs/guarantees.md#per-key-order). The relay takes the others.
            claim: format!(
                "SELECT p.id FROM {t} p \
                 JOIN unnest($1::int8[], $2::uuid[]) AS w(id, uuid) \
                   ON p.id = w.id AND p.uuid = w.uuid \
                 WHERE p.id = ANY($1::int8[]) AND p.available_at <= now() \
                   AND (p.ordering_key IS NULL \
                        OR ((p.run_at IS NULL OR p.run_at <= now()) \
                            AND NOT EXISTS (SELECT 1 FROM {t} e \
                                            WHERE e.ordering_key = p.ordering_key AND e.id < p.id) \
                            AND NOT EXISTS (SELECT 1 FROM {d} x \
                                            WHERE x.ordering_key = p.ordering_key))) \
                 FOR UPDATE OF p SKIP LOCKED",
                d = table.dead()
            ),
            delete: format!(
                "DELETE FROM {t} p USING unnest($1::int8[], $2::uuid[]) AS w(id, uuid) \
                 WHERE p.id = ANY($1::int8[]) AND p.id = w.id AND p.uuid = w.uuid"
            ),
        }
    }
}
