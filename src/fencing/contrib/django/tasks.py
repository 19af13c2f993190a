"""Fenced tasks sent the Django way: once Django's transaction commits
(:func:`enqueue_on_commit`, over ``transaction.on_commit``), or through fencing's outbox
written on Django's connection, in the transaction (:func:`outbox_send`).

::

    with transaction.atomic():
        order.status = "paid"
        order.save()
        enqueue_on_commit(ship, order, "ship")          # sent after the COMMIT, never before
    # or, so that a crash after the COMMIT cannot lose it:
    with transaction.atomic():
        order.save()
        outbox_send(ship, order, "ship")                # a row, committed with the order

``ship`` is a fenced task of ``fencing.contrib`` (Celery's ``fenced_task``, Dramatiq's
``fenced_actor``, RQ's ``fenced_job``, arq's ``fenced_function``); see docs/django.md.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from django.db import connections, router, transaction

from ..._errors import ConfigurationError
from ..._outbox import OutboxRow
from ..._validate import mapped_table
from ..._values import Intent
from .models import version_field
from .stores import store

__all__ = ["enqueue_on_commit", "outbox_send"]


def _alias(obj: Any, using: str | None) -> str:
    alias = using or obj._state.db or router.db_for_write(type(obj), instance=obj)
    return str(alias)


def _saved(obj: Any) -> Any:
    field = version_field(type(obj))
    if field is None:
        raise ConfigurationError(
            f"{type(obj).__name__} has no VersionField: a fenced task decides on a row's version"
        )
    if obj._state.adding or obj.pk is None:
        raise ValueError(f"save the {type(obj).__name__} before sending a task about it")
    return field


def enqueue_on_commit(
    task: Any,
    obj: Any,
    transition: str,
    *,
    guard: Mapping[str, Any] | None = None,
    using: str | None = None,
    **options: Any,
) -> None:
    """Send ``task`` with the intent to apply ``transition`` to ``obj``'s row once the
    transaction on ``using`` (default: the instance's database) commits; nothing is
    sent if it rolls back (outside ``atomic()``: at once). The intent is taken from the
    instance when the transaction has committed, at the version its last save left it
    at: a save made after this call, in the same transaction, does not make it stale on
    arrival. No read is made for it.

    ``task``: a fenced task with ``enqueue`` (Celery, Dramatiq; ``options`` are its
    own: ``countdown``, ``queue``, ``delay``, ...), or a callable taking the intent and
    ``options``, such as ``functools.partial(fencing.contrib.rq.enqueue_intent, queue,
    job)``. An asynchronous one (arq) cannot be awaited here: use :func:`outbox_send`.
    What the broker does not take is lost (a crash after the COMMIT too): when every
    committed change must reach the queue, use :func:`outbox_send`."""
    field = _saved(obj)
    alias = _alias(obj, using)
    send = getattr(task, "enqueue", None) or task
    if not callable(send):
        raise ConfigurationError(f"{task!r} is no fenced task (no enqueue) and not callable")
    table = mapped_table(type(obj), None)[0]

    def enqueue() -> None:
        intent = Intent.new(
            table, obj.pk, getattr(obj, field.attname), transition, guard=guard, kind="table"
        )
        sent = send(intent, **options)
        if inspect.isawaitable(sent):
            close = getattr(sent, "close", None)
            if close is not None:
                close()  # (never awaited: no "was never awaited" warning)
            raise ConfigurationError(
                f"{task!r} is asynchronous: enqueue_on_commit cannot await it; use"
                " outbox_send and the relay"
            )

    transaction.on_commit(enqueue, using=alias)


def outbox_send(
    task: Any,
    obj: Any,
    transition: str,
    *,
    guard: Mapping[str, Any] | None = None,
    using: str | None = None,
    **options: Any,
) -> OutboxRow:
    """Write ``task``'s message for ``transition`` on ``obj``'s row as a row of fencing's
    outbox, on Django's connection ``using`` (default: the instance's database), in the
    current transaction: rolled back with it, committed with it; a relay
    (``manage.py fencing_relay``) publishes it once committed. The intent is
    ``obj.intent(transition)``: read through the same connection, so call this after
    the instance's last save in the transaction (``StaleSave`` if the row moved on
    since the instance was loaded). ``options`` are the task's own send options."""
    _saved(obj)
    alias = _alias(obj, using)
    intent = obj.intent(transition, guard=guard, using=alias)
    row: OutboxRow = store(alias).using(connections[alias]).outbox.send(task, intent, **options)
    return row
