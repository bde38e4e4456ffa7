// Knex (its Postgres client): a transaction (`knex.transaction(async (trx) => ...)`) or the
// knex instance itself. Knex's raw SQL takes `?` placeholders, bound in order.

/** @param {unknown} db */
export function isKnex(db) {
  return (
    typeof db === 'function' &&
    typeof db.raw === 'function' &&
    typeof db.client === 'object' &&
    db.client !== null
  );
}

/**
 * @param {any} db a Knex instance or transaction
 * @returns {(text: string, values: unknown[]) => Promise<unknown>}
 */
export function fromKnex(db) {
  const dialect = db.client.dialect;
  if (dialect !== 'postgresql') {
    throw new TypeError(
      `a Knex of dialect ${JSON.stringify(dialect)} cannot write to the outbox: it is a Postgres table`,
    );
  }
  return (text, values) => {
    const order = [];
    const sql = text.replace(/\$(\d+)/g, (_, n) => {
      order.push(values[Number(n) - 1]);
      return '?';
    });
    return db.raw(sql, order);
  };
}
