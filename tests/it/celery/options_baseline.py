# The jobs of CASES (a JSON text: [[task, args, options], ...]) sent by celery's own client,
# apply_async with the same options, to the queue 'client' of BROKER (no worker there); prints
# one JSON line per job: its id and the epoch seconds just before and after the call (an
# `expires` in seconds counts from it).
import json, time
from celery import Celery
app = Celery('app', broker=BROKER)
app.conf.update(task_serializer='json', accept_content=['json'])
def run(*args, **kwargs):
    pass
for task, args, options in json.loads(CASES):
    if task not in app.tasks:
        app.task(name=task)(run)
    before = time.time()
    r = app.tasks[task].apply_async(args=json.loads(args), queue='client', **options)
    print(json.dumps({'id': r.id, 'before': before, 'after': time.time()}))
