"""A private redis-server on a free port, owned by one test module."""

from __future__ import annotations

import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

import redis

from .wait import wait_for


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def private_redis() -> Iterator[str]:
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        process = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                tmp,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"redis://127.0.0.1:{port}/0"
        try:
            client = redis.Redis.from_url(url)

            def up() -> bool:
                try:
                    return bool(client.ping())
                except redis.ConnectionError:
                    return False

            wait_for(f"redis-server on port {port}", up, timeout=10)
            yield url
        finally:
            process.terminate()
            process.wait(timeout=10)
