"""RQ inside psycopg and SQLAlchemy transactions: the real `rq worker --serializer json
--with-scheduler`, the relay (`--layout rq`). A job enqueued inside a transaction runs once if
and only if the transaction (and every savepoint around the call) commits."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
import sqlalchemy
from redis import Redis
from rq import Callback, Repeat
from sqlalchemy.orm import Session

import jobrelay
from jobrelay.rq import Queue
from support.database import pending_rows
from support.wait import wait_for
from support.workers import Worker, rq_worker_with_relay

RECORD = "rq_jobs.record_job"


class Boom(Exception):
    pass


@pytest.fixture(scope="module")
def worker(database_url: str, redis_url: str) -> Iterator[Worker]:
    with rq_worker_with_relay(database_url, redis_url) as worker:
        yield worker


@pytest.fixture(scope="module")
def queue(redis_url: str) -> Queue:
    return Queue("emails", connection=Redis.from_url(redis_url))


@pytest.fixture(scope="module")
def engine(database_url: str) -> Iterator[sqlalchemy.Engine]:
    engine = sqlalchemy.create_engine(database_url.replace("postgres://", "postgresql+psycopg://"))
    yield engine
    engine.dispose()


def test_commit_runs_each_job_once_with_its_args_and_kwargs(
    queue: Queue, worker: Worker, database_url: str
) -> None:
    with psycopg.connect(database_url) as conn, jobrelay.using(conn):
        jobs = [
            queue.enqueue(RECORD, 1, "two", x={"y": 3}),
            queue.enqueue_call(RECORD, args=(2,), kwargs={"k": "v"}),
            queue.enqueue(RECORD, job_id=str(uuid.uuid4())),
        ]
        assert conn.execute("SELECT count(*) FROM pending_jobs").fetchone() == (3,)
        assert queue.count == 0
    runs = [worker.wait_run(job.id) for job in jobs]
    assert [(r["args"], r["kwargs"]) for r in runs] == [
        ([1, "two"], {"x": {"y": 3}}),
        ([2], {"k": "v"}),
        ([], {}),
    ]
    assert {r["queue"] for r in runs} == {"emails"}
    wait_for("the outbox emptied", lambda: pending_rows(database_url) == 0)
    assert all(len(worker.runs_of(job.id)) == 1 for job in jobs)


def test_enqueue_many_writes_every_job_inside_the_transaction(
    queue: Queue, worker: Worker, database_url: str
) -> None:
    with psycopg.connect(database_url) as conn, jobrelay.using(conn):
        jobs = queue.enqueue_many(
            [
                Queue.prepare_data(RECORD, ("many", 1), {"k": "v"}),
                Queue.prepare_data(RECORD, ("many", 2), job_id=str(uuid.uuid4()), at_front=True),
            ]
        )
        assert conn.execute("SELECT count(*) FROM pending_jobs").fetchone() == (2,)
        assert queue.count == 0
    runs = [worker.wait_run(job.id) for job in jobs]
    assert [(r["args"], r["kwargs"]) for r in runs] == [
        (["many", 1], {"k": "v"}),
        (["many", 2], {}),
    ]


def test_rollbacks_and_rolled_back_savepoints_run_nothing(
    queue: Queue, worker: Worker, engine: sqlalchemy.Engine, database_url: str
) -> None:
    marker = uuid.uuid4().hex
    kept = []
    # A SQLAlchemy Session: begin_nested() is a savepoint.
    with Session(engine) as session, jobrelay.using(session):
        with pytest.raises(Boom), session.begin():
            queue.enqueue(RECORD, marker, "rolled back")
            raise Boom
        with session.begin():
            kept.append(queue.enqueue(RECORD, marker, "session kept"))
            with pytest.raises(Boom), session.begin_nested():
                queue.enqueue(RECORD, marker, "savepoint rolled back")
                raise Boom
            with session.begin_nested():
                kept.append(queue.enqueue(RECORD, marker, "savepoint kept"))
        with session.begin(), jobrelay.bulk():
            kept.append(queue.enqueue(RECORD, marker, "session bulk kept"))
            with pytest.raises(Boom), session.begin_nested():
                queue.enqueue(RECORD, marker, "session bulk savepoint rolled back")
                raise Boom
    # A SQLAlchemy Connection, with bulk().
    with (
        engine.connect() as connection,
        jobrelay.using(connection),
        connection.begin(),
        jobrelay.bulk(),
    ):
        kept.append(queue.enqueue(RECORD, marker, "connection kept"))
        nested = connection.begin_nested()
        queue.enqueue(RECORD, marker, "connection savepoint rolled back")
        nested.rollback()
    # A psycopg connection: transaction() blocks nest as savepoints.
    with psycopg.connect(database_url, autocommit=True) as conn, jobrelay.using(conn):
        with conn.transaction(), jobrelay.bulk():
            kept.append(queue.enqueue(RECORD, marker, "psycopg kept"))
            with pytest.raises(Boom), conn.transaction():
                queue.enqueue(RECORD, marker, "psycopg savepoint rolled back")
                raise Boom
        with pytest.raises(Boom), conn.transaction():
            queue.enqueue(RECORD, marker, "psycopg rolled back")
            raise Boom

    # One worker takes the queue's jobs in order: once a job committed after all of them ran,
    # whatever the transactions above had left in the queue has run too.
    with psycopg.connect(database_url) as conn, jobrelay.using(conn):
        sentinel = queue.enqueue(RECORD, "sentinel")
    worker.wait_run(sentinel.id)
    for job in kept:
        assert worker.runs_of(job.id)
    assert pending_rows(database_url) == 0
    ran = sorted(r["args"][1] for r in worker.runs() if r["args"][:1] == [marker])
    assert ran == [
        "connection kept",
        "psycopg kept",
        "savepoint kept",
        "session bulk kept",
        "session kept",
    ]


def test_enqueue_in_and_enqueue_at_run_no_earlier_than_asked(
    queue: Queue, worker: Worker, database_url: str
) -> None:
    with psycopg.connect(database_url) as conn, jobrelay.using(conn):
        sent = time.time()
        later = queue.enqueue_in(timedelta(seconds=3), RECORD, "in")
        at = datetime.now(timezone.utc) + timedelta(seconds=2)
        at_job = queue.enqueue_at(at, RECORD, "at")
    assert worker.wait_run(later.id)["at"] >= sent + 3
    assert worker.wait_run(at_job.id)["at"] >= at.timestamp()


def test_what_the_rq_layout_cannot_carry_is_refused_at_the_call(
    queue: Queue, database_url: str
) -> None:
    with psycopg.connect(database_url) as conn, jobrelay.using(conn):
        for kwargs, what in (
            ({"depends_on": str(uuid.uuid4())}, "depends_on"),
            ({"on_success": Callback(RECORD)}, "on_success"),
            ({"repeat": Repeat(times=2)}, "repeat"),
        ):
            with pytest.raises(jobrelay.Unsupported, match=what):
                queue.enqueue(RECORD, 1, **kwargs)
        with pytest.raises(jobrelay.JobError, match="not a UUID"):
            queue.enqueue(RECORD, job_id="report-42")
        with pytest.raises(jobrelay.JobError, match="not JSON"):
            queue.enqueue(RECORD, object())
        assert conn.execute("SELECT count(*) FROM pending_jobs").fetchone() == (0,)


def test_outside_a_transaction_rq_enqueues_itself(
    queue: Queue, worker: Worker, database_url: str
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn, jobrelay.using(conn):
        job = queue.enqueue(RECORD, "outside")
        assert pending_rows(database_url) == 0
    run: dict[str, Any] = worker.wait_run(job.id)
    assert run["args"] == ["outside"]
