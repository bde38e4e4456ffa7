"""Fixtures shared by the test modules: per module a fresh database (jobrelay's schema) and a
private redis-server; jobrelay's process-wide settings restored after each test and module."""

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


def _restoring_outbox_settings() -> Iterator[None]:
    saved = copy.copy(outbox.settings())
    yield
    current = outbox.settings()
    current.transaction = saved.transaction
    current.table = saved.table
    current.outside_transaction = saved.outside_transaction


@pytest.fixture(autouse=True, scope="module")
def _restore_outbox_settings_per_module() -> Iterator[None]:
    # A module's Django app configures Django's connection, to a database dropped with it.
    yield from _restoring_outbox_settings()


@pytest.fixture(autouse=True)
def _restore_outbox_settings() -> Iterator[None]:
    yield from _restoring_outbox_settings()
