// What BullMQ's own Queue refuses is refused at the call with BullMQ's message, word for word
// (each case is run through BullMQ 6.7's Queue too); what only the outbox cannot carry is
// refused with a message naming the option. A refusal runs no statement.

import assert from 'node:assert/strict';
import { randomBytes, randomUUID } from 'node:crypto';
import { after, test } from 'node:test';

import { Queue } from 'bullmq';

import { OutboxError, OutboxQueue, jobIdFromKey } from '@jobrelay/bullmq';

import { CONNECTION, deleteKeys } from './support/redis.js';

const prefix = `jrnode${randomBytes(4).toString('hex')}`;
after(() => deleteKeys(`${prefix}:`));

/** A client that records the statements it is given (none, for a refusal). */
function recorder() {
  const statements = [];
  return { statements, query: async (text, values) => statements.push([text, values]) };
}

/** BullMQ's message for `new Queue(name, { defaultJobOptions }).add(...)`. */
async function bullmqRefusal(name, defaultJobOptions, jobName, data, opts) {
  let queue;
  try {
    queue = new Queue(name, { connection: CONNECTION, prefix, defaultJobOptions });
    await queue.add(jobName, data, opts);
  } catch (e) {
    return e.message;
  } finally {
    await queue?.close();
  }
  assert.fail(`BullMQ took ${JSON.stringify(opts)}`);
}

async function outboxRefusal(name, defaultJobOptions, jobName, data, opts) {
  const db = recorder();
  try {
    const queue = new OutboxQueue(name, { prefix, defaultJobOptions });
    await queue.add(jobName, data, opts, db);
  } catch (e) {
    assert.ok(e instanceof OutboxError, `${e.name}: ${e.message}`);
    assert.deepEqual(db.statements, []);
    return e.message;
  }
  assert.fail(`the outbox took ${JSON.stringify(opts)}`);
}

const BULLMQ_REFUSES = [
  ['a queue name with :', 'emails:eu', {}, {}],
  ['no queue name', '', {}, {}],
  ["jobId '0'", 'emails', {}, { jobId: '0' }],
  ["a jobId starting with '0:'", 'emails', {}, { jobId: '0:x' }],
  ['an integer jobId', 'emails', {}, { jobId: '42' }],
  ['a jobId with :', 'emails', {}, { jobId: 'a:b' }],
  ['a float priority', 'emails', {}, { priority: 1.5 }],
  ['a priority above the limit', 'emails', {}, { priority: 2 ** 21 }],
  ['a float priority from the defaults', 'emails', { priority: 2.5 }, {}],
  ['a jitter above 1', 'emails', {}, { backoff: { type: 'fixed', delay: 10, jitter: 2 } }],
  ['debounce', 'emails', {}, { debounce: { id: 'x' } }],
  ['data over sizeLimit', 'emails', {}, { sizeLimit: 10 }],
];

for (const [what, name, defaults, opts] of BULLMQ_REFUSES) {
  test(`refused with BullMQ's own message: ${what}`, async () => {
    const data = { text: 'more than ten bytes of data' };
    const theirs = await bullmqRefusal(name, defaults, 'send', data, opts);
    const ours = await outboxRefusal(name, defaults, 'send', data, opts);
    assert.equal(ours, theirs);
  });
}

const ONLY_THE_OUTBOX_REFUSES = [
  ['a jobId that is not a uuid', {}, { jobId: 'welcome-42' }, /jobId "welcome-42" is not a uuid.*jobIdFromKey/],
  ['an upper-case uuid', {}, { jobId: randomUUID().toUpperCase() }, /is not a uuid.*lower case/],
  ['the nil uuid', {}, { jobId: '00000000-0000-0000-0000-000000000000' }, /not the nil uuid/],
  ['a negative priority', {}, { priority: -1 }, /^Priority should be between 0 and 2097151$/],
  ['repeat', {}, { repeat: { every: 1000 } }, /option "repeat" is not carried through the outbox/],
  ['parent', {}, { parent: { id: 'x', queue: 'bull:q' } }, /option "parent" is not carried/],
  ['deduplication', { deduplication: { id: 'd' } }, {}, /option "deduplication" is not carried/],
  ['attempts as a string', {}, { attempts: '3' }, /^option "attempts" must be an integer >= 0, not "3"$/],
  ['removeOnComplete as a string', {}, { removeOnComplete: 'yes' }, /option "removeOnComplete" must be/],
  ['a backoff without type', {}, { backoff: { delay: 5 } }, /option "backoff" must be/],
  ['a negative delay', {}, { delay: -5 }, /^option "delay" must be milliseconds \(a number >= 0\), not -5$/],
];

