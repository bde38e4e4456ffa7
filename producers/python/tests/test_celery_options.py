"""Celery's task options through the outbox behave as with Celery's own client: the same task
with the same options, once sent inside a transaction (relayed) and once outside (Celery
publishes it), and the real prefork worker treats both alike: `expires` passed revokes,
`time_limit` kills, `soft_time_limit` raises in the task, `retries` and `shadow` reach it."""

from __future__ import annotations

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
from support.wait import wait_for
from support.workers import Worker, celery_worker


@pytest.fixture(scope="module")
def keyprefix() -> str:
    return f"o{uuid.uuid4().hex[:8]}:"


@pytest.fixture(scope="module")
def app(redis_url: str, keyprefix: str) -> Celery:
    app = Celery("options", broker=redis_url)
    app.conf.broker_transport_options = {"global_keyprefix": keyprefix}
    for name in ("tasks.record", "tasks.sleep"):
        app.task(name=name, shared=False)(runs_in_the_worker)
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


def both(app: Celery, database_url: str, name: str, *args: Any, **options: Any) -> list[str]:
    """The task sent twice with the same options: relayed (in a transaction), then by Celery."""
    task = app.tasks[name]
    with psycopg.connect(database_url) as conn, jobrelay.using(conn):
        relayed = task.apply_async(args, **options)
    own = task.apply_async(args, **options)
    return [relayed.id, own.id]


def test_expires_in_the_past_revokes_the_task(
    app: Celery, worker: Worker, database_url: str
) -> None:
    expired = both(app, database_url, "tasks.record", "expired", expires=-5)
    control = both(app, database_url, "tasks.record", "not expired", expires=3600)
    for task_id in control:
        worker.wait_run(task_id)
    for task_id in expired:
        wait_for(
            f"task {task_id} discarded as expired",
            lambda task_id=task_id: (
                f"Discarding revoked task: tasks.record[{task_id}]" in worker.log_text()
            ),
        )
        assert worker.runs_of(task_id) == []


def test_time_limit_kills_and_soft_time_limit_raises(
    app: Celery, worker: Worker, database_url: str
) -> None:
    hard = both(app, database_url, "tasks.sleep", 20, time_limit=1)
    for task_id in hard:
        wait_for(
            f"task {task_id} killed at its hard time limit",
            lambda task_id=task_id: (
                f"Hard time limit (1s) exceeded for tasks.sleep[{task_id}]" in worker.log_text()
            ),
        )
        assert [r["outcome"] for r in worker.runs_of(task_id)] == ["started"]
    soft = both(app, database_url, "tasks.sleep", 20, soft_time_limit=1, time_limit=30)
    for task_id in soft:
        run = worker.wait_run(task_id, "soft time limit")
        assert run["timelimit"] == [30, 1]


def test_retries_and_shadow_reach_the_task(app: Celery, worker: Worker, database_url: str) -> None:
    for task_id in both(app, database_url, "tasks.record", "x", retries=3, shadow="shown-as"):
        assert worker.wait_run(task_id)["retries"] == 3
        assert f"Task shown-as[{task_id}] received" in worker.log_text()
