"""Stopping the child processes the tests start (workers, the relay)."""

from __future__ import annotations

import subprocess


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL if the process has not exited within 15 s; reaped either way."""
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
