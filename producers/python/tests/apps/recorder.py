"""What the test workers' tasks share: one JSON line per run, appended to $JOBRELAY_TEST_RUNS
in a single write (whole lines, even from several worker processes)."""

import json
import os
import time


def record(**fields):
    fields["at"] = time.time()
    line = (json.dumps(fields, default=str) + "\n").encode()
    fd = os.open(os.environ["JOBRELAY_TEST_RUNS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
