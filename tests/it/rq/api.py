# What RQ's API says of the queues and their registries, as one line of JSON: per queue `count`
# (Queue.count), `scheduled`, `finished`, `failed`, `deferred` (the registries' count).
import json, os
from redis import Redis
from rq import Queue
from rq.registry import FinishedJobRegistry, FailedJobRegistry, ScheduledJobRegistry, DeferredJobRegistry
from rq.serializers import JSONSerializer
r = Redis.from_url(os.environ["JOBRELAY_TEST_REDIS"])
out = {}
for q in Queue.all(connection=r, serializer=JSONSerializer):
    out[q.name] = {
        "count": q.count,
        "scheduled": ScheduledJobRegistry(queue=q).count,
        "finished": FinishedJobRegistry(queue=q).count,
        "failed": FailedJobRegistry(queue=q).count,
        "deferred": DeferredJobRegistry(queue=q).count,
    }
print(json.dumps(out, sort_keys=True))
