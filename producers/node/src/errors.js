/**
 * The one error class of the package: a job or queue option that BullMQ or the outbox refuses,
 * thrown at the call, before anything reaches Postgres (the caller's transaction stays usable).
 * Where BullMQ's own `Queue` refuses the same thing, the message is BullMQ's, word for word.
 */
export class OutboxError extends Error {
  /** @param {string} message */
  constructor(message) {
    super(message);
    this.name = 'OutboxError';
  }
}
