"""Fixtures shared by the test modules: per module a fresh database (jobrelay's schema) and a
private redis-server; per test, jobrelay's process-wide settings restored afterwards."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest

from jobrelay import outbox
from support.database import fresh_database
from support.redis_server import private_redis


@pytest.fixture(scope="module")
def database_url() -> Iterator[str]:
    with fresh_database() as url:
        yield url


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with private_redis() as url:
        yield url


@pytest.fixture(autouse=True)
def _restore_outbox_settings() -> Iterator[None]:
    saved = copy.copy(outbox.settings())
    yield
    current = outbox.settings()
    current.transaction = saved.transaction
    current.table = saved.table
    current.outside_transaction = saved.outside_transaction
