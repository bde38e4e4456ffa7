// A fresh database per test file: a random name, `jobrelay migrate`, dropped after.

import { randomBytes } from 'node:crypto';

import pg from 'pg';

import { relayBinary, runRelay } from './relay.js';

export const SERVER = process.env.JOBRELAY_TEST_PG || 'postgres://postgres@127.0.0.1:5432';

async function admin(sql) {
  const client = new pg.Client({ connectionString: `${SERVER}/postgres` });
  await client.connect();
  try {
    await client.query(sql);
  } finally {
    await client.end();
  }
}

/**
 * Creates and migrates a database (with `jobrelay migrate --table TABLE` for another outbox
 * table); returns its URL and how to drop it.
 * @param {string} [table]
 */
export async function freshDatabase(table) {
  relayBinary(); // built first, if it must be, before there is a database to leave behind
  const name = `jobrelay_node_${randomBytes(6).toString('hex')}`;
  await admin(`CREATE DATABASE ${name}`);
  const url = `${SERVER}/${name}`;
  try {
    runRelay(table ? ['migrate', '--table', table] : ['migrate'], { DATABASE_URL: url });
  } catch (e) {
    await admin(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
    throw e;
  }
  return { name, url, drop: () => admin(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`) };
}
