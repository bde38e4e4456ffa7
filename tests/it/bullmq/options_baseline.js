// BullMQ's own Queue.add of each of CASES (job options) in the queue `baseline`, with the
// job id `b<index>`.
const { Queue } = require('bullmq');
const connection = { host: '127.0.0.1', port: Number(process.env.JOBRELAY_TEST_PORT) };
(async () => {
  const q = new Queue('baseline', { connection, prefix: process.env.JOBRELAY_TEST_PREFIX });
  for (const [i, opts] of CASES.entries()) {
    await q.add('x', {}, { ...opts, jobId: `b${i}` });
  }
  await q.close();
})().catch((e) => { console.error(e); process.exit(1); });
