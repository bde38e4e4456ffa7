# RQ's own client enqueues each of the cases in CASES_JSON (as the rows were: function, args,
# kwargs, options, headers, run_at in epoch seconds or 0) on the queue `client`, which no worker
# reads, with the same options by RQ's names (Queue.enqueue's job_timeout for timeout, Retry for
# retry, the headers and the meta option together as the meta); then prints, as one line of
# JSON, per case the relayed job hash (id RELAYED[i]) and RQ's: each field as text, `data`
# inflated, and the key's TTL as `__ttl__`.
import datetime, json, os, zlib
from redis import Redis
from rq import Queue, Retry
from rq.serializers import JSONSerializer

r = Redis.from_url(os.environ["JOBRELAY_TEST_REDIS"])
q = Queue("client", connection=r, serializer=JSONSerializer)


def rq_options(options, headers):
    kw = {}
    for name, value in options.items():
        if name == "timeout":
            kw["job_timeout"] = value
        elif name == "retry":
            kw["retry"] = Retry(**value)
        else:
            kw[name] = value
    if headers:
        kw["meta"] = {**headers, **options.get("meta", {})}
    return kw


def stored(key):
    h = {k.decode(): v for k, v in r.hgetall(key).items()}
    out = {k: v.decode() for k, v in h.items() if k != "data"}
    out["data"] = zlib.decompress(h["data"]).decode()
    out["__ttl__"] = r.ttl(key)
    return out


pairs = []
for relayed, (func, args, kwargs, options, headers, run_at) in zip(RELAYED, json.loads(CASES_JSON)):
    kw = rq_options(options, headers)
    if run_at:
        at = datetime.datetime.fromtimestamp(run_at, datetime.timezone.utc)
        job = q.enqueue_at(at, func, args=args, kwargs=kwargs, **kw)
    else:
        job = q.enqueue(func, args=args, kwargs=kwargs, **kw)
    pairs.append([stored("rq:job:" + relayed), stored(job.key)])
print(json.dumps(pairs))
