// A BullMQ Worker on queue `opts`, concurrency 1, without worker-level removeOnComplete or
// removeOnFail (the jobs' own options decide): records each run (the job's id, name,
// attemptsMade, when it ran in ms); a job named `fail` throws. After EXPECTED runs and one more
// second, prints the runs as JSON and exits.
const { Worker } = require('bullmq');
const connection = { host: '127.0.0.1', port: Number(process.env.JOBRELAY_TEST_PORT) };
const prefix = process.env.JOBRELAY_TEST_PREFIX;
const runs = [];
(async () => {
  const w = await new Promise((resolve) => {
    const worker = new Worker('opts', async (job) => {
      runs.push({ id: job.id, name: job.name, attemptsMade: job.attemptsMade, at: Date.now() });
      if (runs.length === EXPECTED) setTimeout(() => resolve(worker), 1000);
      if (job.name === 'fail') throw new Error('fails on purpose');
      return 'ok';
    }, { connection, prefix, concurrency: 1 });
  });
  await w.close();
  console.log(JSON.stringify(runs));
})().catch((e) => { console.error(e); process.exit(1); });
