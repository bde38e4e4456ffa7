"""The Celery app the real `celery worker` of the tests runs: tasks that record their runs."""

import os
import time

from celery import Celery
from celery.exceptions import SoftTimeLimitExceeded
from recorder import record

app = Celery("celery_worker_app", broker=os.environ["JOBRELAY_TEST_BROKER"])
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    broker_connection_retry_on_startup=True,
    broker_transport_options={"global_keyprefix": os.environ["JOBRELAY_TEST_KEYPREFIX"]},
)


def _run(request, name, args, kwargs, outcome="ran"):
    record(
        id=request.id,
        task=name,
        args=list(args),
        kwargs=kwargs,
        outcome=outcome,
        queue=(request.delivery_info or {}).get("routing_key"),
        timelimit=list(request.timelimit or (None, None)),
        expires=request.expires,
        traceparent=getattr(request, "traceparent", None),
        retries=request.retries,
    )


@app.task(name="tasks.record", bind=True)
def record_task(self, *args, **kwargs):
    _run(self.request, self.name, args, kwargs)


@app.task(name="tasks.routed", bind=True)
def routed_task(self, *args, **kwargs):
    _run(self.request, self.name, args, kwargs)


@app.task(name="tasks.sleep", bind=True)
def sleep_task(self, seconds):
    _run(self.request, self.name, [seconds], {}, "started")
    try:
        time.sleep(seconds)
    except SoftTimeLimitExceeded:
        _run(self.request, self.name, [seconds], {}, "soft time limit")
        return
    _run(self.request, self.name, [seconds], {}, "slept")
