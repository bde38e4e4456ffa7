#!/usr/bin/env python3
"""A reference consumer for jobrelay's default layout (docs/consumer.md).

It pops jobs safely (BLMOVE into a processing list of its own, LREM once done), moves due jobs
out of the scheduled set, releases a job's children once its handler returned and its heirs
once it and all its children completed, recovers the processing lists of consumers that died,
and releases children and heirs that arrived after their job completed. Every move of a job
from one key to another is one atomic script (MOVE below), so that two consumers never move the
same job twice and a crash never loses one.

Needs Redis 6.2 or later (BLMOVE) and redis-py (examples/consumer/requirements.txt). The job,
a jobrelay.v1.Job protobuf message (docs/wire.md), is decoded by hand below: no generated code.

    python3 jobrelay_consumer.py --redis-url redis://127.0.0.1:6379 --namespace app1: \\
        --queue default --queue emails --consumer-id "$(hostname)"

Replace `handle` (or fill HANDLERS) with your own work. CI runs this file
(tests/it/consumer.rs) with --record, which appends one JSON line per job run to a file.
"""

import argparse
import json
import os
import re
import signal
import socket
import sys
import threading
import time

import redis

# --- The job ------------------------------------------------------------------------------


class Job:
    """A jobrelay.v1.Job (proto/jobrelay/v1/job.proto) and the bytes it was decoded from."""

    def __init__(self, raw):
        self.raw = raw
        self.uuid = self.queue = self.job_type = ""
        self.payload = b""
        self.parent_uuid = self.predecessor_uuid = ""
        self.run_at = self.created_at = None  # (seconds, nanos), or None when unset
        self.headers = {}
        _decode(self, raw)

    def run_at_score(self):
        """run_at as the relay scores it in `scheduled`: epoch seconds, microseconds kept."""
        seconds, nanos = self.run_at
        return f"{seconds}.{nanos // 1000:06d}" if seconds >= 0 else repr(seconds + nanos / 1e9)


def _varint(buf, i):
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def _fields(buf):
    """(field number, value) for each field: an int for varints, bytes for the rest."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, i = _varint(buf, i)
        elif wire_type == 2:
            n, i = _varint(buf, i)
            value, i = buf[i:i + n], i + n
        elif wire_type in (1, 5):  # fixed64, fixed32: none in Job, skipped if ever added
            n = 8 if wire_type == 1 else 4
            value, i = buf[i:i + n], i + n
        else:
            raise ValueError(f"wire type {wire_type} in a jobrelay.v1.Job")
        yield number, value


def _timestamp(buf):
    """A google.protobuf.Timestamp: (seconds, nanos)."""
    seconds = nanos = 0
    for number, value in _fields(buf):
        if number == 1:
            seconds = value - (1 << 64) if value >= 1 << 63 else value
        elif number == 2:
            nanos = value
    return seconds, nanos


def _decode(job, raw):
    for number, value in _fields(raw):
        if number == 1:
            job.uuid = value.decode()
        elif number == 2:
            job.queue = value.decode()
        elif number == 3:
            job.job_type = value.decode()
        elif number == 4:
            job.payload = bytes(value)
        elif number == 5:
            job.parent_uuid = value.decode()
        elif number == 6:
            job.predecessor_uuid = value.decode()
        elif number == 7:
            job.run_at = _timestamp(value)
        elif number == 8:
            job.created_at = _timestamp(value)
        elif number == 9:
            entry = dict(_fields(value))
            job.headers[entry.get(1, b"").decode()] = entry.get(2, b"").decode()


# --- Moving jobs --------------------------------------------------------------------------

# Moves one job (ARGV[1], its bytes) out of KEYS[1] (a list, or the sorted set `scheduled` when
# ARGV[2] is 'zset') into KEYS[2]: into that sorted set with score ARGV[3] if it is not empty,
# else onto that list (LPUSH); and adds ARGV[4] (its uuid) to the set KEYS[3] if given (its
# parent's active children). Answers 1, or 0 when the job was no longer there (another consumer
# moved it): atomic, so a job is never moved twice nor lost halfway.
MOVE = """
local removed
if ARGV[2] == 'zset' then
  removed = redis.call('ZREM', KEYS[1], ARGV[1])
else
  removed = redis.call('LREM', KEYS[1], -1, ARGV[1])
end
if removed == 0 then return 0 end
if ARGV[3] ~= '' then
  redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
else
  redis.call('LPUSH', KEYS[2], ARGV[1])
