"""Producer throughput: rows (or messages) per second that a Django app's `task.delay(...)`
calls make, inside `transaction.atomic()`.

    /opt/jobrelay-python/bin/python bench/producer.py [--jobs N] [--rounds R]
        [--django-celery-outbox PYTHON]

Cases, in alternating rounds, each timed from the first call to the end of the commit (or of
the last publish), on a fresh database (jobrelay's schema) and a private redis-server:

- `jobrelay, a row per call`: `jobrelay.celery.install(app)`, one INSERT per call;
- `jobrelay, bulk()`: the same inside `jobrelay.bulk()`, one INSERT at the end;
- `celery apply_async to Redis`: Celery's own client, no outbox (what the calls cost without
  jobrelay; not transactional);
- `django-celery-outbox`: with `--django-celery-outbox PYTHON`, the interpreter of a venv
  holding django-celery-outbox (not a dependency): bench/dco_round.py there, its
  `OutboxCelery.send_task` inside `transaction.atomic()`, one ORM row per call.

Prints each round, then the median per case. The relay does not run: this measures producers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from support.database import fresh_database  # noqa: E402
from support.redis_server import private_redis  # noqa: E402


def django_setup(database_url: str) -> None:
    import django
    from django.conf import settings

    rest = database_url.removeprefix("postgres://")
    user, _, rest = rest.partition("@")
    hostport, _, name = rest.partition("/")
    host, _, port = hostport.partition(":")
    settings.configure(
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": name,
                "USER": user,
                "HOST": host,
                "PORT": port,
            }
        },
        INSTALLED_APPS=["jobrelay.django"],
        USE_TZ=True,
    )
    django.setup()


def send_welcome(*args: Any, **kwargs: Any) -> None:
    """The task, by name; its code would run in a worker."""


def celery_app(name: str, redis_url: str, outbox: bool) -> Any:
    from celery import Celery

    import jobrelay.celery

    app = Celery(name, broker=redis_url)
    app.conf.task_serializer = "json"
    app.task(name="tasks.send_welcome", shared=False)(send_welcome)
    if outbox:
        jobrelay.celery.install(app)
    return app


def rate(jobs: int, seconds: float) -> float:
    return jobs / seconds


def run_jobrelay(app: Any, jobs: int, bulk: bool) -> float:
    from django.db import connection, transaction

    import jobrelay

    task = app.tasks["tasks.send_welcome"]
    start = time.perf_counter()
    with transaction.atomic():
        if bulk:
            with jobrelay.bulk():
                for i in range(jobs):
                    task.delay(i, "user@example.com", lang="de")
        else:
            for i in range(jobs):
                task.delay(i, "user@example.com", lang="de")
    elapsed = time.perf_counter() - start
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pending_jobs")
        (count,) = cursor.fetchone()
        assert count == jobs, count
        cursor.execute("TRUNCATE pending_jobs")
    return rate(jobs, elapsed)


def run_celery(app: Any, jobs: int) -> float:
    task = app.tasks["tasks.send_welcome"]
    task.delay(-1, "warm-up", lang="de")  # the connection, once
    start = time.perf_counter()
    for i in range(jobs):
        task.delay(i, "user@example.com", lang="de")
    elapsed = time.perf_counter() - start
    import redis

    client = redis.Redis.from_url(app.conf.broker_url)
    assert client.llen("celery") == jobs + 1
    client.delete("celery")
    return rate(jobs, elapsed)


def run_dco(python: str, redis_url: str, jobs: int) -> float:
    out = subprocess.run(
        [python, str(HERE / "dco_round.py"), "--jobs", str(jobs), "--redis", redis_url],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return float(json.loads(out.strip().splitlines()[-1])["rows_per_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--django-celery-outbox", metavar="PYTHON")
    options = parser.parse_args()

    results: dict[str, list[float]] = {}
    with fresh_database() as database_url, private_redis() as redis_url:
        django_setup(database_url)
        outbox_app = celery_app("outbox", redis_url, outbox=True)
        plain_app = celery_app("plain", redis_url, outbox=False)
        cases = {
            "jobrelay, a row per call": lambda: run_jobrelay(outbox_app, options.jobs, False),
            "jobrelay, bulk()": lambda: run_jobrelay(outbox_app, options.jobs, True),
            "celery apply_async to Redis": lambda: run_celery(plain_app, options.jobs),
        }
        if options.django_celery_outbox:
            python = options.django_celery_outbox
            cases["django-celery-outbox"] = lambda: run_dco(python, redis_url, options.jobs)
        for case in cases.values():  # warm-up round, not counted
            case()
        for round_ in range(1, options.rounds + 1):
            for name, case in cases.items():
                value = case()
                results.setdefault(name, []).append(value)
                print(f"round {round_}: {name}: {value:,.0f} rows/s", flush=True)
        from django.db import connection

        connection.close()
    print(f"\nmedians of {options.rounds} rounds, {options.jobs} calls each:")
    for name, values in results.items():
        print(f"  {name:32} {statistics.median(values):>10,.0f} rows/s")


if __name__ == "__main__":
    main()
