"""RQ: `Queue.enqueue`, `enqueue_call`, `enqueue_in` and `enqueue_at` inside a database
transaction write an outbox row instead of writing to Redis.

`jobrelay.rq.Queue` is RQ's `Queue` (same constructor, same methods, `enqueue_many` too, RQ's
JSON serializer by default, which the relay's `--layout rq` and `rq worker --serializer json`
use). RQ builds the
job as usual (its id, `job_timeout`, `result_ttl`, `ttl`, `failure_ttl`, `Retry`, `meta`,
`description`); where RQ would save it to Redis (`enqueue_job`, `schedule_job`), inside a
transaction the job becomes a row: `job_type` the function's import path, `uuid` the job id,
`payload` the args and kwargs, `run_at` the time of `enqueue_at`/`enqueue_in`, `options` the
job's options that differ from RQ's defaults. The `Job` returned has the id the worker sees;
it is not in Redis until the relay has pushed it. Outside a transaction RQ's own enqueue runs.

`ordering_key=` (`enqueue`, `enqueue_call`, `enqueue_in`, `enqueue_at`) is taken out of the call,
so that it never reaches the function's kwargs, and becomes the row's `ordering_key`; outside
a transaction it is dropped (a job RQ enqueues at once has no order to keep).

Dependencies (`depends_on`), callbacks (`on_success`, ...), webhooks and `Repeat` are refused
at the call (`jobrelay.errors.Unsupported`): the relay's rq layout does not write them.
"""

from __future__ import annotations

import calendar
import json
import time
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from datetime import datetime, timedelta, timezone
from typing import Any

from rq import Queue as _Queue
from rq.job import Job as _RqJob
from rq.queue import EnqueueData
from rq.serializers import JSONSerializer

from . import outbox
from ._job import Job, args_kwargs_payload, checked_ordering_key
from .errors import Unsupported

_RQ_DEFAULT_TIMEOUT = 180

#: The ordering key of the enqueue call under way, for the row `enqueue_job` or `schedule_job`
#: writes (RQ's own methods in between know nothing of it).
_ordering_key: ContextVar[str | None] = ContextVar("jobrelay_rq_ordering_key", default=None)


def _keyed(key: Any, call: Callable[..., Any], *args: Any, **kwargs: Any) -> _RqJob:
    """`call(*args, **kwargs)` with `key` as the ordering key of the job it enqueues; with no
    key (`None`), the key of the enqueue call it is part of (`enqueue_in` calls `enqueue_at`)."""
    if key is None:
        job: _RqJob = call(*args, **kwargs)
        return job
    token = _ordering_key.set(checked_ordering_key(key))
    try:
        job = call(*args, **kwargs)
        return job
    finally:
        _ordering_key.reset(token)


class Queue(_Queue):
    """RQ's `Queue`, writing into the outbox inside a transaction."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("serializer", JSONSerializer)
        super().__init__(*args, **kwargs)

    def enqueue(self, f: Any, *args: Any, ordering_key: str | None = None, **kwargs: Any) -> _RqJob:
        return _keyed(ordering_key, super().enqueue, f, *args, **kwargs)

    def enqueue_call(self, *args: Any, ordering_key: str | None = None, **kwargs: Any) -> _RqJob:
        return _keyed(ordering_key, super().enqueue_call, *args, **kwargs)

    def enqueue_at(
        self, datetime: datetime, f: Any, *args: Any, ordering_key: str | None = None, **kwargs: Any
    ) -> _RqJob:
        return _keyed(ordering_key, super().enqueue_at, datetime, f, *args, **kwargs)

    def enqueue_job(
        self, job: _RqJob, pipeline: Any = None, at_front: bool = False, unique: bool = False
    ) -> _RqJob:
        # A synchronous queue (`is_async=False`, as in tests) runs the job now, as RQ does.
        transaction = outbox.route() if self._is_async else None
        if transaction is None:
            return super().enqueue_job(job, pipeline=pipeline, at_front=at_front, unique=unique)
        job.origin = self.name
        outbox.write(transaction, job_row(job, self.name, run_at=None, at_front=at_front))
        return job

    def enqueue_many(
        self, job_datas: Iterable[EnqueueData], pipeline: Any = None, group_id: str | None = None
    ) -> list[_RqJob]:
        """RQ's `enqueue_many`: inside a transaction, every job in one `INSERT`."""
        transaction = outbox.route() if self._is_async else None
        if transaction is None:
            return super().enqueue_many(job_datas, pipeline=pipeline, group_id=group_id)
        if group_id is not None:
            raise Unsupported("RQ's groups (enqueue_many's group_id) are not relayed by jobrelay")
        jobs = []
        with outbox.bulk(transaction):
            for data in job_datas:
                job = self.create_job(
                    data.func,
                    args=data.args,
                    kwargs=data.kwargs,
                    timeout=data.timeout,
                    result_ttl=data.result_ttl,
                    ttl=data.ttl,
                    failure_ttl=data.failure_ttl,
                    description=data.description,
                    depends_on=data.depends_on,
                    job_id=data.job_id,
                    meta=data.meta,
                    retry=data.retry,
                    repeat=data.repeat,
                    on_success=data.on_success,
                    on_failure=data.on_failure,
                    on_stopped=data.on_stopped,
                    webhooks=data.webhooks,
                )
                jobs.append(self.enqueue_job(job, at_front=bool(data.at_front)))
        return jobs

    def schedule_job(
        self, job: _RqJob, datetime: datetime, pipeline: Any = None, unique: bool = False
    ) -> _RqJob:
        transaction = outbox.route()
        if transaction is None:
            return super().schedule_job(job, datetime, pipeline=pipeline, unique=unique)
        job.origin = self.name
        at_front = bool(job.enqueue_at_front)
        outbox.write(transaction, job_row(job, self.name, run_at=datetime, at_front=at_front))
        return job


