# The job hashes of the ids in the file PATH (with the payloads they were enqueued with), under
# the key prefix PREFIX: `data` through zlib.decompress and json.loads against the payload, the
# description against rq.utils.get_call_string(func, args, kwargs, max_length=75). Prints the
# count, the first mismatches and how many there are, as one line of JSON.
import json, os, zlib
from redis import Redis
from rq.utils import get_call_string
r = Redis.from_url(os.environ["JOBRELAY_TEST_REDIS"])
ids, payloads = json.load(open(PATH))
bad = []
for id, p in zip(ids, payloads):
    h = r.hgetall(PREFIX + "rq:job:" + id)
    f, inst, args, kwargs = json.loads(zlib.decompress(h[b"data"]))
    want = json.loads(p)
    if (f, inst, args, kwargs) != ("app.tasks.f", None, want["args"], want["kwargs"]):
        bad.append(["data", p])
    d = h[b"description"].decode()
    rq = get_call_string(f, args, kwargs, max_length=75)
    if d != rq:
        bad.append([d, rq])
print(json.dumps({"n": len(ids), "bad": bad[:5], "nbad": len(bad)}))
