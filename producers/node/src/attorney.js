// Validates a queue's settings and each job's options once, at the call, as BullMQ 6.7's
// QueueBase constructor, Queue.addJob and Job.validateOptions do (their messages word for
// word), plus what the outbox itself needs (the pending_jobs checks, the uuid job id, the
// options the relay's bullmq layout carries): nothing invalid reaches the caller's transaction.

import { OutboxError } from './errors.js';

/** BullMQ's `PRIORITY_LIMIT` (src/classes/job.ts): 2 ** 21 - 1. */
export const PRIORITY_LIMIT = 2 ** 21 - 1;

/** The job options the relay's bullmq layout carries into the job's `opts`. */
export const CARRIED_OPTIONS = Object.freeze([
  'attempts',
  'backoff',
  'removeOnComplete',
  'removeOnFail',
  'lifo',
  'keepLogs',
  'stackTraceLimit',
  'priority',
]);

/** The options that become columns of the row (or are checked here) instead. */
export const PRODUCER_OPTIONS = Object.freeze(['jobId', 'delay', 'sizeLimit', 'orderingKey']);

/** The longest ordering key the outbox takes (its CHECK pending_jobs_ordering_key_check). */
const ORDERING_KEY_MAX = 256;

const QUEUE_NAME = /^[A-Za-z0-9_.-]{1,128}$/;
const TABLE = /^([A-Za-z_][A-Za-z0-9_]*\.)?[A-Za-z_][A-Za-z0-9_]{0,57}$/;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
const NIL_UUID = '00000000-0000-0000-0000-000000000000';

const show = (value) => (typeof value === 'string' ? JSON.stringify(value) : String(value));

/** @param {unknown} name */
export function checkQueueName(name) {
  if (!name) {
    throw new OutboxError('Queue name must be provided');
  }
  if (typeof name !== 'string') {
    throw new OutboxError(`Queue name must be a string, not ${show(name)}`);
  }
  if (name.includes(':')) {
    throw new OutboxError('Queue name cannot contain :');
  }
  if (!QUEUE_NAME.test(name)) {
    throw new OutboxError(
      `Queue name ${show(name)} does not fit the outbox: 1 to 128 of A-Z a-z 0-9 _ . - ` +
        '(pending_jobs_queue_check)',
    );
  }
}

/** @param {unknown} prefix */
export function checkPrefix(prefix) {
  if (typeof prefix !== 'string' || prefix === '') {
    throw new OutboxError(
      `prefix must be a non-empty string (BullMQ's default is "bull"), not ${show(prefix)}`,
    );
  }
}

/** @param {unknown} table */
export function checkTable(table) {
  if (typeof table !== 'string' || !TABLE.test(table)) {
    throw new OutboxError(
      `table must be name or schema.name of plain identifiers, as the relay's --table, not ${show(table)}`,
    );
  }
}

/** @param {unknown} name */
export function checkJobName(name) {
  // Postgres's char_length counts code points, not UTF-16 units.
  const length = typeof name === 'string' ? [...name].length : 0;
  if (length < 1 || length > 256) {
    throw new OutboxError(
      `job name must be a string of 1 to 256 characters (the row's job_type), not ${show(name)}`,
    );
  }
}

const isCount = (v) => Number.isInteger(v) && v >= 0;
const isKeepJobs = (v) =>
  typeof v === 'boolean' ||
  isCount(v) ||
  (isPlainObject(v) &&
    Object.entries(v).every(([k, x]) => (k === 'age' || k === 'count') && isCount(x)));

