// A rolled-back add leaves nothing: no row, no job, no run. A refused add throws before any
// statement, so the caller's transaction is still usable.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { startOutbox } from './support/outbox.js';
import { waitFor } from './support/wait.js';

let outbox;
before(async () => {
  outbox = await startOutbox();
});
after(() => outbox?.close());

test('a rolled-back transaction runs nothing', async () => {
  const { runs } = await outbox.worker('billing');
  const billing = outbox.queue('billing');
  let rolledBack;
  await assert.rejects(
    outbox.transaction(async (client) => {
      rolledBack = await billing.add('charge', { cents: 500 }, { attempts: 3 }, client);
      throw new Error('the card was declined');
    }),
    /declined/,
  );
  // Jobs run in commit order on one queue: once this one has run, the other would have.
  const later = await outbox.transaction((c) => billing.add('charge', { cents: 1 }, undefined, c));
  await waitFor('the committed job', () => runs.some((r) => r.id === later.id));
  assert.deepEqual(
    runs.map((r) => r.id),
    [later.id],
  );
  const job = await outbox.bullQueue('billing').getJob(rolledBack.id);
  assert.equal(job, undefined);
  assert.equal(await outbox.pending(), 0);
});

test('a refused add leaves the transaction usable and writes nothing', async () => {
  const billing = outbox.queue('refusals');
  await outbox.transaction(async (client) => {
    await client.query('CREATE TABLE charges (cents int)');
    await assert.rejects(billing.add('charge', {}, { priority: 1.5 }, client), {
      name: 'OutboxError',
      message: 'Priority should not be float',
    });
    await client.query('INSERT INTO charges VALUES (1)');
  });
  const { rows } = await outbox.pool.query('SELECT count(*)::int AS n FROM charges');
  assert.equal(rows[0].n, 1);
  const { rows: jobs } = await outbox.pool.query(
    "SELECT count(*)::int AS n FROM pending_jobs WHERE queue = 'refusals'",
  );
  assert.equal(jobs[0].n, 0);
});
