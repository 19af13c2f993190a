"""A connection pool for the synchronous server drivers that no exception can deplete.

A signal handler (a Celery soft time limit, an RQ job timeout, Ctrl-C) raises its
exception between any two bytecodes of the main thread: between taking a connection
and remembering it, inside the pool's own bookkeeping, in a ``finally``. A pool that
counts its connections in Python code then loses one for good at each such landing,
until every call waits for a connection that will never come back.

This pool counts nothing: a connection belongs to a :class:`Slot`, and the pool's
only account is the set of weak references to its live slots. The weak reference's
callback is a C function (``deque.append``), so when a slot is dropped, wherever an
exception left it, CPython tells the pool without running any Python code that could
be interrupted in turn; the next ``get`` frees its place. The pool never holds a lent
connection itself: a dropped slot's connection goes with it (the driver closes its
socket when it is collected), even when the driver keeps the exception that
interrupted it, whose traceback holds the slot (a cycle, which the collector frees;
``get`` runs it when the pool is exhausted). A caller gives a connection back with :meth:`put`
only after a call finished cleanly (one list append); after any exception it calls
:meth:`discard` (or merely drops the slot): a connection interrupted mid-statement,
with a half-read result or an open transaction, is closed, never reused.
"""

from __future__ import annotations

import gc
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any, Generic, TypeVar

from .._errors import StoreError, TransientStoreError

__all__ = ["Pool", "Slot"]

C = TypeVar("C")

# A caller waiting for a place looks again this often. (No condition variable: its
# wait() runs Python code between releasing and re-taking the lock, where an exception
# would leave the lock in the wrong state.)
_POLL = 0.002


class Slot(Generic[C]):
    """A place in the pool and the connection it holds while a caller uses it."""

    __slots__ = ("__weakref__", "conn", "ref", "since")

    def __init__(self, lost: Callable[[Any], object]) -> None:
        self.conn: C | None = None
        self.since = 0.0
        self.ref = weakref.ref(self, lost)


class Pool(Generic[C]):
    """At most ``size`` connections; idle ones are reused last in, first out."""

    def __init__(
        self,
        name: str,
        connect: Callable[[], C],
        *,
        size: int,
        timeout: float,
        close: Callable[[C], object],
        usable: Callable[[C], bool],
        recycle: float = 3600.0,
    ) -> None:
        self.name = name
        self.size = size
        self.timeout = timeout
        self.recycle = recycle
        self._connect = connect
        self._close = close
        self._usable = usable
        self._lock = threading.Lock()
        self._idle: list[Slot[C]] = []
        self._live: set[weakref.ref[Slot[C]]] = set()
        self._lost: deque[weakref.ref[Slot[C]]] = deque()
        self._closed = False
        # A store dropped without close(): its idle connections are closed with it.
        weakref.finalize(self, _close_idle, self._idle, close)

    def _drop(self, conn: C | None) -> None:
        if conn is not None:
            with suppress(Exception):  # it is being dropped anyway
                self._close(conn)

    def _reap(self) -> None:
        """Free the places of slots that were dropped without a put()."""
        # Forget a ref before taking it off the queue: an exception landing between the
        # two then leaves it queued (forgetting it again is harmless), never live forever.
        while self._lost:
            self._live.discard(self._lost[0])
            self._lost.popleft()

    def get(self) -> Slot[C]:
        """A slot holding a ready connection; driver errors propagate."""
        start = time.monotonic()
        collect = start + 0.5
        while True:
            slot: Slot[C] | None = None
            with self._lock:
                self._reap()
                if self._closed:
                    raise StoreError(f"{self.name}: the store is closed")
                if self._idle:
                    slot = self._idle.pop()
                elif len(self._live) < self.size:
                    slot = Slot(self._lost.append)
                    self._live.add(slot.ref)
            if slot is None:
                waited = time.monotonic() - start
                if waited >= self.timeout:
                    raise TransientStoreError(
                        f"{self.name}: no free connection within {self.timeout}s"
                        f" (pool size {self.size})"
                    )
                if time.monotonic() > collect and not self._lost:
                    # A dropped slot caught in a reference cycle (an exception kept in a
                    # frame it belongs to) is only found by the cycle collector.
                    collect += 1.0
                    gc.collect()
                time.sleep(_POLL)
                continue
            conn = slot.conn
            if conn is None:
                slot.conn = conn = self._connect()
                slot.since = time.monotonic()
                return slot
            if time.monotonic() - slot.since < self.recycle and self._usable(conn):
                return slot
            self.discard(slot)

    def put(self, slot: Slot[C]) -> None:
        """Give back the slot of a call that finished cleanly."""
        if self._closed:
            self.discard(slot)
            return
        self._idle.append(slot)

    def discard(self, slot: Slot[C]) -> None:
        """Close the slot's connection and free its place (a call went wrong)."""
        conn, slot.conn = slot.conn, None
        self._live.discard(slot.ref)
        self._drop(conn)

    @contextmanager
    def connection(self) -> Iterator[C]:
        """A connection for the duration of a ``with`` block (tests, maintenance)."""
        slot = self.get()
        try:
            assert slot.conn is not None
            yield slot.conn
        except BaseException:
            self.discard(slot)
            raise
        self.put(slot)

    def stats(self) -> dict[str, int]:
        """``size`` (connections open or opening), ``idle``, ``in_use``."""
        with self._lock:
            self._reap()
            live, idle = len(self._live), len(self._idle)
        return {"size": live, "idle": idle, "in_use": live - idle}

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            for slot in idle:
                self._live.discard(slot.ref)
        for slot in idle:
            self._drop(slot.conn)
            slot.conn = None


def _close_idle(idle: list[Slot[Any]], close: Callable[[Any], object]) -> None:
    for slot in idle:
        if slot.conn is not None:
            with suppress(Exception):
                close(slot.conn)
