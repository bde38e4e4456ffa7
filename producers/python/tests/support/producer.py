"""The producer's side of a Celery app in the tests: the tasks exist by name only, their code
runs in the worker (tests/apps/celery_worker_app.py)."""

from __future__ import annotations

from typing import Any


def runs_in_the_worker(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("the producer's tasks run in the worker, never here")
