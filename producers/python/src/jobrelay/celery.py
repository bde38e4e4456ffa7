"""Celery: `delay`, `apply_async`, `send_task` and `signature(...).apply_async()` inside a
database transaction write an outbox row instead of publishing.

`install(app)` wraps the app's `amqp.send_task_message`, the point where Celery has built the
whole task message (its id, the `countdown`/`eta`, `expires`, time limits, headers) and routed
it (`task_routes`, `queue=`), and where it would publish. Inside a transaction the message
becomes a row for the relay's `--layout celery`: `job_type` the task name, `queue` the routed
queue, `uuid` the task id (the `AsyncResult`'s id is the id the worker sees), `payload` the args
and kwargs as Celery's own JSON encoder writes them, `run_at` the ETA, `headers` the custom
headers, `options` the task options the layout carries, `ordering_key` the call's
`ordering_key=` (`apply_async`, `send_task`, a signature's `set`). Outside a transaction the call
goes on to Celery's own publish (or as `jobrelay.configure(outside_transaction=...)` says),
without the ordering key: a task published at once has no order to keep.

Chains, groups, chords and `link`/`link_error` callbacks travel inside Celery's message body,
which the relay does not write: they are refused at the call (`jobrelay.errors.Unsupported`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from celery import signals

from . import outbox
from ._job import Job, args_kwargs_payload, checked_ordering_key
from .errors import JobError, Unsupported

#: Celery's own message headers; a custom header of one of these names is not a custom header.
_CELERY_HEADERS = frozenset(
    [
        "lang",
        "task",
        "id",
        "shadow",
        "eta",
        "expires",
        "group",
        "group_index",
        "retries",
        "timelimit",
        "root_id",
        "parent_id",
        "argsrepr",
        "kwargsrepr",
        "origin",
        "ignore_result",
        "replaced_task_nesting",
        "stamped_headers",
        "stamps",
    ]
)


def install(app: Any) -> None:
    """Route the app's task messages through the outbox when sent inside a transaction.

    Call it once where the app is made (Django: in `proj/celery.py`, after
    `app.config_from_object(...)`). Calling it again changes nothing.
    """
    amqp = app.amqp
    if getattr(amqp.send_task_message, "_jobrelay", False):
        return
    if int(app.conf.task_protocol) != 2:
        raise JobError(
            f"jobrelay relays Celery's task message protocol 2; this app uses "
            f"task_protocol={app.conf.task_protocol}"
        )
    publish = amqp.send_task_message

    @functools.wraps(publish)
    def send_task_message(producer: Any, name: str, message: Any, **options: Any) -> Any:
        # `apply_async(..., ordering_key=...)` arrives among the publish options, which Celery
        # would hand to kombu as message properties: it is the row's column, nothing else's.
        ordering_key = checked_ordering_key(options.pop("ordering_key", None))
        transaction = outbox.route()
        if transaction is None:
            return publish(producer, name, message, **options)
        headers, properties, body, _sent_event = message
        _refuse_workflows(name, headers, body[2])
        headers.update(options.get("headers") or {})
        # As Celery's publish does: receivers (tracing instrumentations) may add headers.
        signals.before_task_publish.send(
            sender=name,
            body=body,
            exchange="",
            routing_key=_queue_name(amqp, name, options),
            declare=[],
            headers=headers,
            properties=properties,
            retry_policy={},
        )
        outbox.write(transaction, job_from_message(amqp, name, message, options, ordering_key))
        return None

    send_task_message._jobrelay = True  # type: ignore[attr-defined]
    amqp.send_task_message = send_task_message


def job_from_message(
    amqp: Any,
    name: str,
    message: Any,
    options: Mapping[str, Any],
    ordering_key: str | None,
) -> Job:
    """The outbox row of one task message, as `send_task_message` receives it."""
    headers, _properties, body, _sent_event = message
    args, kwargs, embed = body
    _refuse_workflows(name, headers, embed)
    return Job(
        queue=_queue_name(amqp, name, options),
        job_type=name,
        payload=args_kwargs_payload(name, args, kwargs, _kombu_dumps()),
        uuid=headers["id"],
        run_at=_aware(name, "eta", headers.get("eta")),
        headers=_custom_headers(name, {**headers, **(options.get("headers") or {})}),
        options=_task_options(name, headers, options),
        ordering_key=ordering_key,
    )


def _refuse_workflows(name: str, headers: Mapping[str, Any], embed: Mapping[str, Any]) -> None:
    for key, what in (
        ("chain", "a chain"),
        ("chord", "a chord"),
        ("callbacks", "a link (callback)"),
        ("errbacks", "a link_error (errback)"),
    ):
        if embed.get(key):
            raise Unsupported(
                f"task {name!r} is sent as part of {what}, which jobrelay cannot relay "
                "(the relay writes single tasks): send each task on its own, or chain from "
                "inside the task"
            )
    if headers.get("group") is not None:
        raise Unsupported(
            f"task {name!r} is sent as part of a group, which jobrelay cannot relay "
            "(the relay writes single tasks): send each task on its own"
        )


def _queue_name(amqp: Any, name: str, options: Mapping[str, Any]) -> str:
    queue = options.get("queue")
    exchange = options.get("exchange")
    routing_key = options.get("routing_key")
    if queue is None and exchange is None:
        queue = amqp.default_queue
    if isinstance(queue, str):
        queue = amqp.queues[queue]
    if queue is None:
        raise Unsupported(
            f"task {name!r} is routed to exchange {exchange!r} without a queue; "
            "jobrelay writes to a queue (route it with queue=...)"
        )
    exchange_type = getattr(getattr(queue, "exchange", None), "type", None) or "direct"
    if exchange_type != "direct":
        raise Unsupported(
            f"task {name!r} is routed to queue {queue.name!r} through a {exchange_type} "
            "exchange; jobrelay writes to direct queues only"
        )
    if exchange and routing_key and routing_key != queue.name:
        raise Unsupported(
            f"task {name!r} is routed with routing key {routing_key!r} to queue "
            f"{queue.name!r}; jobrelay writes to the queue of the routing key's name only"
        )
    qname: str = queue.name
    return qname


def _custom_headers(name: str, headers: Any) -> dict[str, str]:
    if not headers:
        return {}
    custom = {k: v for k, v in dict(headers).items() if k not in _CELERY_HEADERS}
    for key, value in custom.items():
        if not isinstance(value, str):
            raise JobError(
                f"task {name!r}: header {key!r} is a {type(value).__name__}; jobrelay carries "
                "string headers only (pending_jobs.headers)"
            )
    return custom


def _task_options(
    name: str, headers: Mapping[str, Any], options: Mapping[str, Any]
) -> dict[str, Any]:
    """The options of the celery layout that differ from Celery's defaults, by their names."""
    result: dict[str, Any] = {}
    expires = headers.get("expires")
    if expires is not None:
        result["expires"] = _aware(name, "expires", expires).isoformat()  # type: ignore[union-attr]
    hard, soft = headers.get("timelimit") or (None, None)
    if hard is not None:
        result["time_limit"] = hard
    if soft is not None:
        result["soft_time_limit"] = soft
    if headers.get("ignore_result"):
        result["ignore_result"] = True
    if headers.get("retries"):
        result["retries"] = headers["retries"]
    if headers.get("shadow") is not None:
        result["shadow"] = headers["shadow"]
    priority = options.get("priority")
    if priority is not None:
        if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 9:
            raise JobError(
                f"task {name!r}: priority {priority!r} is not an integer 0..9 "
                "(kombu's Redis priorities, which the celery layout writes)"
            )
        result["priority"] = priority
    return result


def _aware(name: str, what: str, value: Any) -> datetime | None:
    if value is None:
        return None
    when = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    if when.tzinfo is None:
        raise JobError(
            f"task {name!r}: its {what} {when.isoformat()} has no time zone (set Celery's "
            "enable_utc or timezone, or pass an aware datetime)"
        )
    return when


@functools.cache
def _kombu_dumps() -> Any:
    from kombu.utils.json import dumps

    return dumps
