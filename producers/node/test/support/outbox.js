// Everything a test file needs, real parts only: a fresh database, a random BullMQ prefix (the
// relay's namespace), the relay daemon on both, BullMQ's own Worker, Queue and QueueEvents.

import { randomBytes } from 'node:crypto';

import { Queue, QueueEvents, Worker } from 'bullmq';
import pg from 'pg';

import { OutboxQueue } from '@jobrelay/bullmq';

import { freshDatabase } from './database.js';
import { CONNECTION, deleteKeys } from './redis.js';
import { startRelay } from './relay.js';

/**
 * @typedef {{ id: string, name: string, data: any, attemptsMade: number, at: number,
 *   opts: Record<string, unknown> }} Run
 */

/** @param {{ table?: string }} [opts] another outbox table than pending_jobs */
export async function startOutbox({ table } = {}) {
  const database = await freshDatabase(table);
  const prefix = `jrnode${randomBytes(4).toString('hex')}`;
  const relay = startRelay(database.url, `${prefix}:`, table);
  const pool = new pg.Pool({ connectionString: database.url, max: 4 });
  // The database is dropped WITH (FORCE) at the end, which terminates any connection still
  // open on it; an idle client's error then is expected. At any other time it is the test's.
  let closing = false;
  pool.on('error', (e) => {
    if (!closing) throw e;
  });
  const closers = [];
  const keep = (thing) => {
    closers.push(() => thing.close());
    return thing;
  };
  return {
    url: database.url,
    pool,
    prefix,
    relayLog: relay.log,

    /** An OutboxQueue with this file's prefix. */
    queue: (name, opts = {}) => new OutboxQueue(name, { prefix, ...opts }),

    /** Runs `fn(client)` in BEGIN ... COMMIT (ROLLBACK if it throws). */
    async transaction(fn) {
      const client = await pool.connect();
      try {
        await client.query('BEGIN');
        const result = await fn(client);
        await client.query('COMMIT');
        return result;
      } catch (e) {
        await client.query('ROLLBACK');
        throw e;
      } finally {
        client.release();
      }
    },

    /** Rows not relayed yet. */
    async pending() {
      const { rows } = await pool.query('SELECT count(*)::int AS n FROM pending_jobs');
      return rows[0].n;
    },

    /** Rows the relay gave up on, with why. */
    async dead() {
      const { rows } = await pool.query('SELECT uuid, last_error FROM pending_jobs_dead');
      return rows;
    },

    /**
     * BullMQ's Worker on queue `name`, no options of its own; `runs` lists every attempt.
     * @param {string} name
     * @param {(job: import('bullmq').Job) => unknown} [processor]
     */
    async worker(name, processor = () => 'done', opts = {}) {
      /** @type {Run[]} */
      const runs = [];
      const worker = keep(
        new Worker(
          name,
          async (job) => {
            runs.push({
              id: job.id,
              name: job.name,
              data: job.data,
              attemptsMade: job.attemptsMade,
              at: Date.now(),
              opts: job.opts,
            });
            return processor(job);
          },
          { connection: CONNECTION, prefix, ...opts },
        ),
      );
      await worker.waitUntilReady();
      return { worker, runs };
    },

    /** BullMQ's own Queue on `name`, to look jobs up. */
    bullQueue: (name) => keep(new Queue(name, { connection: CONNECTION, prefix })),

    /** BullMQ's QueueEvents on `name`, reading its stream from the start. */
    async queueEvents(name) {
      const events = keep(
        new QueueEvents(name, { connection: CONNECTION, prefix, lastEventId: '0-0' }),
      );
      await events.waitUntilReady();
      return events;
    },

    async close() {
      closing = true;
      for (const close of closers.reverse()) {
        await close();
      }
      await relay.stop();
      await pool.end();
      await deleteKeys(`${prefix}:`);
      await database.drop();
    },
  };
}
