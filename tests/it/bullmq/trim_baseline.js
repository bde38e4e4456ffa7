// JOBS jobs named NAME that BullMQ's own Queue.add writes into the queue `own`, whose events
// stream is trimmed to MAX_EVENTS.
const { Queue } = require('bullmq');
const connection = { host: '127.0.0.1', port: Number(process.env.JOBRELAY_TEST_PORT) };
(async () => {
  const q = new Queue('own', { connection, prefix: process.env.JOBRELAY_TEST_PREFIX,
    streams: { events: { maxLen: MAX_EVENTS } } });
  for (let i = 0; i < JOBS; i++) {
    await q.add(NAME, { i }, { jobId: require('crypto').randomUUID() });
  }
  await q.close();
})().catch((e) => { console.error(e); process.exit(1); });
