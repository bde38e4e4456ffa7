# The job hashes of the queues a b c d emails, read by RQ: function, args, kwargs, meta,
# status, origin, and a description as RQ's own get_call_string makes it; and the same hash
# fields as a job that RQ's client enqueues. Prints the count, the first mismatches and how
# many there are, and how many jobs have a meta, as one line of JSON.
import json, os
from redis import Redis
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer
from rq.utils import get_call_string
r = Redis.from_url(os.environ["JOBRELAY_TEST_REDIS"])
own = Queue("shape", connection=r, serializer=JSONSerializer).enqueue("jobs.record", 1, meta={"k": "v"})
own_fields = sorted(k.decode() for k in r.hkeys(own.key))
own.delete()
bad, n, with_meta = [], 0, 0
for name in ["a", "b", "c", "d", "emails"]:
    q = Queue(name, connection=r, serializer=JSONSerializer)
    for job in q.get_jobs():
        n += 1
        want = get_call_string(job.func_name, job.args, job.kwargs, max_length=75)
        if job.description != want:
            bad.append([job.description, want])
        if job.get_status() != "queued" or job.origin != name or job.enqueued_at is None:
            bad.append([job.id, job.get_status(), job.origin])
        keys = sorted(k.decode() for k in r.hkeys(job.key))
        if job.meta:
            with_meta += 1
            if keys != own_fields:
                bad.append([keys, own_fields])
print(json.dumps({"n": n, "bad": bad[:5], "nbad": len(bad), "with_meta": with_meta}))
