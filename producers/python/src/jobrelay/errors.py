"""The package's exceptions."""

from __future__ import annotations


class JobrelayError(Exception):
    """Base of every error this package raises."""


class JobError(JobrelayError, ValueError):
    """A call that cannot become an outbox row (refused at the call, before any write)."""


class Unsupported(JobrelayError, TypeError):
    """A runner feature the outbox cannot carry (Celery chains, groups, chords, links; RQ
    dependencies and callbacks)."""


class NoTransaction(JobrelayError, RuntimeError):
    """A job call outside a transaction while `outside_transaction` is `"raise"`."""
