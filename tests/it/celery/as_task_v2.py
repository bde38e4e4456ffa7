# argsrepr and kwargsrepr as celery 5's AMQP.as_task_v2 makes them, for each [args, kwargs] (as
# JSON texts) of the file PATH; prints them as one JSON list.
import json
from celery import Celery
amqp = Celery('repr').amqp
out = []
for a, k in json.load(open(PATH)):
    h = amqp.as_task_v2('id', 'task', args=json.loads(a), kwargs=json.loads(k)).headers
    out.append([h['argsrepr'], h['kwargsrepr']])
print(json.dumps(out))
