// One job as the outbox row holds it: BullMQ's merge of the queue's defaultJobOptions with the
// call's options (Queue.add, Queue.addBulk), checked, then split into the row's columns.

import { randomUUID } from 'node:crypto';

import { checkJobName, checkJobOptions } from './attorney.js';

/**
 * @typedef {object} JobRow
 * @property {string} id the row's uuid, the job id the worker sees
 * @property {string} name the row's job_type, the job's name
 * @property {string} data the row's payload: the data as BullMQ serializes it
 * @property {number} delay milliseconds from the insert to run_at; 0: no run_at
 * @property {Record<string, unknown>} opts the row's options column
 * @property {string} [orderingKey] the row's ordering_key; absent: no key
 */

/**
 * @param {Record<string, unknown>} defaults the queue's defaultJobOptions
 * @param {string} name
 * @param {unknown} data
 * @param {Record<string, unknown> | null | undefined} opts
 * @returns {{ row: JobRow, merged: Record<string, unknown> }}
 */
export function toRow(defaults, name, data, opts) {
  checkJobName(name);
  // BullMQ takes undefined or null for "no options".
  if (opts != null && (typeof opts !== 'object' || Array.isArray(opts))) {
    throw new TypeError(`job options must be an object, not ${JSON.stringify(opts)}`);
  }
  // Queue.add: `{ ...this.jobsOpts, ...opts, jobId }`: a queue default never gives the id.
  const merged = { ...defaults, ...opts, jobId: opts?.jobId };
  // Job.asJSON: `JSON.stringify(typeof data === 'undefined' ? {} : data)`.
  const serialized = JSON.stringify(data === undefined ? {} : data);
  if (serialized === undefined) {
    throw new TypeError(`job data of ${name} is not JSON-serializable (${typeof data})`);
  }
  const carried = checkJobOptions(name, serialized, merged);
  const id = merged.jobId ?? randomUUID();
  merged.jobId = id;
  return {
    row: {
      id,
      name,
      data: serialized,
      delay: merged.delay ?? 0,
      opts: carried,
      orderingKey: /** @type {string | undefined} */ (merged.orderingKey ?? undefined),
    },
    merged,
  };
}
