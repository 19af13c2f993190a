"""Enqueue after commit: send a task only once the transaction that made its record committed.

A task enqueued inside a transaction that later rolls back runs against a state that
never existed; one enqueued before the commit may run before the commit is visible.
Both helpers here hold calls back until the caller's transaction has committed, and
drop them if it rolls back::

    # psycopg 3 (sync or async): the block is one transaction
    with after_commit(conn) as defer:
        conn.execute("UPDATE orders SET status = 'packed' WHERE id = %s", (42,))
        defer(ship.enqueue, table.intent(42, "ship"))
    # committed here, then ship.enqueue(...) ran

    # SQLAlchemy: like Django's transaction.on_commit
    on_commit(session, ship.enqueue, intent)
    session.commit()                       # ship.enqueue(intent) runs after the COMMIT

What this does not give: a crash between the commit and the enqueue loses the
enqueue (nothing is written twice, but nothing is sent either). When every committed
change must reach the queue, write the intent to an outbox table in the same
transaction and relay it. If a deferred call raises, the others still run and
:class:`EnqueueFailed` is raised after all of them, from the ``with`` block's exit or
from ``session.commit()``: the transaction *has* committed; the intent is safe to
send again.
"""

from __future__ import annotations

import importlib
import inspect
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    contextmanager,
)
from typing import Any, Protocol
from weakref import WeakKeyDictionary

from .._errors import FencingError, InvalidInput, MissingDependency

__all__ = [
    "Defer",
    "EnqueueFailed",
    "TransactionStateError",
    "after_commit",
    "async_after_commit",
    "on_commit",
]

Call = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]

#: ``psycopg.pq.TransactionStatus.IDLE``: no transaction in progress.
_PG_IDLE = 0
_SESSION_KEY = "fencing.contrib.tx.pending"


class TransactionStateError(FencingError):
    """The helper cannot know when the transaction commits (it did not open it)."""


class EnqueueFailed(FencingError):
    """The transaction committed, but deferred calls raised; ``errors`` holds them."""

    def __init__(self, errors: list[Exception]) -> None:
        self.errors = errors
        details = "; ".join(f"{type(e).__name__}: {e}" for e in errors)
        super().__init__(
            f"the transaction committed but {len(errors)} deferred call(s) failed ({details});"
            " what they were to enqueue was not sent: send it again"
        )


