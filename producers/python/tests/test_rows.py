"""The rows the producers write, read back from Postgres: every column, for each way of holding
a transaction (SQLAlchemy's scoped_session as Flask-SQLAlchemy's db.session, a psycopg
connection). Celery's broker here is a closed port: nothing may be published."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
import sqlalchemy
from celery import Celery
from celery.result import AsyncResult
from redis import Redis
from rq import Retry
from sqlalchemy.orm import scoped_session, sessionmaker

import jobrelay
import jobrelay.celery
from jobrelay.rq import Queue
from support.producer import runs_in_the_worker

CLOSED = "redis://127.0.0.1:1/0"


@pytest.fixture(scope="module")
def app() -> Celery:
    app = Celery("rows", broker=CLOSED)
    app.conf.task_routes = {"tasks.routed": {"queue": "emails"}}
    app.task(name="tasks.record", shared=False)(runs_in_the_worker)
    app.task(name="tasks.routed", shared=False, time_limit=30, soft_time_limit=20)(
        runs_in_the_worker
    )
    jobrelay.celery.install(app)
    return app


@pytest.fixture(scope="module")
def db_session(database_url: str) -> Iterator[Any]:
    engine = sqlalchemy.create_engine(database_url.replace("postgres://", "postgresql+psycopg://"))
    session = scoped_session(sessionmaker(engine))
    yield session
    session.remove()
    engine.dispose()


def rows(database_url: str) -> list[dict[str, Any]]:
    with psycopg.connect(database_url) as conn:
        cursor = conn.execute(
            "SELECT uuid::text, queue, job_type, convert_from(payload, 'UTF8'), run_at, headers, "
            "options FROM pending_jobs ORDER BY id"
        )
        names = ["uuid", "queue", "job_type", "payload", "run_at", "headers", "options"]
        found = [dict(zip(names, row, strict=True)) for row in cursor]
        conn.execute("DELETE FROM pending_jobs")
        return found


def test_celery_rows_in_a_flask_sqlalchemy_session(
    app: Celery, db_session: Any, database_url: str
) -> None:
    jobrelay.configure(transaction=db_session)
    record, routed = app.tasks["tasks.record"], app.tasks["tasks.routed"]
    eta = datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc)

    def send() -> tuple[AsyncResult, AsyncResult]:
        first = record.apply_async(
            (1, {"a": [True, None]}),
            {"when": datetime(2026, 1, 1, tzinfo=timezone.utc)},
            eta=eta,
            expires=eta + timedelta(hours=1),
            headers={"traceparent": "00-1-2-01"},
            priority=5,
            ignore_result=True,
            shadow="shown-as",
        )
        return first, routed.delay()

    send()
    # A session autobegins: the first call began its transaction, which rolls back here.
    db_session.rollback()
    assert rows(database_url) == []

    first, second = send()
    db_session.commit()
    one, two = rows(database_url)
    assert one["uuid"] == first.id
    assert (one["queue"], one["job_type"]) == ("celery", "tasks.record")
    payload = json.loads(one["payload"])
    assert payload["args"] == [1, {"a": [True, None]}]
    # kombu's JSON encoder, as Celery's own client: the worker decodes a datetime again.
    assert payload["kwargs"]["when"]["__type__"] == "datetime"
    assert one["run_at"] == eta
    assert one["headers"] == {"traceparent": "00-1-2-01"}
    assert one["options"] == {
        "expires": (eta + timedelta(hours=1)).isoformat(),
        "ignore_result": True,
        "shadow": "shown-as",
        "priority": 5,
    }
    assert (two["uuid"], two["queue"], two["job_type"]) == (second.id, "emails", "tasks.routed")
    assert json.loads(two["payload"]) == {"args": [], "kwargs": {}}
    assert two["run_at"] is None
    # The task's own time limits, as Celery's client sends them.
    assert two["options"] == {"time_limit": 30, "soft_time_limit": 20}


def test_celery_rows_on_a_psycopg_connection_and_nothing_outside(
    app: Celery, database_url: str
) -> None:
    record = app.tasks["tasks.record"]
    with psycopg.connect(database_url) as conn, jobrelay.using(conn):
        result = record.apply_async((7,), countdown=60, time_limit=5, soft_time_limit=3)
    (row,) = rows(database_url)
    assert row["uuid"] == result.id
    assert row["options"] == {"time_limit": 5, "soft_time_limit": 3}
    assert row["run_at"] > datetime.now(timezone.utc) + timedelta(seconds=55)

    # Outside a transaction Celery publishes itself: here, to a closed port.
    with (
        psycopg.connect(database_url, autocommit=True) as conn,
        jobrelay.using(conn),
        pytest.raises(Exception, match=r"Connection refused|Error 111"),
    ):
        record.apply_async((8,), retry=False)
    assert rows(database_url) == []


def test_rq_rows_carry_the_options_rq_would_store(database_url: str) -> None:
    queue = Queue("reports", connection=Redis.from_url(CLOSED), default_timeout=600)
    at = datetime(2030, 1, 1, tzinfo=timezone.utc)
    with psycopg.connect(database_url) as conn, jobrelay.using(conn):
        plain = queue.enqueue("rq_jobs.record_job", 1)
        full = queue.enqueue_at(
            at,
            "rq_jobs.record_job",
            2,
            k="v",
            job_timeout=30,
            result_ttl=60,
            ttl=120,
            failure_ttl=3600,
            retry=Retry(max=3, interval=[1, 5]),
            description="nightly report",
            meta={"tenant": "acme"},
            at_front=True,
        )
    one, two = rows(database_url)
    assert (one["uuid"], one["queue"], one["job_type"]) == (plain.id, "reports", RECORD_PATH)
    assert json.loads(one["payload"]) == {"args": [1], "kwargs": {}}
    assert one["options"] == {"timeout": 600}
    assert two["uuid"] == full.id
    assert two["run_at"] == at
    assert json.loads(two["payload"]) == {"args": [2], "kwargs": {"k": "v"}}
    assert two["options"] == {
        "timeout": 30,
        "result_ttl": 60,
        "ttl": 120,
        "failure_ttl": 3600,
        "retry": {"max": 3, "interval": [1, 5]},
        "description": "nightly report",
        "at_front": True,
        "meta": {"tenant": "acme"},
    }


RECORD_PATH = "rq_jobs.record_job"


def test_settings_are_checked_when_set() -> None:
    with pytest.raises(ValueError, match=r"outside_transaction must be one of"):
        jobrelay.configure(outside_transaction="later")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"is not a name or schema\.name"):
        jobrelay.configure(table="a.b.c")
    with pytest.raises(TypeError, match=r"cannot write through a builtins\.str"):
        jobrelay.configure(transaction="postgres://")


def test_a_schema_qualified_table(app: Celery, database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        conn.execute("CREATE SCHEMA IF NOT EXISTS app")
        conn.execute("CREATE TABLE app.outbox (LIKE public.pending_jobs INCLUDING ALL)")
    jobrelay.configure(table="app.outbox")
    with psycopg.connect(database_url) as conn, jobrelay.using(conn):
        result = app.tasks["tasks.record"].delay(1)
        assert conn.execute("SELECT uuid::text FROM app.outbox").fetchone() == (result.id,)
    assert uuid.UUID(result.id)


def test_before_task_publish_receivers_add_headers(app: Celery, database_url: str) -> None:
    from celery import signals

    def add_traceparent(headers: dict[str, Any], **kwargs: Any) -> None:
        headers["traceparent"] = "00-from-the-signal-01"

    signals.before_task_publish.connect(add_traceparent)
    try:
        with psycopg.connect(database_url) as conn, jobrelay.using(conn):
            app.tasks["tasks.record"].delay(1)
    finally:
        signals.before_task_publish.disconnect(add_traceparent)
    (row,) = rows(database_url)
    assert row["headers"] == {"traceparent": "00-from-the-signal-01"}


def test_a_synchronous_rq_queue_runs_the_job_at_once(database_url: str, redis_url: str) -> None:
    queue = Queue("sync", connection=Redis.from_url(redis_url), is_async=False)
    with psycopg.connect(database_url) as conn, jobrelay.using(conn):
        job = queue.enqueue("operator.add", 1, 2)
        assert conn.execute("SELECT count(*) FROM pending_jobs").fetchone() == (0,)
    assert job.return_value() == 3
