// 20 jobs named NAME that BullMQ's own Queue.add delays to DUE_MS (epoch milliseconds), over
// the queues a b c d, with the ids baseline-<i>; prints their ids.
const { Queue } = require('bullmq');
const connection = { host: '127.0.0.1', port: Number(process.env.JOBRELAY_TEST_PORT) };
(async () => {
  const qs = {};
  for (const n of ['a', 'b', 'c', 'd']) qs[n] = new Queue(n, { connection, prefix: process.env.JOBRELAY_TEST_PREFIX });
  for (let i = 0; i < 20; i++) {
    const job = await qs['abcd'[i % 4]].add(NAME, { baseline: i }, { jobId: 'baseline-' + i, delay: Math.max(1, DUE_MS - Date.now()) });
    console.log(job.id);
  }
  for (const q of Object.values(qs)) await q.close();
})().catch((e) => { console.error(e); process.exit(1); });
