# 20 jobs of jobs.record that RQ's own client schedules (Queue.enqueue_at) for DUE (epoch
# seconds), over the queues a b c d; prints their ids.
import datetime, os
from redis import Redis
from rq import Queue
from rq.serializers import JSONSerializer
r = Redis.from_url(os.environ['JOBRELAY_TEST_REDIS'])
due = datetime.datetime.fromtimestamp(DUE, datetime.timezone.utc)
for i in range(20):
    q = Queue('abcd'[i % 4], connection=r, serializer=JSONSerializer)
    print(q.enqueue_at(due, 'jobs.record', 'baseline', i).id)
