"""The functions the real `rq worker --serializer json` of the tests runs."""

import time

from recorder import record
from rq import get_current_job


def _run(args, kwargs, outcome="ran"):
    job = get_current_job()
    record(
        id=job.id,
        task=job.func_name,
        args=list(args),
        kwargs=kwargs,
        outcome=outcome,
        queue=job.origin,
        meta=job.meta,
        timeout=job.timeout,
        result_ttl=job.result_ttl,
        failure_ttl=job.failure_ttl,
        ttl=job.ttl,
        retries_left=job.retries_left,
    )


def record_job(*args, **kwargs):
    _run(args, kwargs)


def fail(*args, **kwargs):
    _run(args, kwargs, "failed")
    raise RuntimeError("failing on purpose")


def sleep(seconds):
    _run([seconds], {}, "started")
    time.sleep(seconds)
    _run([seconds], {}, "slept")
