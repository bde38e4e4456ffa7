"""A job as one row of the outbox table: what the producers build and the writer inserts."""

from __future__ import annotations

import json
import uuid as uuid_module
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .errors import JobError


@dataclass(frozen=True)
class Job:
    """One `pending_jobs` row.

    `payload` is the row's bytes (for the celery and rq layouts, UTF-8 JSON
    `{"args": [...], "kwargs": {...}}`); `headers` are string metadata; `options` the runner's
    own job options (a JSON object), as the layout's page names them; `ordering_key` the key
    whose rows the relay hands over one after another (`checked_ordering_key`).
    """

    queue: str
    job_type: str
    payload: bytes
    uuid: str
    run_at: datetime | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    ordering_key: str | None = None

    def __post_init__(self) -> None:
        checked_ordering_key(self.ordering_key)
        if not self.queue:
            raise JobError(f"job {self.job_type!r}: the queue name is empty")
        if not self.job_type:
            raise JobError("a job needs a job_type (the task's name or the function's path)")
        try:
            parsed = uuid_module.UUID(self.uuid)
        except (ValueError, TypeError, AttributeError):
            raise JobError(
                f"job {self.job_type!r}: its id {self.uuid!r} is not a UUID "
                "(the outbox's uuid column is the task or job id the worker sees)"
            ) from None
        if parsed.int == 0:
            raise JobError(f"job {self.job_type!r}: the nil UUID is not a job id")
        for name, value in self.headers.items():
            if not isinstance(name, str) or not isinstance(value, str):
                raise JobError(
                    f"job {self.job_type!r}: header {name!r} must be a string with a string "
                    f"value (got {type(value).__name__}); pending_jobs.headers holds strings"
                )
        if self.run_at is not None and self.run_at.tzinfo is None:
            raise JobError(
                f"job {self.job_type!r}: run_at {self.run_at.isoformat()} has no time zone"
            )

    def headers_json(self) -> str:
        return json.dumps(dict(self.headers), separators=(",", ":"))

    def options_json(self) -> str:
        try:
            return json.dumps(dict(self.options), separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as err:
            raise JobError(f"job {self.job_type!r}: its options are not JSON: {err}") from None


#: The longest ordering key the outbox takes (its CHECK pending_jobs_ordering_key_check).
ORDERING_KEY_MAX = 256


def checked_ordering_key(key: Any) -> str | None:
    """`key` if the outbox takes it as an ordering key (docs/guarantees.md#per-key-order), `None`
    for no key; else `JobError` naming `ordering_key`, at the call, before anything is written.

    A string of 1 to 256 characters (Postgres counts characters, as `len` does) without NUL,
    which Postgres text cannot hold.
    """
    if key is None:
        return None
    if not isinstance(key, str) or not 1 <= len(key) <= ORDERING_KEY_MAX or "\0" in key:
        raise JobError(
            f"ordering_key {key!r:.60}: jobrelay's outbox takes a string of 1 to "
            f"{ORDERING_KEY_MAX} characters without NUL"
        )
    return key


def args_kwargs_payload(job_type: str, args: Any, kwargs: Any, dumps: Any = None) -> bytes:
    """The celery and rq layouts' payload: `{"args": [...], "kwargs": {...}}`, UTF-8 JSON.

    `dumps` is the runner's own JSON encoder (kombu's for Celery, so that what its worker decodes
    is what its own client would have sent); plain `json.dumps` by default.
    """
    if not isinstance(args, (list, tuple)):
        raise JobError(f"job {job_type!r}: args must be a list or tuple, not {type(args).__name__}")
    if not isinstance(kwargs, Mapping):
        raise JobError(f"job {job_type!r}: kwargs must be a mapping, not {type(kwargs).__name__}")
    body = {"args": list(args), "kwargs": dict(kwargs)}
    try:
        text = dumps(body) if dumps is not None else json.dumps(body, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise JobError(f"job {job_type!r}: its arguments are not JSON: {err}") from None
    encoded: bytes = text.encode("utf-8") if isinstance(text, str) else text
    return encoded
