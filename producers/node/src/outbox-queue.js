// OutboxQueue: BullMQ's producer surface (Queue's constructor, add, addBulk) writing rows into
// jobrelay's outbox table on the caller's Postgres transaction, for the relay (--layout bullmq)
// to push to Redis, where BullMQ's own Worker runs them.

import { executorFor } from './adapters/index.js';
import { checkPrefix, checkQueueName, checkTable } from './attorney.js';
import { toRow } from './job.js';
import { insertStatement, insertValues } from './statement.js';

export class OutboxQueue {
  /**
   * @param {string} name the BullMQ queue's name (no `:`, as BullMQ's Queue)
   * @param {{ prefix?: string, defaultJobOptions?: Record<string, unknown>, table?: string,
   *   connection?: unknown }} [opts]
   *   `prefix`: BullMQ's key prefix, default `bull`; the relay's `--namespace` must be it
   *   followed by `:` (see `namespace`). `defaultJobOptions`: merged under each job's options,
   *   as BullMQ merges them. `table`: the outbox table, the relay's `--table`, default
   *   `pending_jobs`. `connection`: ignored (the relay connects to Redis).
   */
  constructor(name, opts = {}) {
    checkQueueName(name);
    // `connection` is taken and not used, so that the options an app gives BullMQ's Queue (and
    // its Workers) can be given here unchanged: the relay holds the Redis connection.
    const { prefix = 'bull', defaultJobOptions = {}, table = 'pending_jobs', connection, ...rest } =
      opts;
    const unknown = Object.keys(rest);
    if (unknown.length > 0) {
      throw new TypeError(
        `OutboxQueue option ${JSON.stringify(unknown[0])} is not one of prefix, ` +
          'defaultJobOptions, table (and connection, which the relay uses instead)',
      );
    }
    checkPrefix(prefix);
    checkTable(table);
    if (typeof defaultJobOptions !== 'object' || defaultJobOptions === null) {
      throw new TypeError('defaultJobOptions must be an object');
    }
    // The defaults are checked once here, as if a job had no options of its own.
    toRow(defaultJobOptions, 'defaultJobOptions', {}, {});
    /** The queue's name. */
    this.name = name;
    /** BullMQ's key prefix. */
    this.prefix = prefix;
    /** The outbox table. */
    this.table = table;
    this.jobsOpts = { ...defaultJobOptions };
    this.statement = insertStatement(table);
  }

  /** The relay's `--namespace` for this queue's prefix: the prefix followed by `:`. */
  get namespace() {
    return `${this.prefix}:`;
  }

  /** A copy of the queue's default job options (BullMQ's `Queue.defaultJobOptions`). */
  get defaultJobOptions() {
    return { ...this.jobsOpts };
  }

  /**
   * Writes one job's row on the caller's transaction: the job exists if and only if that
   * transaction commits. Options are checked first; a refusal throws before any statement.
   * @param {string} name
   * @param {unknown} data
   * @param {Record<string, unknown> | undefined} opts
   * @param {unknown} db the transaction's client
   */
  async add(name, data, opts, db) {
    const execute = executorFor(db, 'add');
    const { row, merged } = toRow(this.jobsOpts, name, data, opts);
    await execute(this.statement, insertValues(this.name, [row]));
    return this.job(name, data, merged);
  }

  /**
   * Writes the rows of `jobs` on the caller's transaction with one statement, in order. Every
   * job is checked before it runs: one refusal writes none of them.
   * @param {{ name: string, data: unknown, opts?: Record<string, unknown> }[]} jobs
   * @param {unknown} db the transaction's client
   */
  async addBulk(jobs, db) {
    const execute = executorFor(db, 'addBulk');
    if (!Array.isArray(jobs)) {
      throw new TypeError('OutboxQueue.addBulk takes an array of { name, data, opts }');
    }
    const made = jobs.map((job) => {
      const { row, merged } = toRow(this.jobsOpts, job.name, job.data, job.opts);
      return { row, job: this.job(job.name, job.data, merged) };
    });
    if (made.length > 0) {
      await execute(
        this.statement,
        insertValues(
          this.name,
          made.map((m) => m.row),
        ),
      );
    }
    return made.map((m) => m.job);
  }

  /** What add returns: the job as its worker will see it (`id` is `job.id` there). */
  job(name, data, opts) {
    return Object.freeze({ id: opts.jobId, name, data, opts, queueName: this.name });
  }
}