for (const [what, defaults, opts, message] of ONLY_THE_OUTBOX_REFUSES) {
  test(`refused by the outbox, naming the option: ${what}`, async () => {
    assert.match(await outboxRefusal('emails', defaults, 'send', {}, opts), message);
  });
}

test('a queue name or job name the outbox table would refuse', async () => {
  assert.match(await outboxRefusal('my emails', {}, 'send', {}, {}), /pending_jobs_queue_check/);
  assert.match(await outboxRefusal('emails', {}, '', {}, {}), /job name must be a string of 1 to 256/);
  assert.match(await outboxRefusal('emails', {}, 'x'.repeat(257), {}, {}), /1 to 256/);
  // 256 characters that are 512 UTF-16 units: what pending_jobs_job_type_check takes.
  const db = recorder();
  await new OutboxQueue('emails', { prefix }).add('\u{1F4E7}'.repeat(256), {}, undefined, db);
  assert.equal(db.statements.length, 1);
});

test('without the transaction client, add and addBulk say what they need', async () => {
  const queue = new OutboxQueue('emails', { prefix });
  await assert.rejects(queue.add('send', {}, {}), {
    name: 'TypeError',
    message: /OutboxQueue.add needs the transaction's client as its 4th argument/,
  });
  await assert.rejects(queue.addBulk([{ name: 'send', data: {} }]), /as its 2nd argument/);
});

test('addBulk: one refused job writes none of them', async () => {
  const db = recorder();
  const queue = new OutboxQueue('emails', { prefix });
  await assert.rejects(
    queue.addBulk(
      [
        { name: 'send', data: { n: 1 } },
        { name: 'send', data: { n: 2 }, opts: { jobId: '42' } },
      ],
      db,
    ),
    { message: 'Custom Id cannot be integers' },
  );
  assert.deepEqual(db.statements, []);
});

test('jobIdFromKey: a version 5 uuid, the same for the same key, taken as a jobId', async () => {
  const id = jobIdFromKey('welcome-42');
  assert.match(id, /^[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
  assert.equal(jobIdFromKey('welcome-42'), id);
  assert.notEqual(jobIdFromKey('welcome-43'), id);
  const db = recorder();
  const job = await new OutboxQueue('emails', { prefix }).add('send', {}, { jobId: id }, db);
  assert.equal(job.id, id);
  assert.equal(db.statements.length, 1);
});

test('options as BullMQ takes them: null or undefined for none, an object otherwise', async () => {
  const db = recorder();
  const queue = new OutboxQueue('emails', { prefix });
  await queue.add('send', {}, null, db);
  await queue.add('send', undefined, undefined, db);
  assert.equal(db.statements.length, 2);
  // Job.asJSON: undefined data is stored as {}.
  assert.equal(JSON.parse(db.statements[1][1][1])[0].data, '{}');
  await assert.rejects(queue.add('send', {}, 'fast', db), /job options must be an object/);
});

test("the options given BullMQ's Queue fit: connection is taken and unused, others refused", () => {
  const queue = new OutboxQueue('emails', { connection: CONNECTION, prefix: 'app' });
  assert.equal(queue.namespace, 'app:');
  assert.throws(() => new OutboxQueue('emails', { streams: { events: { maxLen: 10 } } }), {
    name: 'TypeError',
    message: /OutboxQueue option "streams" is not one of prefix, defaultJobOptions, table/,
  });
  assert.throws(() => new OutboxQueue('emails', { prefix: '' }), /prefix must be a non-empty/);
  assert.throws(() => new OutboxQueue('emails', { table: 'a;b' }), /as the relay's --table/);
});