def job_row(job: _RqJob, queue: str, *, run_at: datetime | None, at_front: bool) -> Job:
    """The outbox row of an RQ job built by `Queue.create_job`."""
    name = job.func_name
    if name is None:
        raise Unsupported(f"RQ job {job.id}: no function to call")
    _refuse_unsupported(job, name)
    return Job(
        queue=queue,
        job_type=name,
        payload=args_kwargs_payload(name, job.args, job.kwargs),
        uuid=job.id,
        run_at=_aware(run_at),
        options=_job_options(job, at_front),
        ordering_key=_ordering_key.get(),
    )


def _refuse_unsupported(job: _RqJob, name: str) -> None:
    if job.instance is not None:
        raise Unsupported(
            f"RQ job {name!r} calls a method of an instance; the relay writes JSON jobs that "
            "name a function by its import path"
        )
    for present, what in (
        (job._dependency_ids, "depends_on"),
        (job._success_callback_name, "on_success"),
        (job._failure_callback_name, "on_failure"),
        (job._stopped_callback_name, "on_stopped"),
        (job.webhooks, "webhooks"),
        (job.repeats_left, "repeat"),
    ):
        if present:
            raise Unsupported(
                f"RQ job {name!r}: {what} is not relayed by jobrelay's rq layout; "
                "enqueue without it (or enqueue the follow-up job from the job itself)"
            )


def _job_options(job: _RqJob, at_front: bool) -> dict[str, Any]:
    """The rq layout's options that differ from what RQ writes for a job with defaults."""
    options: dict[str, Any] = {}
    if job.timeout is not None and job.timeout != _RQ_DEFAULT_TIMEOUT:
        options["timeout"] = job.timeout
    for name in ("result_ttl", "ttl", "failure_ttl"):
        value = getattr(job, name)
        if value is not None:
            options[name] = value
    if job.retries_left:
        retry: dict[str, Any] = {
            "max": job.retries_left,
            "interval": list(job.retry_intervals or [0]),
        }
        if job.enqueue_at_front_on_retry:
            retry["enqueue_at_front"] = True
        options["retry"] = retry
    if job.description is not None and job.description != job.get_call_string():
        options["description"] = job.description
    if at_front:
        options["at_front"] = True
    if job.meta:
        try:
            json.dumps(job.meta)
        except (TypeError, ValueError) as err:
            raise Unsupported(f"RQ job {job.func_name!r}: its meta is not JSON: {err}") from None
        options["meta"] = dict(job.meta)
    return options


def _aware(when: datetime | None) -> datetime | None:
    """RQ reads a naive time as the machine's local time (`ScheduledJobRegistry.schedule`)."""
    if when is None or when.tzinfo is not None:
        return when
    offset = -(time.timezone if time.daylight == 0 else time.altzone)
    local = when.replace(tzinfo=timezone(timedelta(seconds=offset)))
    return datetime.fromtimestamp(calendar.timegm(local.utctimetuple()), timezone.utc).replace(
        microsecond=when.microsecond
    )
