"""Celery's `ordering_key=` through the outbox: `apply_async`, a signature's `set` and
`send_task` write it into the row's own column (no option or header carries it), a bad key is
refused at the call with nothing written, and through the relay (celery layout) the real worker
runs the later task of a key only after the earlier one, which was due 2 s later."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from celery import Celery

import jobrelay
import jobrelay.celery
from support.producer import runs_in_the_worker
from support.relay import running_relay
from support.workers import Worker, celery_worker

BAD_KEYS: list[Any] = ["", "k" * 257, 42, "a\0b"]


@pytest.fixture(scope="module")
def keyprefix() -> str:
    return f"k{uuid.uuid4().hex[:8]}:"


@pytest.fixture(scope="module")
def app(redis_url: str, keyprefix: str) -> Celery:
    app = Celery("ordering", broker=redis_url)
    app.conf.broker_transport_options = {"global_keyprefix": keyprefix}
    app.task(name="tasks.record", shared=False)(runs_in_the_worker)
    jobrelay.celery.install(app)
    return app


@pytest.fixture(scope="module")
def worker(database_url: str, redis_url: str, keyprefix: str) -> Iterator[Worker]:
    with (
        celery_worker(redis_url, keyprefix) as worker,
        running_relay(database_url, redis_url, "celery", keyprefix) as relay_log,
    ):
        worker.other_logs.append(relay_log)
        yield worker


def test_the_row_gets_the_key_and_no_option_carries_it(app: Celery, database_url: str) -> None:
    task = app.tasks["tasks.record"]
    with psycopg.connect(database_url) as conn, jobrelay.using(conn):
        task.apply_async(("a",), ordering_key="customer-42", priority=3)
        task.s("b").set(ordering_key="customer-42").apply_async()
        app.send_task("tasks.record", ("c",), ordering_key="é" * 256)
        task.apply_async(("d",), ordering_key=None)
        found = conn.execute(
            "SELECT ordering_key, options::text, headers::text FROM pending_jobs ORDER BY id"
        ).fetchall()
        conn.rollback()
    assert [key for key, _, _ in found] == ["customer-42", "customer-42", "é" * 256, None]
    assert all("ordering_key" not in options + headers for _, options, headers in found)


def test_a_bad_key_is_refused_at_the_call_and_nothing_is_written(
    app: Celery, database_url: str
) -> None:
    task = app.tasks["tasks.record"]
    with psycopg.connect(database_url) as conn, jobrelay.using(conn):
        for bad in BAD_KEYS:
            with pytest.raises(jobrelay.JobError, match=r"^ordering_key .*1 to 256 characters"):
                task.apply_async(("x",), ordering_key=bad)
        with pytest.raises(jobrelay.JobError, match=r"^ordering_key "):
            task.s("x").set(ordering_key="").apply_async()
        assert conn.execute("SELECT count(*) FROM pending_jobs").fetchone() == (0,)
    # Outside a transaction too, before Celery publishes anything.
    with pytest.raises(jobrelay.JobError, match=r"^ordering_key "):
        task.apply_async(("x",), ordering_key=42)


def test_the_later_task_of_a_key_runs_after_the_earlier(
    app: Celery, worker: Worker, database_url: str
) -> None:
    task = app.tasks["tasks.record"]
    key = f"customer-{uuid.uuid4().hex[:8]}"
    asked = time.time()
    with psycopg.connect(database_url) as conn, jobrelay.using(conn):
        first = task.apply_async(("first",), countdown=2, ordering_key=key)
        second = task.apply_async(("second",), ordering_key=key)
        free = task.apply_async(("free",))
    published = task.apply_async(("published",), ordering_key=key)  # Celery's own, no key

    runs = {r.id: worker.wait_run(r.id) for r in (first, second, free, published)}
    # Unkeyed, the second task would run at once; keyed, it waits for the first, due in 2 s.
    assert runs[free.id]["at"] < asked + 2
    assert runs[first.id]["at"] >= asked + 2
    assert runs[second.id]["at"] >= asked + 2, "the second task ran before the first was due"
    assert [runs[r.id]["args"] for r in (first, second)] == [["first"], ["second"]]
