// addBulk writes any number of jobs with one statement, on the caller's transaction, in order;
// each job keeps its own options merged over the queue's defaults.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { startOutbox } from './support/outbox.js';
import { waitFor } from './support/wait.js';

let outbox;
before(async () => {
  outbox = await startOutbox();
});
after(() => outbox?.close());

test('500 jobs in one statement, run once each, in the order given', async () => {
  const queue = outbox.queue('bulk', { defaultJobOptions: { removeOnComplete: true } });
  const { runs } = await outbox.worker('bulk', undefined, { concurrency: 1 });
  const jobs = Array.from({ length: 500 }, (_, i) => ({
    name: i % 2 ? 'odd' : 'even',
    data: { i },
    opts: i === 7 ? { removeOnComplete: false } : undefined,
  }));
  let statements = 0;
  const added = await outbox.transaction(async (client) => {
    const counting = {
      query: (text, values) => {
        statements += 1;
        return client.query(text, values);
      },
    };
    return queue.addBulk(jobs, counting);
  });
  assert.equal(statements, 1);
  assert.equal(added.length, 500);
  assert.equal(new Set(added.map((j) => j.id)).size, 500);
  await waitFor('500 runs', () => runs.length >= 500, 30_000);
  assert.deepEqual(
    runs.map((r) => r.id),
    added.map((j) => j.id),
  );
  assert.deepEqual(
    runs.map((r) => [r.name, r.data.i]),
    jobs.map((j) => [j.name, j.data.i]),
  );
  // The one job whose own options kept it is the only completed job left.
  const bull = outbox.bullQueue('bulk');
  await waitFor('one completed job', async () => (await bull.getCompletedCount()) === 1);
  assert.equal(await (await bull.getJob(added[7].id)).getState(), 'completed');
  assert.equal(await outbox.pending(), 0);
});

test('an empty addBulk runs no statement', async () => {
  let statements = 0;
  const result = await outbox
    .queue('bulk')
    .addBulk([], { query: async () => (statements += 1) });
  assert.deepEqual(result, []);
  assert.equal(statements, 0);
});
