// Another outbox table: `table` is the relay's --table, for a second prefix beside the first.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { startOutbox } from './support/outbox.js';
import { waitFor } from './support/wait.js';

let outbox;
before(async () => {
  outbox = await startOutbox({ table: 'billing_jobs' });
});
after(() => outbox?.close());

test('jobs written to another table run through the relay given that --table', async () => {
  const { runs } = await outbox.worker('invoices');
  const invoices = outbox.queue('invoices', { table: 'billing_jobs' });
  const job = await outbox.transaction((c) => invoices.add('send', { n: 1 }, undefined, c));
  await waitFor('the job', () => runs.some((r) => r.id === job.id));
  const { rows } = await outbox.pool.query(
    'SELECT (SELECT count(*) FROM billing_jobs)::int AS billing, (SELECT count(*) FROM pending_jobs)::int AS pending',
  );
  assert.deepEqual(rows[0], { billing: 0, pending: 0 });
});
