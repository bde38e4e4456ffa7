"""The functions of docs/producers/python.md's example, for the RQ worker of test_docs.py."""

from rq_jobs import record_job


def send_welcome(*args, **kwargs):
    record_job(*args, **kwargs)


def remind(*args, **kwargs):
    record_job(*args, **kwargs)