function isPlainObject(v) {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function isBackoff(v) {
  if (isCount(v)) {
    return true;
  }
  if (!isPlainObject(v) || typeof v.type !== 'string') {
    return false;
  }
  return Object.entries(v).every(
    ([k, x]) =>
      k === 'type' ||
      (k === 'delay' && isCount(x)) ||
      (k === 'jitter' && typeof x === 'number'),
  );
}

/** What each carried option must be, as the relay's layout checks it. */
const SHAPES = {
  attempts: [isCount, 'an integer >= 0'],
  keepLogs: [isCount, 'an integer >= 0'],
  stackTraceLimit: [isCount, 'an integer >= 0'],
  lifo: [(v) => typeof v === 'boolean', 'true or false'],
  removeOnComplete: [isKeepJobs, 'true, false, an integer >= 0 or { age: seconds, count: n }'],
  removeOnFail: [isKeepJobs, 'true, false, an integer >= 0 or { age: seconds, count: n }'],
  backoff: [
    isBackoff,
    "milliseconds (an integer >= 0) or { type: 'fixed' or 'exponential', delay: ms, jitter: 0..1 }",
  ],
  priority: [(v) => typeof v === 'number', `an integer from 0 to ${PRIORITY_LIMIT}`],
};

/**
 * BullMQ's own checks of a job id (Queue.addJob, Job.validateOptions), its messages.
 * @param {string} jobId
 */
function bullmqJobIdRules(jobId) {
  if (jobId === '0' || jobId.startsWith('0:')) {
    throw new OutboxError("JobId cannot be '0' or start with '0:'");
  }
  if (`${parseInt(jobId, 10)}` === jobId) {
    throw new OutboxError('Custom Id cannot be integers');
  }
  // "By using split we are still keeping compatibility with old repeatable jobs" (job.ts).
  if (jobId.includes(':') && jobId.split(':').length !== 3) {
    throw new OutboxError('Custom Id cannot contain :');
  }
}

/**
 * Checks a job id: BullMQ's rules, then the outbox's: the id is the row's uuid, so it must be
 * one, written as Postgres and the worker will show it.
 * @param {unknown} jobId
 */
export function checkJobId(jobId) {
  if (typeof jobId !== 'string') {
    throw new OutboxError(`jobId must be a string (a uuid), not ${show(jobId)}`);
  }
  bullmqJobIdRules(jobId);
  if (!UUID.test(jobId) || jobId === NIL_UUID) {
    throw new OutboxError(
      `jobId ${show(jobId)} is not a uuid: through the outbox the job id is the row's uuid ` +
        '(lower case, hyphenated, not the nil uuid), e.g. crypto.randomUUID(), or ' +
        'jobIdFromKey(key) for an id derived from a key of yours',
    );
  }
}

/**
 * Checks an ordering key (docs/guarantees.md#per-key-order), the row's `ordering_key`: a string
 * of 1 to 256 characters (code points, as Postgres's char_length counts) without NUL, which
 * Postgres text cannot hold. Undefined or null: no key.
 * @param {unknown} key
 */
export function checkOrderingKey(key) {
  if (key == null) {
    return;
  }
  const length = typeof key === 'string' ? [...key].length : 0;
  if (length < 1 || length > ORDERING_KEY_MAX || key.includes('\0')) {
    throw new OutboxError(
      `option "orderingKey" (the row's ordering_key) must be a string of 1 to ` +
        `${ORDERING_KEY_MAX} characters without NUL, not ${JSON.stringify(key)?.slice(0, 60)}`,
    );
  }
}

/**
 * Checks the merged options of one job (what BullMQ's Job would be given): first what BullMQ
 * refuses, in BullMQ's order and words, then what the outbox cannot carry. Returns the options
 * the row carries (its `options` column): the carried ones that are not undefined.
 * @param {string} name the job's name (for sizeLimit's message)
 * @param {string} data the job's data, serialized
 * @param {Record<string, unknown>} opts
 * @returns {Record<string, unknown>}
 */
export function checkJobOptions(name, data, opts) {
  const { jobId, delay, sizeLimit, priority, backoff } = opts;
  // BullMQ: Queue.addJob, then Job.validateOptions.
  if (typeof jobId === 'string' && (jobId === '0' || jobId.startsWith('0:'))) {
    bullmqJobIdRules(jobId);
  }
  if (isCount(sizeLimit) && sizeLimit && Buffer.byteLength(data, 'utf8') > sizeLimit) {
    throw new OutboxError(`The size of job ${name} exceeds the limit ${sizeLimit} bytes`);
  }
  if (typeof jobId === 'string' && jobId) {
    bullmqJobIdRules(jobId);
  }
  if (typeof priority === 'number' && priority) {
    if (Math.trunc(priority) !== priority) {
      throw new OutboxError('Priority should not be float');
    }
    // BullMQ checks the upper bound only; the relay refuses a negative priority, so does this.
    if (priority > PRIORITY_LIMIT || priority < 0) {
      throw new OutboxError(`Priority should be between 0 and ${PRIORITY_LIMIT}`);
    }
  }
  if (Object.prototype.hasOwnProperty.call(opts, 'debounce')) {
    throw new OutboxError('Debounce option has been removed. Use deduplication option instead');
  }
  if (isPlainObject(backoff) && typeof backoff.jitter === 'number') {
    if (backoff.jitter < 0 || backoff.jitter > 1) {
      throw new OutboxError('Jitter should be between 0 and 1');
    }
  }
  // The outbox.
  const carried = {};
  for (const [key, value] of Object.entries(opts)) {
    if (value === undefined) {
      continue;
    }
    if (CARRIED_OPTIONS.includes(key)) {
      const [fits, what] = SHAPES[key];
      if (!fits(value)) {
        throw new OutboxError(`option ${show(key)} must be ${what}, not ${JSON.stringify(value)}`);
      }
      carried[key] = value;
    } else if (!PRODUCER_OPTIONS.includes(key)) {
      throw new OutboxError(
        `option ${show(key)} is not carried through the outbox (jobrelay's bullmq layout); ` +
          `known: ${[...PRODUCER_OPTIONS, ...CARRIED_OPTIONS].join(', ')}`,
      );
    }
  }
  if (jobId !== undefined) {
    checkJobId(jobId);
  }
  if (delay !== undefined && !(typeof delay === 'number' && Number.isFinite(delay) && delay >= 0)) {
    throw new OutboxError(`option "delay" must be milliseconds (a number >= 0), not ${show(delay)}`);
  }
  checkOrderingKey(opts.orderingKey);
  if (sizeLimit !== undefined && !isCount(sizeLimit)) {
    throw new OutboxError(`option "sizeLimit" must be an integer >= 0, not ${show(sizeLimit)}`);
  }
  return carried;
}
