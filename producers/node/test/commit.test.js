// A committed add becomes one BullMQ job, run once by BullMQ's own Worker with its name, data
// and id, seen by QueueEvents as BullMQ's own add would be; removeOnComplete is honoured.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { jobIdFromKey } from '@jobrelay/bullmq';

import { startOutbox } from './support/outbox.js';
import { waitFor } from './support/wait.js';

let outbox;
before(async () => {
  outbox = await startOutbox();
});
after(() => outbox?.close());

test('each committed job runs once, with its name, data and the id add returned', async () => {
  const { runs } = await outbox.worker('emails');
  const emails = outbox.queue('emails');
  const jobs = await outbox.transaction(async (client) => {
    const added = [];
    for (let i = 0; i < 20; i++) {
      added.push(await emails.add('send-welcome', { userId: i, lang: 'de' }, undefined, client));
    }
    return added;
  });
  await waitFor('20 runs', () => runs.length >= 20);
  // One more job, committed after: once it has run, any second run of the 20 would have too.
  const last = await outbox.transaction((c) => emails.add('last', {}, undefined, c));
  await waitFor('the last job', () => runs.some((r) => r.id === last.id));
  assert.equal(runs.length, 21);
  for (const [i, job] of jobs.entries()) {
    const ran = runs.filter((r) => r.id === job.id);
    assert.equal(ran.length, 1, `job ${i} ran ${ran.length} times`);
    assert.equal(ran[0].name, 'send-welcome');
    assert.deepEqual(ran[0].data, { userId: i, lang: 'de' });
  }
  assert.equal(await outbox.pending(), 0);
  assert.deepEqual(await outbox.dead(), []);
});

test('QueueEvents sees added, waiting and completed for a relayed job', async () => {
  const events = await outbox.queueEvents('signups');
  const seen = [];
  for (const name of ['added', 'waiting', 'completed']) {
    events.on(name, (e) => seen.push([name, e.jobId, e.name ?? e.returnvalue]));
  }
  const { runs } = await outbox.worker('signups', (job) => `welcomed ${job.data.userId}`);
  const job = await outbox.transaction((c) =>
    outbox.queue('signups').add('welcome', { userId: 7 }, undefined, c),
  );
  await waitFor('completed', () => seen.some(([name]) => name === 'completed'));
  assert.deepEqual(
    seen.filter(([, id]) => id === job.id),
    [
      ['added', job.id, 'welcome'],
      ['waiting', job.id, undefined],
      ['completed', job.id, 'welcomed 7'],
    ],
  );
  assert.equal(runs.length, 1);
});

test('removeOnComplete leaves no completed job; without it the job stays completed', async () => {
  const reports = outbox.queue('reports');
  const { worker } = await outbox.worker('reports');
  const completed = [];
  worker.on('completed', (job) => completed.push(job.id));
  const [removed, kept] = await outbox.transaction(async (c) => [
    await reports.add('render', { n: 1 }, { removeOnComplete: true }, c),
    await reports.add('render', { n: 2 }, undefined, c),
  ]);
  await waitFor('both completed', () => completed.length === 2);
  const bull = outbox.bullQueue('reports');
  // The worker removes the job in the same script that completes it.
  await waitFor('the removed job gone', async () => (await bull.getJob(removed.id)) === undefined);
  assert.equal(await (await bull.getJob(kept.id)).getState(), 'completed');
  assert.equal(await bull.getCompletedCount(), 1);
});

test('a custom jobId is the job.id the worker sees; the same id added again runs once', async () => {
  const { runs } = await outbox.worker('invoices');
  const invoices = outbox.queue('invoices');
  const id = jobIdFromKey('invoice-2026-0042');
  // A retried transaction (or a second request) adds the same job again, as with BullMQ's own
  // add of an existing id: the relay's marker makes the second row a duplicate.
  for (const attempt of [1, 2]) {
    const job = await outbox.transaction((c) =>
      invoices.add('send-invoice', { attempt }, { jobId: id }, c),
    );
    assert.equal(job.id, id);
  }
  const last = await outbox.transaction((c) => invoices.add('last', {}, undefined, c));
  // Every row relayed (the duplicate too), and both jobs run.
  await waitFor(
    'both jobs run, the outbox empty',
    async () =>
      runs.some((r) => r.id === last.id) &&
      runs.some((r) => r.id === id) &&
      (await outbox.pending()) === 0,
  );
  // Once, from one of the two adds: the relay's workers may claim the two rows apart and push
  // the second first (BullMQ's own add keeps the first; docs/producers/node.md says so).
  const ofId = runs.filter((r) => r.id === id);
  assert.equal(ofId.length, 1, JSON.stringify(runs));
  assert.ok([1, 2].includes(ofId[0].data.attempt), JSON.stringify(runs));
  assert.deepEqual(runs.map((r) => r.id).sort(), [id, last.id].sort());
});
