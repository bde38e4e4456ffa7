// Redis for the tests: BullMQ's connection options, and the removal of every key under a test's
// random prefix.

import { Redis } from 'ioredis';

export const CONNECTION = { host: '127.0.0.1', port: 6379, maxRetriesPerRequest: null };

/** Deletes every key that starts with `prefix`. */
export async function deleteKeys(prefix) {
  const redis = new Redis(CONNECTION);
  try {
    let cursor = '0';
    do {
      const [next, keys] = await redis.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 1000);
      cursor = next;
      if (keys.length > 0) {
        await redis.del(...keys);
      }
    } while (cursor !== '0');
  } finally {
    redis.disconnect();
  }
}
