// opts.delay is the row's run_at: the job waits in BullMQ's delayed set and runs no earlier
// than asked.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { startOutbox } from './support/outbox.js';
import { waitFor } from './support/wait.js';

let outbox;
before(async () => {
  outbox = await startOutbox();
});
after(() => outbox?.close());

test('a delayed job runs no earlier than its delay after the add', async () => {
  const { runs } = await outbox.worker('reminders');
  const events = await outbox.queueEvents('reminders');
  const delayed = [];
  events.on('delayed', (e) => delayed.push(e.jobId));
  const reminders = outbox.queue('reminders');
  const start = Date.now();
  const [late, now] = await outbox.transaction(async (c) => [
    await reminders.add('remind', { n: 1 }, { delay: 1500 }, c),
    await reminders.add('remind', { n: 2 }, undefined, c),
  ]);
  await waitFor('the delayed job', () => runs.some((r) => r.id === late.id), 10_000);
  const ran = runs.find((r) => r.id === late.id).at;
  assert.ok(ran - start >= 1500, `ran ${ran - start} ms after the add`);
  assert.ok(ran - start < 5000, `ran ${ran - start} ms after the add`);
  // The undelayed one ran first, at once; the delayed one went through the delayed set.
  assert.deepEqual(
    runs.map((r) => r.id),
    [now.id, late.id],
  );
  assert.deepEqual(delayed, [late.id]);
});
