"""The worker's own transaction: a fenced task's commit, its own writes and the next
step's message, committed together or not at all.

``fenced_task(..., transaction=T, then=step)`` runs each delivery as::

    with T() as tx:                                   # the worker's transaction
        outcome = target.using(tx).apply(intent, decide, ...)   # the fenced commit, in tx
        if outcome is Committed:
            step(Step(...))                           # the worker's writes, outbox.send, in tx
        else:
            roll back                                 # Stale, Duplicate, Fenced, ...: nothing
    # committed here (the fenced commit, the writes, the next step's outbox row)

``T`` is anything whose call gives a context manager that yields a connection or
session ``store.using()`` accepts and that commits on a clean exit and rolls back when
an exception leaves it: a SQLAlchemy ``sessionmaker`` or ``Engine`` (their ``begin()``
is called), a psycopg ``ConnectionPool`` (its ``connection()``), or any zero-argument
function returning such a context manager (``lambda: engine.begin()``, a ``sqlite3``
connection used as a context manager, ...). Async tasks take the asyncio twins.

``then(step)`` runs only when the fenced commit answered ``Committed``, inside the same
transaction, with the record at its new version: an intent taken from ``step.record``
(``step.send(task, step.record, "notify")``) is fresh when it arrives. A redelivery
after the commit answers ``Duplicate`` and runs nothing again. If ``then`` raises,
nothing of the run remains (the error is handled as any error of a task: retried with
``retry_on``, else failed).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass
from typing import Any

from .._errors import ConfigurationError
from .._values import Intent, Outcome, Record

__all__ = [
    "Refused",
    "Step",
    "TransactionSource",
    "check_joinable",
    "entered",
    "maybe_await",
    "opener",
    "sends",
]

#: What ``transaction=`` takes (see the module docstring).
TransactionSource = Any


@dataclass(frozen=True, slots=True, eq=False)
class Step:
    """What ``then`` receives, inside the worker's transaction after a fenced commit.

    ``connection`` is the transaction's session or connection (add your rows to it);
    ``record`` is the record as committed (its new version); ``target`` is the task's
    collection or table bound to the transaction and ``store`` its store's view
    (``store.outbox.send(...)`` writes into the same transaction)."""

    intent: Intent
    outcome: Outcome
    record: Record
    connection: Any
    store: Any
    target: Any

    def send(self, task: object, what: Any, transition: str | None = None, **options: Any) -> Any:
        """``store.outbox.send(task, what, transition, ...)`` in this transaction: the
        next step's message, published by the relay once the transaction commits."""
        return self.store.outbox.send(task, what, transition, **options)


def _begin_of(source: object) -> Callable[[], Any] | None:
    """``source.begin`` for a SQLAlchemy sessionmaker or engine (sync or asyncio)."""
    module = type(source).__module__
    if module.startswith("sqlalchemy.") and callable(getattr(source, "begin", None)):
        begin: Callable[[], Any] = source.begin  # type: ignore[attr-defined]
        return begin
    return None


def _pooled(source: object) -> Callable[[], Any] | None:
    """``pool.connection`` for a psycopg pool (its context commits or rolls back)."""
    if type(source).__module__.startswith("psycopg_pool") and callable(
        getattr(source, "connection", None)
    ):
        connection: Callable[[], Any] = source.connection  # type: ignore[attr-defined]
        return connection
    return None


def opener(source: TransactionSource) -> Callable[[], Any]:
    """A zero-argument function giving the transaction's context manager, checked."""
    found = _begin_of(source) or _pooled(source)
    if found is not None:
        return found
    if not callable(source):
        raise ConfigurationError(
            "transaction must be a SQLAlchemy sessionmaker or Engine, a psycopg pool, or a"
            " function returning a context manager that yields a connection and commits on"
            f" a clean exit, not {type(source).__name__}"
        )
    fn: Callable[[], Any] = source
    return fn


def entered(made: object, *, want_async: bool) -> Any:
    """``made`` (what the opener returned), checked to be the right kind of context."""
    if want_async:
        if not isinstance(made, AbstractAsyncContextManager) and not (
            hasattr(made, "__aenter__") and hasattr(made, "__aexit__")
        ):
            raise ConfigurationError(
                "an async task's transaction must give an async context manager (an"
                " async_sessionmaker, AsyncEngine, AsyncConnectionPool), not"
                f" {type(made).__name__}"
            )
        return made
    if not isinstance(made, AbstractContextManager) and not (
        hasattr(made, "__enter__") and hasattr(made, "__exit__")
    ):
        raise ConfigurationError(
            "a task's transaction must give a context manager (sessionmaker, Engine,"
            f" ConnectionPool, a sqlite3 connection), not {type(made).__name__}"
        )
    return made


def check_joinable(target: Any) -> None:
    """A task with ``transaction=`` commits through ``store.using()``: refused at once
    for a store that cannot join a transaction (memory, Redis)."""
    if getattr(target._store.backend, "bind", None) is None:
        raise ConfigurationError(
            f"transaction=: a {target._store.backend.scheme} store has no transaction of"
            " yours to join (PostgreSQL, MySQL/MariaDB and SQLite stores do)"
        )


def sends(then: object) -> Callable[[Step], Any] | None:
    """``then``, checked."""
    if then is None:
        return None
    if not callable(then):
        raise ConfigurationError(f"then must be a function of the step, not {type(then).__name__}")
    return then


async def maybe_await(value: object) -> None:
    if inspect.isawaitable(value):
        await value


class Refused(Exception):
    """Leaves the worker's transaction without committing it (the outcome is not
    ``Committed``); carries the outcome out."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.kind)
        self.outcome = outcome
