# What RQ's API says of each job of IDS on the queue `opts`, as one line of JSON by id: null for
# a job whose hash is gone, else its status, the TTL of its hash, its exc_info, whether the
# failed and finished registries hold it, its description and meta.
import json, os
from redis import Redis
from rq import Queue
from rq.job import Job
from rq.registry import FailedJobRegistry, FinishedJobRegistry
from rq.serializers import JSONSerializer

r = Redis.from_url(os.environ["JOBRELAY_TEST_REDIS"])
q = Queue("opts", connection=r, serializer=JSONSerializer)
failed = set(FailedJobRegistry(queue=q).get_job_ids())
finished = set(FinishedJobRegistry(queue=q).get_job_ids())
out = {}
for id in IDS:
    if not r.exists("rq:job:" + id):
        out[id] = None
        continue
    job = Job.fetch(id, connection=r, serializer=JSONSerializer)
    out[id] = {
        "status": job.get_status(),
        "ttl": r.ttl(job.key),
        "exc_info": job.exc_info or "",
        "failed": id in failed,
        "finished": id in finished,
        "description": job.description,
        "meta": job.meta,
    }
print(json.dumps(out))
