"""Where a job call goes: the current transaction, the settings, bulk buffering, the INSERT.

The producers (`jobrelay.celery`, `jobrelay.rq`) ask `route()` for each call. It answers the
transaction to write into, or `None` for "publish as the runner's own client would" (a call
outside any transaction, by default). `write()` inserts the row at once, or, inside `bulk()`,
buffers it and inserts every buffered row in one statement when the block ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Literal

from ._job import Job
from .errors import NoTransaction
from .transactions import Transaction, adapt

Outside = Literal["publish", "outbox", "raise"]
_OUTSIDE: tuple[str, ...] = ("publish", "outbox", "raise")


@dataclass
class Settings:
    """What `configure` sets, process-wide."""

    #: The transaction of every call that `using()` did not name (e.g. Django's connection).
    transaction: Transaction | None = None
    #: The outbox table, optionally schema-qualified (the relay's `--table`).
    table: str = "pending_jobs"
    #: A call outside a transaction: `"publish"` (the runner's own client publishes it, as
    #: without jobrelay), `"outbox"` (the row is written on the connection, committed at once),
    #: or `"raise"` (`NoTransaction`).
    outside_transaction: Outside = "publish"


_settings = Settings()
_using: ContextVar[Transaction | None] = ContextVar("jobrelay_using", default=None)


def configure(
    *,
    transaction: Any = None,
    table: str | None = None,
    outside_transaction: Outside | None = None,
) -> None:
    """Set the default transaction (a session, connection or `Transaction`), the table, and
    what a call outside a transaction does. Arguments left `None` keep their setting."""
    if transaction is not None:
        _settings.transaction = adapt(transaction)
    if table is not None:
        _quote_table(table)
        _settings.table = table
    if outside_transaction is not None:
        if outside_transaction not in _OUTSIDE:
            raise ValueError(
                f"outside_transaction must be one of {', '.join(_OUTSIDE)}, "
                f"not {outside_transaction!r}"
            )
        _settings.outside_transaction = outside_transaction


def settings() -> Settings:
    return _settings


@contextlib.contextmanager
def using(transaction: Any) -> Iterator[Transaction]:
    """Within the block, job calls write into `transaction` (a SQLAlchemy Session or
    Connection, a psycopg Connection, or a `Transaction`) instead of the configured one."""
    adapted = adapt(transaction)
    token = _using.set(adapted)
    try:
        yield adapted
    finally:
        _using.reset(token)


def current() -> Transaction | None:
    """The transaction a job call would write into, if any is configured or in use."""
    return _using.get() or _settings.transaction


def route() -> Transaction | None:
    """The transaction to write this call's row into, or `None` to publish it as usual."""
    transaction = current()
    if transaction is not None and transaction.in_transaction():
        return transaction
    policy = _settings.outside_transaction
    if policy == "raise":
        raise NoTransaction(
            "a job call outside a database transaction (jobrelay's outside_transaction is "
            '"raise"): call it inside transaction.atomic(), a session, or jobrelay.using(...)'
        )
    if policy == "outbox" and transaction is not None:
        return transaction
    return None


@dataclass
class _Bulk:
    transaction: Transaction
    savepoint: object
    jobs: list[Job] = field(default_factory=list)


_bulk: ContextVar[_Bulk | None] = ContextVar("jobrelay_bulk", default=None)


@contextlib.contextmanager
def bulk(transaction: Any = None) -> Iterator[None]:
    """Buffer the rows of the block's job calls and insert them in one statement at its end.

    Use it inside the transaction: `with transaction.atomic(), jobrelay.bulk(): ...`. A call
    made while a savepoint opened inside the block is open is written at once instead, so that
    rolling that savepoint back takes its rows along; an exception out of the block drops the
    buffer (the transaction rolls back anyway).
    """
    target = adapt(transaction) if transaction is not None else current()
    if target is None:
        raise NoTransaction("jobrelay.bulk(): no transaction configured or given")
    state = _Bulk(target, target.savepoint())
    token = _bulk.set(state)
    try:
        yield
    except BaseException:
        state.jobs.clear()
        raise
    finally:
        _bulk.reset(token)
    if state.jobs:
        insert(state.transaction, state.jobs)


def write(transaction: Transaction, job: Job) -> None:
    """Write `job` into `transaction`, or buffer it for the enclosing `bulk()`."""
    state = _bulk.get()
    if (
        state is not None
        and state.transaction.key() is transaction.key()
        and state.savepoint == transaction.savepoint()
    ):
        state.jobs.append(job)
        return
    insert(transaction, [job])


_COLUMNS = "uuid, queue, job_type, payload, run_at, headers, options, ordering_key"
_VALUES = "VALUES (%s::uuid, %s, %s, %s::bytea, %s::timestamptz, %s::jsonb, %s::jsonb, %s::text)"
_UNNEST = (
    "SELECT * FROM unnest(%s::uuid[], %s::text[], %s::text[], %s::bytea[], "
    "%s::timestamptz[], %s::jsonb[], %s::jsonb[], %s::text[])"
)


def insert(transaction: Transaction, jobs: Sequence[Job]) -> None:
    """One `INSERT` of every job, on the transaction's connection (one round trip): a row of
    `VALUES` for one job (Postgres plans it faster), one array per column for more."""
    table = _quote_table(_settings.table)
    if len(jobs) == 1:
        (job,) = jobs
        transaction.execute(
            f"INSERT INTO {table} ({_COLUMNS}) {_VALUES}",
            [
                job.uuid,
                job.queue,
                job.job_type,
                job.payload,
                job.run_at,
                job.headers_json(),
                job.options_json(),
                job.ordering_key,
            ],
        )
        return
    params: list[list[Any]] = [[], [], [], [], [], [], [], []]
    for job in jobs:
        params[0].append(job.uuid)
        params[1].append(job.queue)
        params[2].append(job.job_type)
        params[3].append(job.payload)
        params[4].append(job.run_at)
        params[5].append(job.headers_json())
        params[6].append(job.options_json())
        params[7].append(job.ordering_key)
    transaction.execute(f"INSERT INTO {table} ({_COLUMNS}) {_UNNEST}", params)


def _quote_table(table: str) -> str:
    parts = table.split(".")
    if not 1 <= len(parts) <= 2 or not all(parts):
        raise ValueError(f"table {table!r} is not a name or schema.name")
    return ".".join('"' + part.replace('"', '""') + '"' for part in parts)
