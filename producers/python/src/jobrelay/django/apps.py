"""Django's `AppConfig` of jobrelay: configures the outbox from `settings.JOBRELAY`."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from .. import outbox
from ..transactions import DjangoTransaction

_KEYS = frozenset({"DATABASE", "TABLE", "OUTSIDE_TRANSACTION"})


class JobrelayConfig(AppConfig):
    name = "jobrelay.django"
    label = "jobrelay"
    verbose_name = "jobrelay"

    def ready(self) -> None:
        conf: dict[str, Any] = dict(getattr(settings, "JOBRELAY", {}))
        unknown = set(conf) - _KEYS
        if unknown:
            raise ImproperlyConfigured(
                f"settings.JOBRELAY: unknown key(s) {', '.join(sorted(unknown))}; "
                f"known: {', '.join(sorted(_KEYS))}"
            )
        try:
            outbox.configure(
                transaction=DjangoTransaction(conf.get("DATABASE", "default")),
                table=conf.get("TABLE"),
                outside_transaction=conf.get("OUTSIDE_TRANSACTION"),
            )
        except ValueError as err:
            raise ImproperlyConfigured(f"settings.JOBRELAY: {err}") from None
