// A Knex transaction: the rows commit and roll back with it.

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import knex from 'knex';

import { startOutbox } from './support/outbox.js';
import { waitFor } from './support/wait.js';

let outbox;
let db;
before(async () => {
  outbox = await startOutbox();
  db = knex({ client: 'pg', connection: outbox.url, pool: { min: 0, max: 2 } });
  await db.schema.createTable('users', (t) => {
    t.increments('id');
    t.text('email').notNullable();
  });
});
after(async () => {
  await db?.destroy();
  await outbox?.close();
});

test('add and addBulk on a Knex transaction run once it commits, and never if it rolls back', async () => {
  const emails = outbox.queue('emails', { defaultJobOptions: { attempts: 2 } });
  const { runs } = await outbox.worker('emails', undefined, { concurrency: 1 });
  await assert.rejects(
    db.transaction(async (trx) => {
      const [{ id }] = await trx('users').insert({ email: 'gone@example.com' }).returning('id');
      await emails.add('send-welcome', { userId: id }, undefined, trx);
      throw new Error('rolled back');
    }),
    /rolled back/,
  );
  const [one, two, three] = await db.transaction(async (trx) => {
    const [{ id }] = await trx('users').insert({ email: 'ada@example.com' }).returning('id');
    const first = await emails.add('send-welcome', { userId: id }, { delay: 10 }, trx);
    const more = await emails.addBulk(
      [
        { name: 'send-tip', data: { userId: id, tip: 1 } },
        { name: 'send-tip', data: { userId: id, tip: 2 }, opts: { attempts: 5 } },
      ],
      trx,
    );
    return [first, ...more];
  });
  await waitFor('three runs', () => runs.length >= 3);
  // The rolled-back job would have run before these: its row would have come first.
  assert.deepEqual(runs.map((r) => r.id).sort(), [one.id, two.id, three.id].sort());
  assert.deepEqual(
    runs.find((r) => r.id === three.id).data,
    { userId: 2, tip: 2 },
  );
  assert.equal(runs.find((r) => r.id === three.id).opts.attempts, 5);
  assert.equal(runs.find((r) => r.id === two.id).opts.attempts, 2);
  const { rows } = await outbox.pool.query('SELECT count(*)::int AS n FROM users');
  assert.equal(rows[0].n, 1);
});

test('the knex instance itself (no transaction) writes the row at once', async () => {
  const { runs } = await outbox.worker('direct');
  const job = await outbox.queue('direct').add('ping', { at: 1 }, undefined, db);
  await waitFor('the run', () => runs.some((r) => r.id === job.id));
});

test('a Knex of another dialect is refused', async () => {
  // Redshift: a dialect on the same driver (pg), so it loads here; not Postgres.
  const redshift = knex({ client: 'redshift', connection: outbox.url });
  await assert.rejects(outbox.queue('direct').add('ping', {}, undefined, redshift), {
    message: /a Knex of dialect "redshift" cannot write to the outbox/,
  });
  await redshift.destroy();
});
