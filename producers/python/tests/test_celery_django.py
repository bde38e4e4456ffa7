"""Celery inside Django's transactions: the real `celery worker`, the relay (`--layout celery`),
Django on Postgres. A task called inside `transaction.atomic()` runs once if and only if the
transaction (and every savepoint around the call) commits."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery, chain, chord, group

import jobrelay
import jobrelay.celery
from support.database import pending_rows
from support.producer import runs_in_the_worker
from support.relay import running_relay
from support.wait import wait_for
from support.workers import Worker, celery_worker


class Boom(Exception):
    pass


@pytest.fixture(scope="module")
def django_db(database_url: str) -> Iterator[Any]:
    import django
    from django.conf import settings
    from django.db import connection

    url = database_url.removeprefix("postgres://")
    user, _, rest = url.partition("@")
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
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE things (id serial PRIMARY KEY, name text NOT NULL)")
    yield connection
    connection.close()


@pytest.fixture(scope="module")
def keyprefix() -> str:
    return f"t{uuid.uuid4().hex[:8]}:"


@pytest.fixture(scope="module")
def app(redis_url: str, keyprefix: str, django_db: Any) -> Celery:
    app = Celery("producer", broker=redis_url)
    app.conf.update(
        task_serializer="json",
        broker_transport_options={"global_keyprefix": keyprefix},
        task_routes={"tasks.routed": {"queue": "emails"}},
    )
    for name in ("tasks.record", "tasks.routed", "tasks.sleep"):
        app.task(name=name, shared=False)(runs_in_the_worker)
    jobrelay.celery.install(app)
    return app


@pytest.fixture(scope="module")
def worker(app: Celery, database_url: str, redis_url: str, keyprefix: str) -> Iterator[Worker]:
    with (
        celery_worker(redis_url, keyprefix) as worker,
        running_relay(database_url, redis_url, "celery", keyprefix) as relay_log,
    ):
        worker.other_logs.append(relay_log)
        yield worker


def task(app: Celery, name: str = "tasks.record") -> Any:
    return app.tasks[name]


def redis_keys(redis_url: str, keyprefix: str) -> list[bytes]:
    # The worker's own bindings and bookkeeping keys aside: the queues' lists.
    client = redis.Redis.from_url(redis_url)
    return [k for k in client.keys(f"{keyprefix}*") if client.type(k) == b"list"]


def test_commit_runs_each_task_once_with_its_args_kwargs_queue_and_headers(
    app: Celery, worker: Worker, django_db: Any, database_url: str, redis_url: str, keyprefix: str
) -> None:
    from django.db import transaction

    record = task(app)
    with transaction.atomic():
        with django_db.cursor() as cursor:
            cursor.execute("INSERT INTO things (name) VALUES ('first')")
        results = {
            "delay": record.delay(1, "two", x={"y": 3}),
            "apply_async": record.apply_async(
                (2,), {"k": "v"}, queue="emails", headers={"traceparent": "00-abc-01"}
            ),
            "send_task": app.send_task("tasks.record", [3], {"by": "name"}),
            "signature": record.s(4).apply_async(),
            "routed": task(app, "tasks.routed").delay(5),
        }
        # Written on Django's connection, inside the transaction; nothing published yet.
        with django_db.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pending_jobs")
            assert cursor.fetchone() == (5,)
        assert pending_rows(database_url) == 0
        assert redis_keys(redis_url, keyprefix) == []

    runs = {name: worker.wait_run(result.id) for name, result in results.items()}
    assert (runs["delay"]["args"], runs["delay"]["kwargs"]) == ([1, "two"], {"x": {"y": 3}})
    assert runs["apply_async"]["queue"] == "emails"
    assert runs["apply_async"]["traceparent"] == "00-abc-01"
    assert runs["apply_async"]["kwargs"] == {"k": "v"}
    assert (runs["send_task"]["args"], runs["send_task"]["kwargs"]) == ([3], {"by": "name"})
    assert runs["signature"]["args"] == [4]
    assert (runs["routed"]["task"], runs["routed"]["queue"]) == ("tasks.routed", "emails")
    assert runs["delay"]["queue"] == "celery"
    wait_for("the outbox emptied", lambda: pending_rows(database_url) == 0)
    for result in results.values():
        assert len(worker.runs_of(result.id)) == 1


def test_rollbacks_and_rolled_back_savepoints_run_nothing(
    app: Celery, worker: Worker, database_url: str
) -> None:
    from django.db import transaction

    record = task(app)
    marker = uuid.uuid4().hex
    with pytest.raises(Boom), transaction.atomic():
        record.delay(marker, "rolled back")
        raise Boom
    with transaction.atomic():
        outer = record.delay(marker, "outer")
        with pytest.raises(Boom), transaction.atomic():
            record.delay(marker, "savepoint rolled back")
            with transaction.atomic():
                record.delay(marker, "inside the rolled-back savepoint")
            raise Boom
        with transaction.atomic():
            kept = record.delay(marker, "savepoint kept")
    with pytest.raises(Boom), transaction.atomic(), jobrelay.bulk():
        record.delay(marker, "bulk rolled back")
        raise Boom
    with transaction.atomic(), jobrelay.bulk():
        bulk_kept = record.delay(marker, "bulk kept")
        with pytest.raises(Boom), transaction.atomic():
            record.delay(marker, "bulk savepoint rolled back")
            raise Boom

    # A task committed after all of them: once it ran and the worker finished every task it
    # received, whatever the transactions above had left in the queue has run too.
    with transaction.atomic():
        sentinel = record.delay("sentinel")
    worker.wait_run(sentinel.id)
    worker.wait_idle()
    for result in (outer, kept, bulk_kept):
        assert worker.runs_of(result.id)
    assert pending_rows(database_url) == 0
    ran = sorted(run["args"][1] for run in worker.runs() if run["args"][:1] == [marker])
    assert ran == ["bulk kept", "outer", "savepoint kept"]


def test_countdown_and_eta_run_no_earlier_than_asked(app: Celery, worker: Worker) -> None:
    from datetime import datetime, timedelta, timezone

    from django.db import transaction

    record = task(app)
    with transaction.atomic():
        sent = time.time()
        by_countdown = record.apply_async(("countdown",), countdown=3)
        eta = datetime.now(timezone.utc) + timedelta(seconds=2)
        by_eta = record.apply_async(("eta",), eta=eta)
    assert worker.wait_run(by_countdown.id)["at"] >= sent + 3
    assert worker.wait_run(by_eta.id)["at"] >= eta.timestamp()


def test_workflows_and_links_are_refused_at_the_call(app: Celery, django_db: Any) -> None:
    from django.db import transaction

    record = task(app)
    with transaction.atomic():
        for call, what in (
            (lambda: chain(record.s(1), record.s(2)).apply_async(), "a chain"),
            (lambda: group(record.s(1), record.s(2)).apply_async(), "a group"),
            (lambda: record.apply_async((1,), link=record.s()), "a link"),
            (lambda: record.apply_async((1,), link_error=record.s()), "a link_error"),
        ):
            with pytest.raises(jobrelay.Unsupported, match=what):
                call()
        # A chord needs a result backend before Celery sends its header's tasks.
        with_backend = Celery("with-backend", broker=app.conf.broker_url, backend="cache+memory://")
        with_backend.conf.broker_transport_options = app.conf.broker_transport_options
        part = with_backend.task(name="tasks.record", shared=False)(runs_in_the_worker)
        jobrelay.celery.install(with_backend)
        with pytest.raises(jobrelay.Unsupported, match="a chord"):
            chord([part.s(1), part.s(2)], part.s()).apply_async()
        with pytest.raises(jobrelay.JobError, match="not a UUID"):
            record.apply_async((1,), task_id="not-a-uuid")
        with pytest.raises(jobrelay.JobError, match="header 'n'"):
            record.apply_async((1,), headers={"n": 1})
        with pytest.raises(jobrelay.JobError, match="not JSON"):
            record.delay(object())
        with django_db.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pending_jobs")
            assert cursor.fetchone() == (0,)


def test_outside_a_transaction_celery_publishes_or_as_configured(
    app: Celery, worker: Worker, database_url: str
) -> None:
    record = task(app)
    published = record.delay("outside")
    assert pending_rows(database_url) == 0
    worker.wait_run(published.id)

    jobrelay.configure(outside_transaction="raise")
    with pytest.raises(jobrelay.NoTransaction):
        record.delay("refused")

    jobrelay.configure(outside_transaction="outbox")
    relayed = record.delay("through the outbox")
    worker.wait_run(relayed.id)


def test_many_calls_in_bulk_are_one_insert(app: Celery, worker: Worker, django_db: Any) -> None:
    from django.db import transaction
    from django.test.utils import CaptureQueriesContext

    record = task(app)
    with CaptureQueriesContext(django_db) as queries, transaction.atomic(), jobrelay.bulk():
        results = [record.delay(i, "bulk") for i in range(200)]
    inserts = [q for q in queries.captured_queries if "pending_jobs" in q["sql"]]
    assert len(inserts) == 1
    for result in results:
        worker.wait_run(result.id)


def test_the_django_settings_are_checked(django_db: Any) -> None:
    from django.apps import apps
    from django.core.exceptions import ImproperlyConfigured
    from django.test import override_settings

    config = apps.get_app_config("jobrelay")
    with (
        override_settings(JOBRELAY={"COLOUR": "blue"}),
        pytest.raises(ImproperlyConfigured, match=r"unknown key.*COLOUR"),
    ):
        config.ready()
    with (
        override_settings(JOBRELAY={"OUTSIDE_TRANSACTION": "later"}),
        pytest.raises(ImproperlyConfigured, match="outside_transaction must be one of"),
    ):
        config.ready()
    with override_settings(JOBRELAY={"TABLE": "app.outbox", "OUTSIDE_TRANSACTION": "raise"}):
        config.ready()
    assert (jobrelay.outbox.settings().table, jobrelay.outbox.settings().outside_transaction) == (
        "app.outbox",
        "raise",
    )
