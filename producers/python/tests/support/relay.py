"""The relay binary as a child process: `jobrelay --layout ...` against a test's database."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from .process import stop

REPO = Path(__file__).resolve().parents[4]


def relay_bin() -> str:
    """`$JOBRELAY_BIN`, else the debug build of this checkout (built first if missing)."""
    explicit = os.environ.get("JOBRELAY_BIN")
    if explicit:
        return explicit
    target = Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")
    binary = target / "debug" / "jobrelay"
    if not binary.exists():
        subprocess.run(["cargo", "build", "--bin", "jobrelay"], cwd=REPO, check=True)
    return str(binary)


@contextmanager
def running_relay(
    database_url: str,
    redis_url: str,
    layout: str,
    namespace: str = "",
    extra: Sequence[str] = (),
) -> Iterator[Path]:
    """The relay daemon until the block ends; yields the path of its log."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "relay.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [
                    relay_bin(),
                    "--database-url",
                    database_url,
                    "--redis-url",
                    redis_url,
                    "--layout",
                    layout,
                    "--namespace",
                    namespace,
                    "--log-format",
                    "text",
                    "--http-addr",
                    "off",
                    *extra,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            yield log
        finally:
            stop(process)
