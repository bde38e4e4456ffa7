// Job ids for keys of the application's own: through the outbox a BullMQ job id is the row's
// uuid, so a custom id such as `welcome-42` becomes a name-based (version 5) uuid of it.

import { createHash } from 'node:crypto';

/** The namespace of jobIdFromKey's uuids (a fixed, random v4 uuid). */
export const JOB_ID_NAMESPACE = '5f0b8b1e-8f3c-4a4e-9d53-2a1c3e7b6d90';

const namespaceBytes = Buffer.from(JOB_ID_NAMESPACE.replaceAll('-', ''), 'hex');

/**
 * The version 5 uuid of `key` (RFC 9562, SHA-1 in JOB_ID_NAMESPACE): the same key gives the
 * same job id, so a retried transaction that adds the job again makes a duplicate, not a
 * second job (while the relay's dedup marker lives).
 * @param {string} key
 * @returns {string}
 */
export function jobIdFromKey(key) {
  if (typeof key !== 'string' || key === '') {
    throw new TypeError(`jobIdFromKey needs a non-empty string, not ${String(key)}`);
  }
  const hash = createHash('sha1').update(namespaceBytes).update(key, 'utf8').digest();
  hash[6] = (hash[6] & 0x0f) | 0x50;
  hash[8] = (hash[8] & 0x3f) | 0x80;
  const hex = hash.subarray(0, 16).toString('hex');
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}
