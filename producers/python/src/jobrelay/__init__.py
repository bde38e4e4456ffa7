"""jobrelay for Python: the application's Celery and RQ calls, made inside a database
transaction, become rows of jobrelay's `pending_jobs` outbox on that transaction's connection.

Layout:

- `outbox`: where a call goes (`configure`, `using`, `bulk`, the one-statement `INSERT`);
- `transactions`: one adapter per framework and driver (Django, SQLAlchemy, psycopg);
- `celery`: `install(app)`, the seam in Celery's task publishing;
- `rq`: `Queue`, RQ's queue writing into the outbox;
- `django`: the Django app (`INSTALLED_APPS`) that makes Django's connection the default;
- `errors`: the exceptions.

Guide: docs/producers/python.md in the jobrelay repository.
"""

from ._job import Job
from .errors import JobError, JobrelayError, NoTransaction, Unsupported
from .outbox import bulk, configure, current, insert, using

__all__ = [
    "Job",
    "JobError",
    "JobrelayError",
    "NoTransaction",
    "Unsupported",
    "bulk",
    "configure",
    "current",
    "insert",
    "using",
]
