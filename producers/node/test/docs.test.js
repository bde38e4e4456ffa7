// Every js block of docs/producers/node.md is a whole program (node-postgres, Knex, Kysely,
// Drizzle): each is run as it is written, and the job whose id it printed runs in BullMQ's
// Worker with the data and options the page gives it.

import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, test } from 'node:test';

import { startOutbox } from './support/outbox.js';
import { REPO } from './support/relay.js';
import { waitFor } from './support/wait.js';

const PAGE = join(REPO, 'docs/producers/node.md');
const blocks = [...readFileSync(PAGE, 'utf8').matchAll(/^```js\n([\s\S]*?)^```$/gm)].map((m) => m[1]);

/** What each block's job must look like when it runs, by the client the block shows. */
const EXPECTED = [
  ['node-postgres', "from 'pg'", { userId: 1 }, { attempts: 3, removeOnComplete: true }],
  ['Knex', "from 'knex'", { userId: 1 }, { attempts: 2 }],
  ['Kysely', "from 'kysely'", { userId: 2 }, { attempts: 4 }],
  ['Drizzle', "from 'drizzle-orm'", { userId: 3 }, { attempts: 5 }],
];

let outbox;
let runs;
before(async () => {
  outbox = await startOutbox();
  ({ runs } = await outbox.worker('emails'));
});
after(() => outbox?.close());

/** Runs `source` as a module from this package's folder ('@jobrelay/bullmq' and 'pg' resolve). */
async function runModule(source) {
  const child = execFile(process.execPath, ['--input-type=module'], {
    cwd: join(REPO, 'producers/node'),
    env: { ...process.env, DATABASE_URL: outbox.url, BULLMQ_PREFIX: outbox.prefix },
  });
  child.stdin.end(source);
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d) => (stdout += d));
  child.stderr.on('data', (d) => (stderr += d));
  const code = await new Promise((done) => child.on('exit', done));
  assert.equal(code, 0, stderr);
  return stdout.trim();
}

test('the page has one block per client, in this order', () => {
  assert.equal(blocks.length, EXPECTED.length, `js blocks of ${PAGE}`);
  for (const [i, [client, marker]] of EXPECTED.entries()) {
    assert.ok(blocks[i].includes(marker), `block ${i + 1} is the ${client} one`);
  }
});

for (const [i, [client, , data, opts]] of EXPECTED.entries()) {
  test(`the page's ${client} program adds a job that BullMQ's Worker runs`, async () => {
    const id = await runModule(blocks[i]);
    const run = await waitFor(`the ${client} job`, () => runs.find((r) => r.id === id));
    assert.equal(run.name, 'send-welcome');
    assert.deepEqual(run.data, data);
    for (const [name, value] of Object.entries(opts)) {
      assert.deepEqual(run.opts[name], value, name);
    }
  });
}
