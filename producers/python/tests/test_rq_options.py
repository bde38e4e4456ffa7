"""RQ's job options through the outbox behave as with RQ's own client: the same job with the
same options, once enqueued inside a transaction (relayed) and once outside (RQ enqueues it),
and the real `rq worker --serializer json --with-scheduler` treats both alike: `job_timeout`
stops the job, `Retry` runs a failing job again, `meta` and `description` reach the job,
`result_ttl`, `failure_ttl` and `ttl` are the job's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from redis import Redis
from rq import Retry
from rq.job import Job as RqJob
from rq.serializers import JSONSerializer

import jobrelay
from jobrelay.rq import Queue
from support.wait import wait_for
from support.workers import Worker, rq_worker_with_relay


@pytest.fixture(scope="module")
def worker(database_url: str, redis_url: str) -> Iterator[Worker]:
    with rq_worker_with_relay(database_url, redis_url) as worker:
        yield worker


@pytest.fixture(scope="module")
def queue(redis_url: str) -> Queue:
    return Queue("emails", connection=Redis.from_url(redis_url))


def both(queue: Queue, database_url: str, func: str, *args: Any, **options: Any) -> list[str]:
    """The job enqueued twice with the same options: relayed (in a transaction), then by RQ."""
    with psycopg.connect(database_url) as conn, jobrelay.using(conn):
        relayed = queue.enqueue(func, *args, **options)
    with psycopg.connect(database_url, autocommit=True) as conn, jobrelay.using(conn):
        own = queue.enqueue(func, *args, **options)
    return [relayed.id, own.id]


def fetch(queue: Queue, job_id: str) -> RqJob:
    return RqJob.fetch(job_id, connection=queue.connection, serializer=JSONSerializer)


def test_job_timeout_stops_the_job(queue: Queue, worker: Worker, database_url: str) -> None:
    for job_id in both(queue, database_url, "rq_jobs.sleep", 3, job_timeout=1):
        assert worker.wait_run(job_id, "started")["timeout"] == 1

        def failed_by_timeout(job_id: str = job_id) -> bool:
            job = fetch(queue, job_id)
            result = job.latest_result()
            return bool(
                job.is_failed and result and "JobTimeoutException" in (result.exc_string or "")
            )

        wait_for(f"job {job_id} failed by its timeout", failed_by_timeout)
        assert [r["outcome"] for r in worker.runs_of(job_id)] == ["started"]


def test_retry_runs_a_failing_job_again(queue: Queue, worker: Worker, database_url: str) -> None:
    for job_id in both(queue, database_url, "rq_jobs.fail", "x", retry=Retry(max=2)):
        wait_for(f"3 runs of {job_id}", lambda job_id=job_id: len(worker.runs_of(job_id)) == 3)
        wait_for(f"job {job_id} failed", lambda job_id=job_id: fetch(queue, job_id).is_failed)
        assert fetch(queue, job_id).retries_left == 0


def test_meta_description_and_ttls_are_the_jobs(
    queue: Queue, worker: Worker, database_url: str
) -> None:
    options: dict[str, Any] = {
        "meta": {"tenant": "acme"},
        "description": "nightly report",
        "result_ttl": 600,
        "failure_ttl": 3600,
        "ttl": 300,
    }
    for job_id in both(queue, database_url, "rq_jobs.record_job", "r", **options):
        run = worker.wait_run(job_id)
        assert run["meta"] == {"tenant": "acme"}
        assert (run["result_ttl"], run["failure_ttl"], run["ttl"]) == (600, 3600, 300)
        assert fetch(queue, job_id).description == "nightly report"
