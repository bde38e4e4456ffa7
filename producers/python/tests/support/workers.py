"""The real workers as child processes: `celery worker` and `rq worker --serializer json`,
running the task modules of tests/apps, each run recorded as one JSON line in a file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .process import stop
from .relay import running_relay
from .wait import wait_for

APPS = Path(__file__).resolve().parents[1] / "apps"
BIN = Path(sys.executable).parent


@dataclass
class Worker:
    runs_file: Path
    log: Path
    #: Other logs worth reading when a wait fails (the relay's).
    other_logs: list[Path] = field(default_factory=list)

    def runs(self) -> list[dict[str, Any]]:
        if not self.runs_file.exists():
            return []
        # A run being appended may be read half-written (a read is not atomic against another
        # process's write): only lines that end in a newline are whole.
        whole = self.runs_file.read_text().rpartition("\n")[0]
        return [json.loads(line) for line in whole.split("\n") if line]

    def runs_of(self, job_id: str) -> list[dict[str, Any]]:
        return [run for run in self.runs() if run["id"] == job_id]

    def wait_runs(self, count: int, timeout: float = 30.0) -> list[dict[str, Any]]:
        def probe() -> list[dict[str, Any]] | None:
            runs = self.runs()
            return runs if len(runs) >= count else None

        return wait_for(f"{count} recorded runs", probe, timeout)

    def wait_run(self, job_id: str, outcome: str = "ran", timeout: float = 30.0) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            return next((r for r in self.runs_of(job_id) if r["outcome"] == outcome), None)

        try:
            return wait_for(f"run of {job_id} ({outcome})", probe, timeout)
        except AssertionError as err:
            raise AssertionError(f"{err}\n{self.diagnostics()}") from None

    def diagnostics(self) -> str:
        logs = [self.log, *self.other_logs]
        return "\n".join(f"--- {log}:\n{log.read_text(errors='replace')[-4000:]}" for log in logs)

    def wait_idle(self, timeout: float = 30.0) -> None:
        """A Celery worker: every task it received has finished (succeeded or failed)."""

        def probe() -> bool:
            log = self.log_text()
            return log.count("] received") == log.count("] succeeded in") + log.count(
                "] raised unexpected"
            )

        wait_for("the worker to finish the tasks it received", probe, timeout)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@contextmanager
def _child(argv: Sequence[str], env: dict[str, str], ready: str | None) -> Iterator[Worker]:
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp) / "runs.jsonl"
        runs.touch()
        log = Path(tmp) / "worker.log"
        full_env = {**os.environ, **env, "JOBRELAY_TEST_RUNS": str(runs), "PYTHONPATH": str(APPS)}
        with log.open("wb") as out:
            process = subprocess.Popen(
                argv,
                cwd=APPS,
                env=full_env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        worker = Worker(runs, log)
        try:
            if ready is not None:
                wait_for(f"{argv[0]} ready", lambda: ready in worker.log_text(), timeout=60)
            yield worker
        finally:
            stop(process)


@contextmanager
def celery_worker(broker: str, keyprefix: str, queues: str = "celery,emails") -> Iterator[Worker]:
    argv = [
        str(BIN / "celery"),
        "-A",
        "celery_worker_app",
        "worker",
        "-Q",
        queues,
        "--pool",
        "prefork",
        "-c",
        "2",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "-l",
        "info",
    ]
    env = {"JOBRELAY_TEST_BROKER": broker, "JOBRELAY_TEST_KEYPREFIX": keyprefix}
    with _child(argv, env, " ready.") as worker:
        yield worker


@contextmanager
def rq_worker(redis_url: str, queues: Sequence[str] = ("default", "emails")) -> Iterator[Worker]:
    argv = [
        str(BIN / "rq"),
        "worker",
        "--serializer",
        "json",
        "--with-scheduler",
        "--url",
        redis_url,
        *queues,
    ]
    with _child(argv, {}, None) as worker:
        yield worker


@contextmanager
def rq_worker_with_relay(database_url: str, redis_url: str) -> Iterator[Worker]:
    """An RQ worker on the default queues and the relay (rq layout) feeding it; the relay's log
    is shown with the worker's when a wait fails."""
    with (
        rq_worker(redis_url) as worker,
        running_relay(database_url, redis_url, "rq") as relay_log,
    ):
        worker.other_logs.append(relay_log)
        yield worker
