// Checked by `tsc --noEmit` (npm run lint): the declarations accept what the docs show and
// refuse what they should.
import pg from 'pg';
import knex from 'knex';

import { OutboxQueue, OutboxError, jobIdFromKey, type OutboxJob } from '@jobrelay/bullmq';

interface Welcome {
  userId: number;
}

const queue = new OutboxQueue<Welcome, 'send-welcome'>('emails', {
  prefix: 'bull',
  defaultJobOptions: { attempts: 3, backoff: { type: 'exponential', delay: 1000 } },
});
const namespace: string = queue.namespace;

async function withPg(pool: pg.Pool): Promise<string> {
  const client = await pool.connect();
  const job: OutboxJob<Welcome, 'send-welcome'> = await queue.add(
    'send-welcome',
    { userId: 1 },
    { delay: 500, removeOnComplete: { age: 60 }, jobId: jobIdFromKey('welcome-1') },
    client,
  );
  await queue.add('send-welcome', { userId: 2 }, undefined, pool);
  await queue.addBulk([{ name: 'send-welcome', data: { userId: 3 }, opts: { priority: 1 } }], client);
  await queue.add('send-welcome', { userId: 4 }, { orderingKey: 'user-4', delay: 100 }, client);
  // @ts-expect-error an ordering key is a string
  await queue.add('send-welcome', { userId: 4 }, { orderingKey: 4 }, client);
  // @ts-expect-error the data's type
  await queue.add('send-welcome', { user: 1 }, {}, client);
  // @ts-expect-error the name's type
  await queue.add('other', { userId: 1 }, {}, client);
  // @ts-expect-error an option BullMQ has but the outbox does not carry
  await queue.add('send-welcome', { userId: 1 }, { repeat: { every: 1000 } }, client);
  // @ts-expect-error no transaction
  await queue.add('send-welcome', { userId: 1 }, {});
  return job.id;
}

async function withKnex(db: knex.Knex): Promise<void> {
  await db.transaction(async (trx) => {
    await queue.add('send-welcome', { userId: 1 }, {}, trx);
  });
  await queue.addBulk([], db);
}

const custom = {
  query: (text: string, values: unknown[]) => Promise.resolve({ text, values }),
};
void queue.add('send-welcome', { userId: 1 }, undefined, custom);

const e: Error = new OutboxError('x');
void [withPg, withKnex, namespace, e];
