// The queue's defaultJobOptions and the call's options reach the job as BullMQ's own Queue.add
// stores them, and BullMQ's Worker obeys them: attempts and backoff, a call overriding a default.

import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { after, before, test } from 'node:test';

import { startOutbox } from './support/outbox.js';
import { waitFor } from './support/wait.js';

let outbox;
before(async () => {
  outbox = await startOutbox();
});
after(() => outbox?.close());

const DEFAULTS = { attempts: 3, backoff: { type: 'fixed', delay: 200 }, removeOnFail: 10 };

test('attempts and backoff from defaultJobOptions: a failing job runs 3 times, 200 ms apart', async () => {
  const flaky = outbox.queue('flaky', { defaultJobOptions: DEFAULTS });
  const { worker, runs } = await outbox.worker('flaky', () => {
    throw new Error('boom');
  });
  const failed = new Set();
  worker.on('failed', (job) => job.attemptsMade >= (job.opts.attempts || 1) && failed.add(job.id));
  const [thrice, once] = await outbox.transaction(async (c) => [
    await flaky.add('fail', { n: 1 }, undefined, c),
    // The call's options override the queue's, member by member (BullMQ's shallow merge).
    await flaky.add('fail', { n: 2 }, { attempts: 1 }, c),
  ]);
  await waitFor('both failed for good', () => failed.has(thrice.id) && failed.has(once.id));
  const times = runs.filter((r) => r.id === thrice.id).map((r) => r.at);
  assert.equal(times.length, 3);
  for (let i = 1; i < times.length; i++) {
    const gap = times[i] - times[i - 1];
    assert.ok(gap >= 195 && gap < 2000, `attempt ${i + 1} came ${gap} ms after the one before`);
  }
  assert.equal(runs.filter((r) => r.id === once.id).length, 1);
  const job = await outbox.bullQueue('flaky').getJob(thrice.id);
  assert.equal(await job.getState(), 'failed');
  assert.equal(job.attemptsMade, 3);
});

test("the job's stored opts are those BullMQ's own Queue.add stores for the same call", async () => {
  const defaults = { ...DEFAULTS, keepLogs: 5 };
  const cases = [
    undefined,
    { attempts: 1 },
    { backoff: 300, removeOnComplete: { age: 60, count: 5 } },
    { lifo: true, stackTraceLimit: 2, removeOnFail: false },
    { delay: 60_000, backoff: { type: 'exponential', delay: 10, jitter: 0.5 } },
    { priority: 3 },
    { priority: 0, attempts: 2 },
  ];
  const outboxQueue = outbox.queue('stored', { defaultJobOptions: defaults });
  const ours = await outbox.transaction(async (c) => {
    const jobs = [];
    for (const opts of cases) {
      jobs.push(await outboxQueue.add('same', { x: 1 }, opts, c));
    }
    return jobs;
  });
  const bull = outbox.bullQueue('stored');
  // BullMQ's own add, same defaults, on a queue of the same prefix (no worker on either).
  const yardstick = outbox.bullQueue('yardstick');
  const theirs = [];
  for (const opts of cases) {
    const own = new (yardstick.constructor)('yardstick', {
      connection: yardstick.opts.connection,
      prefix: outbox.prefix,
      defaultJobOptions: defaults,
    });
    theirs.push(await own.add('same', { x: 1 }, { ...opts, jobId: randomUUID() }));
    await own.close();
  }
  for (const [i, job] of ours.entries()) {
    const stored = await waitFor(`job ${i} in Redis`, () => bull.getJob(job.id));
    const expected = await yardstick.getJob(theirs[i].id);
    const { jobId: a, ...storedOpts } = stored.opts;
    const { jobId: b, ...expectedOpts } = expected.opts;
    assert.equal(a, job.id);
    assert.ok(b);
    delete storedOpts.delay;
    delete expectedOpts.delay;
    assert.deepEqual(storedOpts, expectedOpts, `case ${i}: ${JSON.stringify(cases[i])}`);
    assert.equal(stored.data.x, 1);
    assert.equal(await stored.getState(), await expected.getState(), `case ${i}`);
  }
});

test('priority: BullMQ\'s Worker runs the jobs by priority, unprioritized first', async () => {
  const queue = outbox.queue('ranked');
  const added = await outbox.transaction((c) =>
    queue.addBulk(
      [
        { name: 'p5', data: {}, opts: { priority: 5 } },
        { name: 'none', data: {} },
        { name: 'p1', data: {}, opts: { priority: 1 } },
        { name: 'p3', data: {}, opts: { priority: 3 } },
      ],
      c,
    ),
  );
  const bull = outbox.bullQueue('ranked');
  // Every job in Redis before the worker starts, so that it chooses among all four.
  await waitFor('four jobs relayed', async () => (await bull.count()) === 4);
  const { runs } = await outbox.worker('ranked', undefined, { concurrency: 1 });
  await waitFor('four runs', () => runs.length === 4);
  assert.deepEqual(
    runs.map((r) => r.name),
    ['none', 'p1', 'p3', 'p5'],
  );
  assert.deepEqual(
    runs.map((r) => r.id).sort(),
    added.map((j) => j.id).sort(),
  );
});
