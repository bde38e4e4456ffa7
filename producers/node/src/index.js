// @jobrelay/bullmq: BullMQ's Queue.add and addBulk on your Postgres transaction, through
// jobrelay's outbox (docs/producers/node.md).
//
// Layout: outbox-queue.js (the OutboxQueue class), job.js (options merged as BullMQ merges
// them, a job as its row), attorney.js (every check, with BullMQ's messages where BullMQ
// refuses the same), statement.js (the one INSERT), adapters/ (node-postgres, Knex, and any
// `query(text, values)`), job-id.js (uuids for keys of your own), errors.js.

export { OutboxQueue } from './outbox-queue.js';
export { OutboxError } from './errors.js';
export { jobIdFromKey } from './job-id.js';
export { CARRIED_OPTIONS, PRIORITY_LIMIT } from './attorney.js';
