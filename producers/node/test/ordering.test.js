// opts.orderingKey is the row's ordering_key (not an option of the job): through the relay,
// BullMQ's Worker runs the later job of a key only after the earlier one, even when the earlier
// one is delayed; a bad key is refused at the call and writes nothing.

import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { after, before, test } from 'node:test';

import { OutboxError } from '@jobrelay/bullmq';

import { startOutbox } from './support/outbox.js';
import { waitFor } from './support/wait.js';

let outbox;
before(async () => {
  outbox = await startOutbox();
});
after(() => outbox?.close());

test('the row gets the key and the job its options without it', async () => {
  const billing = outbox.queue('billing', { defaultJobOptions: { attempts: 2 } });
  const client = await outbox.pool.connect();
  try {
    await client.query('BEGIN');
    await billing.add('charge', { n: 1 }, { orderingKey: 'customer-42' }, client);
    await billing.addBulk(
      [
        { name: 'charge', data: { n: 2 }, opts: { orderingKey: 'é'.repeat(256) } },
        { name: 'charge', data: { n: 3 }, opts: { orderingKey: undefined } },
        { name: 'charge', data: { n: 4 }, opts: { orderingKey: null } },
      ],
      client,
    );
    const { rows } = await client.query(
      'SELECT ordering_key, options FROM pending_jobs ORDER BY id',
    );
    assert.deepEqual(
      rows.map((r) => r.ordering_key),
      ['customer-42', 'é'.repeat(256), null, null],
    );
    assert.ok(rows.every((r) => JSON.stringify(r.options) === '{"attempts":2}'));
  } finally {
    await client.query('ROLLBACK');
    client.release();
  }
});

test('the later job of a key runs after the earlier one, delayed', async () => {
  const { runs } = await outbox.worker('ledger');
  const ledger = outbox.queue('ledger');
  const key = `customer-${randomUUID()}`;
  const start = Date.now();
  const [first, second, free] = await outbox.transaction(async (c) => [
    await ledger.add('post', { n: 1 }, { delay: 1500, orderingKey: key }, c),
    await ledger.add('post', { n: 2 }, { orderingKey: key }, c),
    await ledger.add('post', { n: 3 }, undefined, c),
  ]);
  await waitFor('the three jobs', () => runs.length >= 3, 15_000);
  // Unkeyed, the second job would run at once, before the first; keyed, it waits for it.
  assert.deepEqual(
    runs.map((r) => r.id),
    [free.id, first.id, second.id],
  );
  const secondRan = runs[2].at - start;
  assert.ok(secondRan >= 1500, `the second job ran ${secondRan} ms after the add`);
  assert.ok(runs.every((r) => !('orderingKey' in r.opts)), JSON.stringify(runs[1].opts));
});

test('a bad key is refused at the call, naming it, and writes nothing', async () => {
  const statements = [];
  const db = { query: async (text, values) => statements.push([text, values]) };
  const billing = outbox.queue('billing');
  for (const bad of ['', 'k'.repeat(257), 42, 'a\0b', ['k'], {}]) {
    await assert.rejects(
      billing.add('charge', {}, { orderingKey: bad }, db),
      (e) =>
        e instanceof OutboxError &&
        /^option "orderingKey" \(the row's ordering_key\) must be a string of 1 to 256/.test(
          e.message,
        ),
      JSON.stringify(bad),
    );
  }
  await assert.rejects(
    billing.addBulk(
      [
        { name: 'charge', data: {}, opts: { orderingKey: 'fine' } },
        { name: 'charge', data: {}, opts: { orderingKey: '' } },
      ],
      db,
    ),
    OutboxError,
  );
  assert.throws(
    () => outbox.queue('billing', { defaultJobOptions: { orderingKey: 7 } }),
    OutboxError,
  );
  assert.deepEqual(statements, []);
});
