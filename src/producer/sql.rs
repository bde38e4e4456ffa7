//! The producer's SQL, rendered once per outbox table. Each statement handles any number of
//! jobs through array parameters, so a batch costs one round trip whatever its size.

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
}

impl Sql {
    pub(super) fn new(table: &TableName) -> Self {
        let t = table.pending();
        Sql {
            insert: format!(
                "INSERT INTO {t} (uuid, queue, job_type, payload, parent_uuid, predecessor_uuid, \
                                  dead_parent, run_at, headers) \
                 SELECT u.uuid, u.queue, u.job_type, u.payload, u.parent_uuid, u.predecessor_uuid, \
                        u.dead_parent, u.run_at, u.headers::jsonb \
                 FROM unnest($1::uuid[], $2::text[], $3::text[], $4::bytea[], $5::uuid[], \
                             $6::uuid[], $7::bool[], $8::timestamptz[], $9::text[]) \
                      WITH ORDINALITY AS u(uuid, queue, job_type, payload, parent_uuid, \
                                           predecessor_uuid, dead_parent, run_at, headers, n) \
                 ORDER BY u.n \
                 RETURNING id, uuid, created_at"
            ),
            claim: format!(
                "SELECT p.id FROM {t} p \
                 JOIN unnest($1::int8[], $2::uuid[]) AS w(id, uuid) \
                   ON p.id = w.id AND p.uuid = w.uuid \
                 WHERE p.available_at <= now() \
                 FOR UPDATE OF p SKIP LOCKED"
            ),
            delete: format!(
                "DELETE FROM {t} p USING unnest($1::int8[], $2::uuid[]) AS w(id, uuid) \
                 WHERE p.id = w.id AND p.uuid = w.uuid"
            ),
        }
    }
}