class Defer(Protocol):
    """``defer(fn, *args, **kwargs)``: call ``fn`` after the transaction commits."""

    def __call__(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> None: ...


class _Calls:
    """The calls deferred in one block; the block's ``defer``."""

    __slots__ = ("calls", "open")

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.open = True

    def __call__(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> None:
        if not callable(fn):
            raise InvalidInput(f"defer() needs a callable, not {type(fn).__name__}")
        if not self.open:
            raise TransactionStateError("defer() was called after its block had ended")
        self.calls.append((fn, args, kwargs))


def _run(calls: list[Call]) -> None:
    errors: list[Exception] = []
    for fn, args, kwargs in calls:
        try:
            fn(*args, **kwargs)
        except Exception as exc:
            errors.append(exc)
    if errors:
        raise EnqueueFailed(errors)


async def _arun(calls: list[Call]) -> None:
    errors: list[Exception] = []
    for fn, args, kwargs in calls:
        try:
            result = fn(*args, **kwargs)
            if inspect.isawaitable(result):
                await result
        except Exception as exc:
            errors.append(exc)
    if errors:
        raise EnqueueFailed(errors)


# -- psycopg 3 ---------------------------------------------------------------------------
class PgConnection(Protocol):
    """What :func:`after_commit` uses of a ``psycopg.Connection``."""

    @property
    def info(self) -> Any: ...

    def transaction(self) -> AbstractContextManager[Any]: ...


class AsyncPgConnection(Protocol):
    """What :func:`async_after_commit` uses of a ``psycopg.AsyncConnection``."""

    @property
    def info(self) -> Any: ...

    def transaction(self) -> AbstractAsyncContextManager[Any]: ...


# Blocks open per connection: an inner block hands its calls to the outer one.
_blocks: WeakKeyDictionary[object, list[_Calls]] = WeakKeyDictionary()
_blocks_lock = threading.Lock()


def _enter(conn: Any) -> tuple[list[_Calls], _Calls]:
    with _blocks_lock:
        stack = _blocks.setdefault(conn, [])
    if not stack and conn.info.transaction_status != _PG_IDLE:
        raise TransactionStateError(
            "the connection is already in a transaction that after_commit did not open:"
            " commit it first, or open the outermost transaction with after_commit"
        )
    calls = _Calls()
    stack.append(calls)
    return stack, calls


def _leave(stack: list[_Calls], calls: _Calls, committed: bool) -> list[Call]:
    """Close the block; the calls to run now (none when nested or rolled back)."""
    calls.open = False
    stack.pop()
    if not committed:
        return []
    if stack:  # a savepoint was released: the calls wait for the enclosing transaction
        stack[-1].calls.extend(calls.calls)
        return []
    return calls.calls


@contextmanager
def after_commit(conn: PgConnection) -> Iterator[Defer]:
    """Run the block in a transaction on ``conn``; deferred calls run once it commits.

    The block must open the connection's outermost transaction (the connection is
    idle: autocommit, or nothing executed since the last commit), or be nested in
    another ``after_commit`` block on the same connection, whose commit it then
    waits for. Calls deferred in a block that raises (``psycopg.Rollback`` included)
    or whose COMMIT fails are dropped.
    """
    stack, calls = _enter(conn)
    committed = False
    try:
        failed = False
        with conn.transaction():
            try:
                yield calls
            except BaseException:
                failed = True
                raise
        committed = not failed  # psycopg swallows a Rollback aimed at this transaction
    finally:
        ready = _leave(stack, calls, committed)
    _run(ready)


@asynccontextmanager
async def async_after_commit(conn: AsyncPgConnection) -> AsyncIterator[Defer]:
    """:func:`after_commit` for a ``psycopg.AsyncConnection``; deferred calls may be async."""
    stack, calls = _enter(conn)
    committed = False
    try:
        failed = False
        async with conn.transaction():
            try:
                yield calls
            except BaseException:
                failed = True
                raise
        committed = not failed
    finally:
        ready = _leave(stack, calls, committed)
    await _arun(ready)


# -- SQLAlchemy ---------------------------------------------------------------------------
def _sqlalchemy_event() -> Any:
    try:
        return importlib.import_module("sqlalchemy.event")
    except ModuleNotFoundError as exc:
        raise MissingDependency(
            f"on_commit needs {exc.name}: pip install 'sqlalchemy>=2.0'"
        ) from exc


def _root(transaction: Any) -> Any:
    while transaction.parent is not None:
        transaction = transaction.parent
    return transaction


def _within(transaction: Any, ancestor: Any) -> bool:
    while transaction is not None:
        if transaction is ancestor:
            return True
        transaction = transaction.parent
    return False


def _pending(session: Any) -> list[tuple[Any, Call]]:
    pending: list[tuple[Any, Call]] = session.info.setdefault(_SESSION_KEY, [])
    return pending


def _after_commit(session: Any) -> None:
    nested = session.get_nested_transaction()
    pending = _pending(session)
    if nested is not None:
        # A savepoint was released: its calls now wait for the enclosing transaction.
        pending[:] = [(nested.parent if tx is nested else tx, call) for tx, call in pending]
        return
    root = session.get_transaction()
    ready = [call for tx, call in pending if root is not None and _root(tx) is root]
    pending.clear()
    _run(ready)


def _after_soft_rollback(session: Any, previous_transaction: Any) -> None:
    pending = _pending(session)
    pending[:] = [(tx, call) for tx, call in pending if not _within(tx, previous_transaction)]


def _after_transaction_end(session: Any, transaction: Any) -> None:
    if transaction.parent is None:  # the root ended without commit (closed): drop its calls
        pending = _pending(session)
        pending[:] = [(tx, call) for tx, call in pending if _root(tx) is not transaction]


def on_commit(session: Any, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> None:
    """Call ``fn(*args, **kwargs)`` after ``session``'s current transaction commits.

    ``session`` is a SQLAlchemy ``Session`` (for an ``AsyncSession``, its
    ``sync_session``, with a sync ``fn``). Dropped if the transaction, or the
    savepoint (``begin_nested``) it was registered in, rolls back. A transaction
    must be in progress (``session.begin()``, or any use of the session since the
    last commit); otherwise nothing could tell when to call ``fn``.
    """
    if not callable(fn):
        raise InvalidInput(f"on_commit() needs a callable, not {type(fn).__name__}")
    event = _sqlalchemy_event()
    transaction = session.get_nested_transaction() or session.get_transaction()
    if transaction is None:
        raise TransactionStateError(
            "on_commit() needs a transaction in progress on the session"
            " (session.begin(), or use the session first)"
        )
    if _SESSION_KEY not in session.info:
        event.listen(session, "after_commit", _after_commit)
        event.listen(session, "after_soft_rollback", _after_soft_rollback)
        event.listen(session, "after_transaction_end", _after_transaction_end)
    _pending(session).append((transaction, (fn, args, dict(kwargs))))
