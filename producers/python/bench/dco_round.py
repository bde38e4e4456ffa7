"""One round of django-celery-outbox's producer, for bench/producer.py (run by the interpreter
of a throwaway venv that holds django-celery-outbox, Django, psycopg and Celery; jobrelay does
not depend on it): `OutboxCelery.send_task` via `task.delay(...)`, N calls inside one
`transaction.atomic()`, on a fresh database with its migrations. Prints one JSON line,
`{"rows_per_s": ...}`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from typing import Any

import psycopg

ADMIN_URL = "postgres://postgres@127.0.0.1:5432/postgres"


def send_welcome(*args: Any, **kwargs: Any) -> None:
    """The task, by name; its code would run in a worker."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, required=True)
    parser.add_argument("--redis", required=True)
    options = parser.parse_args()

    name = f"jobrelay_bench_dco_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        import django
        from django.conf import settings

        settings.configure(
            DATABASES={
                "default": {
                    "ENGINE": "django.db.backends.postgresql",
                    "NAME": name,
                    "USER": "postgres",
                    "HOST": "127.0.0.1",
                    "PORT": "5432",
                }
            },
            INSTALLED_APPS=["django_celery_outbox"],
            USE_TZ=True,
            CELERY_OUTBOX_APP="__main__.app",
        )
        django.setup()
        from django.core.management import call_command
        from django.db import connection, transaction
        from django_celery_outbox import OutboxCelery

        call_command("migrate", verbosity=0)
        app = OutboxCelery("bench", broker=options.redis)
        sys.modules["__main__"].app = app  # type: ignore[attr-defined]
        task = app.task(name="tasks.send_welcome")(send_welcome)
        with transaction.atomic():  # warm-up
            task.delay(-1, "warm-up", lang="de")
        start = time.perf_counter()
        with transaction.atomic():
            for i in range(options.jobs):
                task.delay(i, "user@example.com", lang="de")
        elapsed = time.perf_counter() - start
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM celery_outbox")
            (count,) = cursor.fetchone()
        assert count == options.jobs + 1, count
        connection.close()
        print(json.dumps({"rows_per_s": options.jobs / elapsed}))
    finally:
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
