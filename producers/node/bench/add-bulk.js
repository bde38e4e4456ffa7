// Producer throughput: OutboxQueue.addBulk into pending_jobs (each batch in its own
// transaction, the COMMIT included) against BullMQ's own Queue.addBulk to Redis, the same jobs.
// Alternating rounds; prints each round's jobs/s and the medians.
//
// Usage: node bench/add-bulk.js [--rounds 5] [--jobs 20000] [--batch 1000]
// Needs Postgres and Redis as the tests do (a fresh database, a random prefix; both removed).

import { randomBytes } from 'node:crypto';
import { parseArgs } from 'node:util';

import { Queue } from 'bullmq';
import pg from 'pg';

import { OutboxQueue } from '@jobrelay/bullmq';

import { freshDatabase } from '../test/support/database.js';
import { CONNECTION, deleteKeys } from '../test/support/redis.js';

const { values } = parseArgs({
  options: {
    rounds: { type: 'string', default: '5' },
    jobs: { type: 'string', default: '20000' },
    batch: { type: 'string', default: '1000' },
  },
});
const rounds = Number(values.rounds);
const total = Number(values.jobs);
const size = Number(values.batch);

const OPTS = { attempts: 3, backoff: { type: 'exponential', delay: 1000 }, removeOnComplete: true };
/** `total` jobs of about 200 bytes of data, in batches of `size`. */
const batches = [];
for (let i = 0; i < total; i += size) {
  batches.push(
    Array.from({ length: Math.min(size, total - i) }, (_, k) => ({
      name: 'send-welcome',
      data: { userId: i + k, email: `user${i + k}@example.com`, lang: 'de', note: 'x'.repeat(140) },
      opts: OPTS,
    })),
  );
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

const database = await freshDatabase();
const prefix = `jrbench${randomBytes(4).toString('hex')}`;
const pool = new pg.Pool({ connectionString: database.url, max: 1 });
const outbox = new OutboxQueue('emails', { prefix });
const bullmq = new Queue('emails', { connection: CONNECTION, prefix });
try {
  await bullmq.waitUntilReady();
  const results = { outbox: [], bullmq: [] };
  for (let round = 1; round <= rounds; round++) {
    const client = await pool.connect();
    let start = performance.now();
    for (const batch of batches) {
      await client.query('BEGIN');
      await outbox.addBulk(batch, client);
      await client.query('COMMIT');
    }
    const outboxRate = total / ((performance.now() - start) / 1000);
    client.release();
    start = performance.now();
    for (const batch of batches) {
      await bullmq.addBulk(batch);
    }
    const bullmqRate = total / ((performance.now() - start) / 1000);
    results.outbox.push(outboxRate);
    results.bullmq.push(bullmqRate);
    console.log(
      `round ${round}: OutboxQueue.addBulk ${outboxRate.toFixed(0)} jobs/s, ` +
        `BullMQ Queue.addBulk ${bullmqRate.toFixed(0)} jobs/s`,
    );
    await pool.query('TRUNCATE pending_jobs');
    await bullmq.obliterate({ force: true });
  }
  console.log(
    `median of ${rounds} (${total} jobs, batches of ${size}): ` +
      `OutboxQueue.addBulk ${median(results.outbox).toFixed(0)} jobs/s, ` +
      `BullMQ Queue.addBulk ${median(results.bullmq).toFixed(0)} jobs/s`,
  );
} finally {
  await bullmq.close();
  await pool.end();
  await deleteKeys(`${prefix}:`);
  await database.drop();
}