end
if KEYS[3] then redis.call('SADD', KEYS[3], ARGV[4]) end
return 1
"""


class Consumer:
    def __init__(self, r, namespace, queues, consumer_id, handler, done_ttl):
        self.r, self.ns, self.queues, self.id = r, namespace, queues, consumer_id
        self.handler, self.done_ttl = handler, done_ttl
        self.move_script = r.register_script(MOVE)
        self.processing = self.key(f"processing:{consumer_id}")
        self.stopping = threading.Event()

    def key(self, name):
        return self.ns + name

    def now_score(self):
        """Redis's clock, which the relay compares run_at with, as epoch seconds."""
        seconds, micros = self.r.time()
        return f"{seconds}.{micros:06d}"

    def move(self, src, src_kind, raw, dest, score="", active=None, uuid=""):
        keys = [src, dest] + ([active] if active else [])
        return self.move_script(keys=keys, args=[raw, src_kind, score, uuid]) == 1

    def place(self, src, src_kind, raw, now):
        """Moves a job out of `src` to where it runs, as the relay's rules 3 and 4 place a job
        with dead_parent (docs/layouts/jobrelay.md#where-a-job-goes): a future run_at to
        `scheduled`, otherwise to its queue; a child is also noted in its parent's active set
        (by the relay only when queued; here when scheduled too, so that its parent waits for
        it)."""
        try:
            job = Job(raw)
        except (ValueError, IndexError, UnicodeDecodeError) as e:
            print(f"not a jobrelay.v1.Job in {src.decode()}: {e}", file=sys.stderr)
            return self.move(src, src_kind, raw, self.key("failed:undecodable"))
        active = self.key(f"jobs:{job.parent_uuid}:active") if job.parent_uuid else None
        if job.run_at is not None and float(job.run_at_score()) > float(now):
            dest, score = self.key("scheduled"), job.run_at_score()
        else:
            dest, score = self.key(f"queue:{job.queue}"), ""
        return self.move(src, src_kind, raw, dest, score, active, job.uuid)

    def release(self, list_key):
        """Releases every job held in a children or onComplete list, oldest first."""
        released, now = 0, self.now_score()
        while (raw := self.r.lindex(list_key, -1)) is not None:
            released += self.place(list_key, "list", raw, now)
        return released

    # --- Completing a job -------------------------------------------------------------

    def close(self, job):
        """The job's handler returned: release its children; once none is held or running,
        it is complete: release its heirs, then tell its parent."""
        u = job.uuid
        children, active = self.key(f"jobs:{u}:children"), self.key(f"jobs:{u}:active")
        waiting = self.key(f"jobs:{u}:waiting")
        if self.r.llen(children) or self.r.scard(active):
            # Its last child finishes its close, and needs the job for that.
            self.r.set(waiting, job.raw)
        if self.release(children) or self.r.scard(active):
            return
        self.release(self.key(f"jobs:{u}:onComplete"))
        # Complete: a child or heir relayed from now on is late (see sweep_late).
        self.r.set(self.key(f"jobs:{u}:done"), 1, ex=self.done_ttl)
        self.r.delete(waiting)
        if job.parent_uuid:
            p = job.parent_uuid
            self.r.srem(self.key(f"jobs:{p}:active"), u)
            parent = self.r.get(self.key(f"jobs:{p}:waiting"))
            if parent is not None:
                self.close(Job(parent))

    def sweep_late(self):
        """Children and heirs relayed after their job completed wait in its lists for a close
        that already happened: release them (docs/consumer.md#late-children-and-heirs)."""
        ns = re.sub(r"([*?\[\]\\])", r"\\\1", self.ns)  # a MATCH pattern's own characters
        for pattern in ("jobs:*:children", "jobs:*:onComplete"):
            for key in self.r.scan_iter(match=ns + pattern, count=1000):
                uuid = key[len(self.ns.encode()):].decode().split(":")[1]
                if self.r.exists(self.key(f"jobs:{uuid}:done")):
                    self.release(key)

    # --- Housekeeping: due jobs, dead consumers ---------------------------------------

    def promote_due(self):
        """Moves the due jobs of `scheduled` to their queues (docs/consumer.md)."""
        now = self.now_score()
        for raw in self.r.zrangebyscore(self.key("scheduled"), "-inf", now, start=0, num=1000):
            self.place(self.key("scheduled"), "zset", raw, now)

    def heartbeats(self, ttl):
        """Says every ttl/3 seconds, from a thread of its own (a long job must not look like
        a dead consumer), that this consumer lives; the thread, to join when stopping."""
        def beat():
            while True:
                self.r.sadd(self.key("consumers"), self.id)
                self.r.set(self.key(f"consumers:{self.id}"), int(time.time()), ex=ttl)
                if self.stopping.wait(ttl / 3):
                    return
        thread = threading.Thread(target=beat, daemon=True)
        thread.start()
        return thread

    def recover(self, consumer_id):
        """Puts back on their queues the jobs a consumer popped and never finished: they run
        again (at least once)."""
        processing = self.key(f"processing:{consumer_id}")
        while (raw := self.r.lindex(processing, -1)) is not None:
            try:
                dest = self.key(f"queue:{Job(raw).queue}")
            except (ValueError, IndexError, UnicodeDecodeError):
                dest = self.key("failed:undecodable")
            self.move(processing, "list", raw, dest)
        if consumer_id != self.id:
            self.r.srem(self.key("consumers"), consumer_id)

    def reap(self):
        """Recovers the processing lists of consumers whose heartbeat expired."""
        for member in self.r.smembers(self.key("consumers")):
            other = member.decode()
            if other != self.id and not self.r.exists(self.key(f"consumers:{other}")):
                self.recover(other)

    # --- The loop ---------------------------------------------------------------------

    def pop(self, timeout):
        """The next job's bytes, moved atomically into this consumer's processing list, or
        None."""
        for queue in self.queues:
            raw = self.r.blmove(self.key(f"queue:{queue}"), self.processing,
                                timeout / len(self.queues), "RIGHT", "LEFT")
            if raw is not None:
                return raw
        return None

    def work(self, raw):
        """Runs one popped job, completes it, and takes it off the processing list."""
        try:
            job = Job(raw)
        except (ValueError, IndexError, UnicodeDecodeError) as e:
            print(f"not a jobrelay.v1.Job: {e}", file=sys.stderr)
            self.move(self.processing, "list", raw, self.key("failed:undecodable"))
            return
        try:
            self.handler(job)
        except Exception as e:  # keep it for an operator; its children and heirs stay held
            print(f"job {job.uuid} ({job.job_type}) failed: {e!r}", file=sys.stderr)
            self.move(self.processing, "list", raw, self.key(f"failed:{job.queue}"))
            return
        self.close(job)
        self.r.lrem(self.processing, -1, raw)

    def run(self, housekeeping_every, late_every, heartbeat_ttl):
        beating = self.heartbeats(heartbeat_ttl)
        self.recover(self.id)  # restarted: what this id had popped never finished
        next_housekeeping = next_late = 0.0
        while not self.stopping.is_set():
            if time.monotonic() >= next_housekeeping:
                self.promote_due()
                self.reap()
                next_housekeeping = time.monotonic() + housekeeping_every
            if time.monotonic() >= next_late:
                self.sweep_late()
                next_late = time.monotonic() + late_every
            raw = self.pop(timeout=min(1.0, housekeeping_every))
            if raw is not None:
                self.work(raw)
        beating.join()
        self.r.srem(self.key("consumers"), self.id)
        self.r.delete(self.key(f"consumers:{self.id}"))


