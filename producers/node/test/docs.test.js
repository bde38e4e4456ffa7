// The node-postgres example of docs/producers/node.md, run as it is written: its job runs in
// BullMQ's Worker with the data and options the page promises.

import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, test } from 'node:test';

import { startOutbox } from './support/outbox.js';
import { REPO } from './support/relay.js';
import { waitFor } from './support/wait.js';

const PAGE = join(REPO, 'docs/producers/node.md');

/** The page's js blocks. */
function jsBlocks() {
  return [...readFileSync(PAGE, 'utf8').matchAll(/^```js\n([\s\S]*?)^```$/gm)].map((m) => m[1]);
}

let outbox;
before(async () => {
  outbox = await startOutbox();
});
after(() => outbox?.close());

test("the page's node-postgres example adds a job that BullMQ's Worker runs", async () => {
  const example = jsBlocks().find((b) => b.includes('async function signUp'));
  assert.ok(example, `no signUp example in ${PAGE}`);
  const { runs } = await outbox.worker('emails');
  // Run as a module from this package's folder, so that '@jobrelay/bullmq' and 'pg' resolve.
  const child = execFile(process.execPath, ['--input-type=module'], {
    cwd: join(REPO, 'producers/node'),
    env: { ...process.env, DATABASE_URL: outbox.url, BULLMQ_PREFIX: outbox.prefix },
  });
  child.stdin.end(example);
  let stdout = '';
  child.stdout.on('data', (d) => (stdout += d));
  let stderr = '';
  child.stderr.on('data', (d) => (stderr += d));
  const code = await new Promise((done) => child.on('exit', done));
  assert.equal(code, 0, stderr);
  const id = stdout.trim();
  const run = await waitFor('the example job', () => runs.find((r) => r.id === id));
  assert.equal(run.name, 'send-welcome');
  assert.deepEqual(run.data, { userId: 1 });
  assert.equal(run.opts.attempts, 3);
  assert.deepEqual(run.opts.backoff, { type: 'exponential', delay: 1000 });
  assert.equal(run.opts.removeOnComplete, true);
});
