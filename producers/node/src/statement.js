// The one statement that writes a batch of jobs: one INSERT for any number of rows, its rows
// sent as a single JSON parameter (so any client that sends a parameter can run it), inserted
// in the batch's order.

/**
 * The INSERT into `table` (checked by the attorney: plain identifiers). $1 is the queue, $2 the
 * rows as a JSON array of `{ id, name, data, delay, opts, orderingKey }` (orderingKey absent:
 * no key). `run_at` is the database's clock at
 * the insert plus `delay` (BullMQ: the client's Date.now() at the add plus delay).
 * @param {string} table
 * @returns {string}
 */
export function insertStatement(table) {
  return `INSERT INTO ${table} (uuid, queue, job_type, payload, run_at, options, ordering_key)
SELECT (j->>'id')::uuid, $1, j->>'name', convert_to(j->>'data', 'UTF8'),
       CASE WHEN (j->>'delay')::float8 > 0
            THEN clock_timestamp() + (j->>'delay')::float8 * interval '1 millisecond' END,
       j->'opts', j->>'orderingKey'
FROM jsonb_array_elements($2::jsonb) WITH ORDINALITY AS batch(j, n)
ORDER BY n`;
}

/**
 * The statement's parameters for `rows` of `queue`.
 * @param {string} queue
 * @param {import('./job.js').JobRow[]} rows
 * @returns {[string, string]}
 */
export function insertValues(queue, rows) {
  return [queue, JSON.stringify(rows)];
}
