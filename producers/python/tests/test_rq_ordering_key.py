"""RQ's `ordering_key=` through the outbox: `enqueue`, `enqueue_call`, `enqueue_in` and
`enqueue_at` write it into the row's own column (never into the function's kwargs or the
options), a bad key is refused at the call with nothing written, and through the relay (rq
layout) the real worker runs the later job of a key only after the earlier one, due 2 s
later."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from redis import Redis

import jobrelay
from jobrelay.rq import Queue
from support.workers import Worker, rq_worker_with_relay

BAD_KEYS: list[Any] = ["", "k" * 257, 42, "a\0b"]


@pytest.fixture(scope="module")
def worker(database_url: str, redis_url: str) -> Iterator[Worker]:
    with rq_worker_with_relay(database_url, redis_url) as worker:
        yield worker


@pytest.fixture(scope="module")
def queue(redis_url: str) -> Queue:
    return Queue("default", connection=Redis.from_url(redis_url))


def test_the_row_gets_the_key_and_not_the_function(queue: Queue, database_url: str) -> None:
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    with psycopg.connect(database_url) as conn, jobrelay.using(conn):
        queue.enqueue("rq_jobs.record_job", "a", ordering_key="customer-42", job_timeout=60)
        queue.enqueue_call("rq_jobs.record_job", args=("b",), ordering_key="customer-42")
        queue.enqueue_in(timedelta(hours=1), "rq_jobs.record_job", "c", ordering_key="é" * 256)
        queue.enqueue_at(later, "rq_jobs.record_job", "d", ordering_key="customer-7")
        queue.enqueue("rq_jobs.record_job", "e", ordering_key=None)
        found = conn.execute(
            "SELECT ordering_key, convert_from(payload, 'UTF8'), options::text "
            "FROM pending_jobs ORDER BY id"
        ).fetchall()
        conn.rollback()
    keys = [key for key, _, _ in found]
    assert keys == ["customer-42", "customer-42", "é" * 256, "customer-7", None]
    assert all("ordering_key" not in payload + options for _, payload, options in found)


def test_a_bad_key_is_refused_at_the_call_and_nothing_is_written(
    queue: Queue, database_url: str
) -> None:
    with psycopg.connect(database_url) as conn, jobrelay.using(conn):
        for bad in BAD_KEYS:
            with pytest.raises(jobrelay.JobError, match=r"^ordering_key .*1 to 256 characters"):
                queue.enqueue("rq_jobs.record_job", "x", ordering_key=bad)
        with pytest.raises(jobrelay.JobError, match=r"^ordering_key "):
            queue.enqueue_in(timedelta(seconds=1), "rq_jobs.record_job", ordering_key="")
        assert conn.execute("SELECT count(*) FROM pending_jobs").fetchone() == (0,)


def test_the_later_job_of_a_key_runs_after_the_earlier(
    queue: Queue, worker: Worker, database_url: str
) -> None:
    key = f"customer-{uuid.uuid4().hex[:8]}"
    asked = time.time()
    with psycopg.connect(database_url) as conn, jobrelay.using(conn):
        first = queue.enqueue_in(
            timedelta(seconds=2), "rq_jobs.record_job", "first", ordering_key=key
        )
        second = queue.enqueue("rq_jobs.record_job", "second", ordering_key=key)
        free = queue.enqueue("rq_jobs.record_job", "free")
    with psycopg.connect(database_url, autocommit=True) as conn, jobrelay.using(conn):
        enqueued = queue.enqueue("rq_jobs.record_job", "enqueued", ordering_key=key)  # RQ's own

    runs = {job.id: worker.wait_run(job.id) for job in (first, second, free, enqueued)}
    # Unkeyed, the second job would run at once; keyed, it waits for the first, due in 2 s.
    assert runs[free.id]["at"] < asked + 2
    assert runs[first.id]["at"] >= asked + 2
    assert runs[second.id]["at"] >= asked + 2, "the second job ran before the first was due"
    assert [runs[job.id]["args"] for job in (first, second)] == [["first"], ["second"]]
    assert all(run["kwargs"] == {} for run in runs.values()), "ordering_key reached the function"
