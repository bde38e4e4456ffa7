// node-postgres, and anything with its `query(text, values)`: a PoolClient inside BEGIN/COMMIT,
// a Client, or an object of the caller's that runs the statement on its own transaction
// (Kysely, Drizzle: docs/producers/node.md).

/** @param {unknown} db */
export function isQueryable(db) {
  return typeof db === 'object' && db !== null && typeof db.query === 'function';
}

/**
 * @param {{ query(text: string, values: unknown[]): Promise<unknown> }} db
 * @returns {(text: string, values: unknown[]) => Promise<unknown>}
 */
export function fromQueryable(db) {
  return (text, values) => db.query(text, values);
}
