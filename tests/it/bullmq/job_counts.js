// Queue.getJobCounts() of each queue of QUEUES, as one line of JSON.
const { Queue } = require('bullmq');
const connection = { host: '127.0.0.1', port: Number(process.env.JOBRELAY_TEST_PORT) };
(async () => {
  const out = {};
  for (const name of QUEUES) {
    const q = new Queue(name, { connection, prefix: process.env.JOBRELAY_TEST_PREFIX });
    out[name] = await q.getJobCounts('waiting', 'active', 'delayed', 'completed', 'failed', 'paused', 'prioritized');
    await q.close();
  }
  console.log(JSON.stringify(out));
})().catch((e) => { console.error(e); process.exit(1); });
