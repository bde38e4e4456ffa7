//! The relay's SQL, rendered once per table.

use crate::table::TableName;

/// Columns of a row handed back for a retry or a dead letter, in `unnest` order.
const ROW_COLUMNS: &str = "id, uuid, queue, job_type, payload, parent_uuid, predecessor_uuid, \
                           dead_parent, run_at, headers, created_at, attempts, available_at, last_error";

const UNNEST: &str = "unnest($1::int8[], $2::uuid[], $3::text[], $4::text[], $5::bytea[], \
                      $6::uuid[], $7::uuid[], $8::bool[], $9::timestamptz[], $10::text[], \
                      $11::timestamptz[], $12::int4[], $13::float8[], $14::text[]) \
                      AS u(id, uuid, queue, job_type, payload, parent_uuid, predecessor_uuid, \
                      dead_parent, run_at, headers, created_at, attempts, delay, last_error)";

const UNNEST_SELECT: &str = "u.id, u.uuid, u.queue, u.job_type, u.payload, u.parent_uuid, \
                             u.predecessor_uuid, u.dead_parent, u.run_at, u.headers::jsonb, \
                             u.created_at, u.attempts, now() + u.delay * interval '1 second', \
                             u.last_error";

/// SQL statements for one outbox table.
#[derive(Debug, Clone)]
pub struct Queries {
    /// Claims and deletes up to `$1` claimable rows in `id` order, skipping locked ones; when
    /// `$2` (seconds) is not null, only rows created at least that long ago. The delete only
    /// becomes visible at commit, which the relay issues after Redis acknowledged the jobs;
    /// until then the rows stay locked, and a rollback brings them back untouched.
    pub claim: String,
    /// Puts refused rows back with their new attempts, delay and error.
    pub retry: String,
    /// Moves rows to the dead-letter table.
    pub dead_letter: String,
}

impl Queries {
    /// Renders the statements for `table`.
    pub fn new(table: &TableName) -> Self {
        let t = table.pending();
        let d = table.dead();
        Queries {
            // The rows are locked in `id` order, then deleted by their tuple ids: a TID scan,
            // where joining on `id` would descend the primary key once more per row (measured:
            // half the statement's time for 1,000 rows). A locked row cannot move before the
            // delete; a row that another transaction updated after this statement's snapshot
            // is locked but not deleted, hence not returned, hence not pushed: it is claimed
            // again later. Rows come back in physical order; the relay sorts them by `id`.
            // `PendingRow` decodes the RETURNING list by position: keep the two in step.
            claim: format!(
                "DELETE FROM {t}
                 WHERE ctid = ANY(ARRAY(
                     SELECT ctid FROM {t}
                     WHERE available_at <= now()
                       AND ($2::float8 IS NULL OR created_at <= now() - $2 * interval '1 second')
                     ORDER BY id
                     LIMIT $1
                     FOR UPDATE SKIP LOCKED))
                 RETURNING id, uuid, queue, job_type, payload, parent_uuid, predecessor_uuid,
                           dead_parent, run_at, headers::text AS headers, created_at, attempts"
            ),
            retry: format!("INSERT INTO {t} ({ROW_COLUMNS}) SELECT {UNNEST_SELECT} FROM {UNNEST}"),
            dead_letter: format!(
                "INSERT INTO {d} ({ROW_COLUMNS}) SELECT {UNNEST_SELECT} FROM {UNNEST}"
            ),
        }
    }
}
