// Waiting on a condition with a deadline: no test sleeps for a fixed time.

import { setTimeout as sleep } from 'node:timers/promises';

/**
 * Polls `condition` (sync or async) every 20 ms until it returns a truthy value, which it
 * returns; throws naming `what` after `timeout` ms.
 * @template T
 * @param {string} what
 * @param {() => T | Promise<T>} condition
 * @param {number} [timeout]
 * @returns {Promise<T>}
 */
export async function waitFor(what, condition, timeout = 15_000) {
  const deadline = Date.now() + timeout;
  for (;;) {
    const value = await condition();
    if (value) {
      return value;
    }
    if (Date.now() > deadline) {
      throw new Error(`timed out after ${timeout} ms waiting for ${what}`);
    }
    await sleep(20);
  }
}
