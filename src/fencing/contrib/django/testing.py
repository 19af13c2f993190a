"""Fenced tasks in a Django ``TestCase`` (or a pytest-django test).

A ``TestCase`` runs each test inside a transaction that is rolled back at its end, on
Django's connection. A fenced task run eagerly (``ship.apply(...)``, Celery's
``task_always_eager``, an RQ queue with ``is_async=False``, ...) commits through its
target, ``store().table(Order)``, on fencing's own connections: they cannot see the
test's uncommitted rows, so the task answers ``Missing``. Inside
:func:`tasks_on_test_connection` every fenced task of ``fencing.contrib`` (Celery, RQ,
Dramatiq, and arq's sync runs) commits through Django's connection instead, inside
the test's transaction: it sees the test's rows, and what it commits is rolled back
with the test::

    from fencing.contrib.django.testing import FencedTasksMixin, run_task

    class ShipTests(FencedTasksMixin, TestCase):
        def test_ship(self):
            order = Order.objects.create(status="paid")
            report = run_task(ship, order, "ship")      # or ship.apply(...) in Celery
            assert report.outcome.kind == "committed"

No custom test runner is needed: ``manage.py test`` and pytest-django work as they
are (the app closes fencing's stores before the test database is dropped).
Leases and recorded effects are still written on fencing's own connections (they are
never rolled back): on SQLite, whose writers wait for each other, a task with a lease
or effects inside a ``TestCase`` waits on the test's own write lock; use a
``TransactionTestCase`` for those.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from django.db import connections

from fencing import ConfigurationError, Intent, Record

from .._target import SyncTarget, sync_view
from .stores import alias_of, store

__all__ = ["FencedTasksMixin", "run_task", "tasks_on_test_connection"]


@contextlib.contextmanager
def tasks_on_test_connection(using: str = "default") -> Iterator[None]:
    """Within it (a context manager, or a decorator), fenced tasks run in this thread
    commit through Django's connection (the test's transaction): their target is the
    same table or collection of ``store(alias).using(connections[alias])``, where
    ``alias`` is the database whose ``store()`` made the target, else ``using`` (a
    target made at import time, on a store that is not the test database's)."""
    if using not in connections.settings:
        raise ConfigurationError(f"no database {using!r} in settings.DATABASES")

    def view(target: SyncTarget) -> SyncTarget:
        alias = alias_of(target._store) or using
        bound = store(alias).using(connections[alias])
        front: SyncTarget = bound._front(type(target), target.target, target._declared)
        if target._binders:
            front._binders = target._binders
        return front

    token = sync_view.set(view)
    try:
        yield
    finally:
        sync_view.reset(token)


def run_task(
    task: Any,
    what: Any,
    transition: str | None = None,
    *,
    guard: Any = None,
    using: str = "default",
    attempt: int = 1,
) -> Any:
    """Run fenced ``task`` (of any queue of ``fencing.contrib``) here and now on the
    test's connection, as a worker would run the message its ``enqueue`` sends:
    ``what`` is an instance of a FencedModel (with ``transition``), a fencing Record
    (with ``transition``) or an Intent. Returns the run's ``TaskReport`` (its
    ``outcome``, ``action``, ...)."""
    spec = getattr(task, "fencing", None)
    if spec is None or not hasattr(spec, "run"):
        raise ConfigurationError(
            f"run_task() takes a fenced task of fencing.contrib, not {type(task).__name__}"
        )
    if not isinstance(what, Intent | Record):
        intent = getattr(what, "intent", None)
        if intent is None or transition is None:
            raise ConfigurationError(
                "run_task() takes a FencedModel instance and a transition, a Record and a"
                " transition, or an Intent"
            )
        what, transition = intent(transition, guard=guard, using=using), None
        guard = None
    with tasks_on_test_connection(using):
        payload = spec.encode(what, transition, guard=guard)
        return spec.run(payload, attempt=attempt)


class FencedTasksMixin:
    """A ``TestCase`` mixin: every test runs inside :func:`tasks_on_test_connection`."""

    def setUp(self) -> None:
        super().setUp()  # type: ignore[misc]
        context = tasks_on_test_connection()
        context.__enter__()
        self.addCleanup(context.__exit__, None, None, None)  # type: ignore[attr-defined]
