"""The Django app: add `"jobrelay.django"` to `INSTALLED_APPS` and Celery and RQ calls inside
`transaction.atomic()` write outbox rows on Django's connection.

Settings (all optional), read when Django starts:

```python no-run
JOBRELAY = {
    "DATABASE": "default",            # the connection alias the rows are written on
    "TABLE": "pending_jobs",          # the relay's --table
    "OUTSIDE_TRANSACTION": "publish", # or "outbox", "raise"
}
```
"""

default_app_config = "jobrelay.django.apps.JobrelayConfig"
