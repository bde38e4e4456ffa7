"""A fresh Postgres database with jobrelay's schema (`jobrelay migrate`), dropped afterwards."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from .relay import relay_bin

ADMIN_URL = os.environ.get("JOBRELAY_TEST_ADMIN_URL", "postgres://postgres@127.0.0.1:5432/postgres")


def url_of(name: str) -> str:
    base, _, _ = ADMIN_URL.rpartition("/")
    return f"{base}/{name}"


@contextmanager
def fresh_database() -> Iterator[str]:
    name = f"jobrelay_py_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = url_of(name)
    try:
        subprocess.run(
            [relay_bin(), "migrate", "--database-url", url, "--log-format", "text"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        yield url
    finally:
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def pending_rows(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM pending_jobs").fetchone()
        return int(row[0]) if row else 0
