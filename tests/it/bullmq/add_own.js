// BullMQ's own Queue.add of the script test's two jobs, in the queue `own`: `send` now with
// the id A, `later` with the id B delayed by DELAY milliseconds.
const { Queue } = require('bullmq');
const connection = { host: '127.0.0.1', port: Number(process.env.JOBRELAY_TEST_PORT) };
(async () => {
  const q = new Queue('own', { connection, prefix: process.env.JOBRELAY_TEST_PREFIX });
  await q.add('send', { to: 'a@b.c', n: [1, 2.5] }, { jobId: A });
  await q.add('later', [1], { jobId: B, delay: DELAY });
  await q.close();
})().catch((e) => { console.error(e); process.exit(1); });