# --- Handlers -----------------------------------------------------------------------------

HANDLERS = {}  # job_type -> function(job)


def handle(job):
    """Runs a job: its job_type's handler, or prints it."""
    fn = HANDLERS.get(job.job_type)
    if fn is not None:
        return fn(job)
    print(f"{job.uuid} {job.queue} {job.job_type} {job.payload!r}", flush=True)


def recording(path, handler):
    """Wraps a handler to append one JSON line per run to `path` (what CI checks)."""
    def run(job):
        started = time.time()
        handler(job)
        record = {
            "uuid": job.uuid, "queue": job.queue, "job_type": job.job_type,
            "payload": job.payload.decode(errors="replace"), "parent_uuid": job.parent_uuid,
            "predecessor_uuid": job.predecessor_uuid,
            "run_at": None if job.run_at is None else float(job.run_at_score()),
            "started": started, "finished": time.time(),
        }
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(record) + "\n").encode())
        finally:
            os.close(fd)
    return run


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379"))
    p.add_argument("--namespace", default=os.environ.get("JOBRELAY_NAMESPACE", ""),
                   help="the relay's --namespace")
    p.add_argument("--queue", action="append", required=True, help="a queue to pop (repeat)")
    p.add_argument("--consumer-id", default=socket.gethostname(),
                   help="unique among running consumers, the same across restarts")
    p.add_argument("--housekeeping-every", type=float, default=1.0,
                   help="seconds between promotions of due jobs and heartbeats")
    p.add_argument("--late-every", type=float, default=30.0,
                   help="seconds between looks for late children and heirs (a SCAN)")
    p.add_argument("--done-ttl", type=int, default=86400,
                   help="seconds a completed job's jobs:<uuid>:done mark lives")
    p.add_argument("--heartbeat-ttl", type=int, default=30,
                   help="seconds without a heartbeat after which other consumers recover "
                        "this one's processing list")
    p.add_argument("--record", help="append one JSON line per job run to this file")
    a = p.parse_args()
    handler = recording(a.record, handle) if a.record else handle
    consumer = Consumer(redis.Redis.from_url(a.redis_url), a.namespace, a.queue,
                        a.consumer_id, handler, a.done_ttl)

    def stop(*_):
        consumer.stopping.set()  # finish the job in hand, then exit

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    consumer.run(a.housekeeping_every, a.late_every, a.heartbeat_ttl)


if __name__ == "__main__":
    main()
