"""fencing for Django: ``INSTALLED_APPS = [..., "fencing.contrib.django"]``.

* :func:`store` — a fencing store per database alias, built from ``DATABASES`` (it
  follows Django's test database); ``store().using(connection)`` joins Django's
  transaction (``transaction.atomic()``, savepoints included).
* :class:`~fencing.contrib.django.models.FencedModel`, :class:`VersionField` — a model
  whose ``save()`` of a stale instance raises :class:`StaleSave` (import them from
  ``fencing.contrib.django.models`` in your models module, or from here once Django's
  apps are loaded).
* :data:`fenced_commit` — a signal sent for each fenced commit on a model's table.
* :func:`enqueue_on_commit`, :func:`outbox_send` — a fenced task sent once Django's
  transaction commits, or written to fencing's outbox in it (``tasks``).
* migration operations (``operations``), ``manage.py fencing_*`` commands, system
  checks (``checks``).

See docs/django.md.
"""

from __future__ import annotations

from typing import Any

from .errors import StaleSave
from .signals import fenced_commit
from .stores import close_stores, database_url, signer, store

__all__ = [
    "FencedManager",
    "FencedModel",
    "FencedQuerySet",
    "StaleSave",
    "VersionField",
    "close_stores",
    "database_url",
    "enqueue_on_commit",
    "fenced_commit",
    "outbox_send",
    "signer",
    "store",
    "table",
]

_MODELS = frozenset({"FencedManager", "FencedModel", "FencedQuerySet", "table"})
_TASKS = frozenset({"enqueue_on_commit", "outbox_send"})


def __getattr__(name: str) -> Any:
    # The models module defines a model: it may be imported only once Django's apps are.
    if name in _MODELS:
        from . import models

        return getattr(models, name)
    if name in _TASKS:
        from . import tasks

        return getattr(tasks, name)
    if name == "VersionField":
        from .fields import VersionField

        return VersionField
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
