"""docs/producers/python.md's RQ example, run as the page shows it (its Redis URL replaced by the
test's, `engine` the test database's): the worker runs the job with its arguments and options,
and the later one waits in RQ's scheduled registry."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy
from redis import Redis

from support.relay import REPO
from support.wait import wait_for
from support.workers import Worker, rq_worker_with_relay

PAGE = REPO / "docs" / "producers" / "python.md"


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)


@pytest.fixture(scope="module")
def worker(database_url: str, redis_url: str) -> Iterator[Worker]:
    with rq_worker_with_relay(database_url, redis_url) as worker:
        yield worker


def test_the_rq_example_runs(worker: Worker, database_url: str, redis_url: str) -> None:
    (block,) = [b for b in python_blocks(PAGE) if "from jobrelay.rq import Queue" in b]
    assert "redis://redis:6379/0" in block
    engine = sqlalchemy.create_engine(database_url.replace("postgres://", "postgresql+psycopg://"))
    namespace: dict[str, Any] = {"engine": engine}
    called = time.time()
    exec(compile(block.replace("redis://redis:6379/0", redis_url), str(PAGE), "exec"), namespace)
    engine.dispose()

    run = worker.wait_run(namespace["job"].id)
    assert (run["task"], run["args"], run["kwargs"]) == (
        "accounts.tasks.send_welcome",
        [42],
        {"lang": "de"},
    )
    assert (run["timeout"], run["result_ttl"], run["retries_left"]) == (30, 600, 3)
    later = namespace["later"].id
    redis = Redis.from_url(redis_url)
    score = wait_for("the later job scheduled", lambda: redis.zscore("rq:scheduled:emails", later))
    assert score >= called + 5 * 60
