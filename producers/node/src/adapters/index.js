// The caller's transaction, whatever client it belongs to, as one function that runs a
// parameterised statement on it. The package never opens, commits or rolls back a transaction.

import { fromKnex, isKnex } from './knex.js';
import { fromQueryable, isQueryable } from './pg.js';

/**
 * @param {unknown} db
 * @param {string} method for the error: `add` or `addBulk`
 * @returns {(text: string, values: unknown[]) => Promise<unknown>}
 */
export function executorFor(db, method) {
  if (isKnex(db)) {
    return fromKnex(db);
  }
  if (isQueryable(db)) {
    return fromQueryable(db);
  }
  const which = method === 'add' ? '4th' : '2nd';
  throw new TypeError(
    `OutboxQueue.${method} needs the transaction's client as its ${which} argument: a ` +
      'node-postgres client inside BEGIN/COMMIT, a Knex transaction, or an object with ' +
      `query(text, values) that runs on the transaction; got ${db === null ? 'null' : typeof db}`,
  );
}
