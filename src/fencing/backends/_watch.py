"""The self-deadlock watchdog the server stores share (``postgres/watch.py``,
``mysql/watch.py``; the why is in their headers).

* ``Holders``: which thread (and asyncio task) each connection given to
  ``store.using`` last ran a step for, and where it is (``bound.py`` records it;
  ``held``: the current thread's).
* ``Watchdog``: one daemon thread (per process and server) and one connection of its
  own, started on first use. Every ``interval`` it asks the server what blocks the
  statements registered longer than that; a blocker that is one of the statement's own
  thread's borrowed connections is a certain self-deadlock: ``blocker`` is set and the
  statement cancelled, both while the statement is still registered (``done`` waits).

A store's subclass says how its statement is known on the server (``watched``), how
the blockers are asked (``blockers``) and how a statement is cancelled (``cancel``);
what is due and what is caught are the pure ``due`` and ``own_blocker``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, Generic, TypeVar

__all__ = [
    "INTERVAL",
    "Holders",
    "Watchdog",
    "Watched",
    "due",
    "one_per",
    "own_blocker",
    "owner",
]

INTERVAL: Final = 0.2  # seconds a watched statement runs before its blockers are asked


@dataclass(eq=False)
class Watched:
    """A statement being watched: its connection's id on the server (PostgreSQL's pid,
    MySQL's thread id), the ids of its own thread's borrowed connections in a
    transaction, and what cancels it (the store's: PostgreSQL's cancel handle)."""

    conn_id: int
    mine: frozenset[int]
    handle: Any = None
    since: float = field(default_factory=time.monotonic)
    blocker: int | None = None  # set (and the statement cancelled) on a self-deadlock


def due(watched: Iterable[Watched], now: float, interval: float) -> list[Watched]:
    """The statements to ask about at ``now``: not caught yet, registered ``interval`` ago."""
    return [w for w in watched if w.blocker is None and now - w.since >= interval]


def own_blocker(watched: Watched, blockers: Mapping[int, Collection[int]]) -> int | None:
    """Which of the statement's own thread's connections blocks it (the lowest id), if any."""
    own = sorted(set(blockers.get(watched.conn_id, ())) & watched.mine)
    return own[0] if own else None


class Watchdog:
    """One daemon thread asking the server what blocks the watched statements."""

    thread_name: ClassVar[str] = "fencing-watchdog"
    #: what asking (or cancelling) may raise: logged, the connection closed, asked again
    errors: ClassVar[tuple[type[Exception], ...]] = (Exception,)
    logger: ClassVar[logging.Logger] = logging.getLogger("fencing")

    def __init__(self, connect: Callable[[], Any], interval: float = INTERVAL) -> None:
        self.connect = connect  # opens the watchdog's own connection
        self.interval = interval
        self._cond = threading.Condition()
        self._watched: set[Watched] = set()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._stopping = threading.Event()

    # -- what a store says ---------------------------------------------------------------
    def watched(self, conn: Any, mine: frozenset[int]) -> Watched | None:
        """The statement about to run on ``conn`` (None: it cannot be watched)."""
        raise NotImplementedError

    def blockers(self, conn: Any, ids: list[int]) -> Iterable[tuple[int, int]]:
        """(waiting, blocking) connection ids for the statements on connections ``ids``,
        asked on the watchdog's connection ``conn``."""
        raise NotImplementedError

    def cancel(self, conn: Any, watched: Watched) -> None:
        """Cancel the statement (``conn``: the watchdog's connection)."""
        raise NotImplementedError

    def lost(self, conn: Any) -> bool:
        """Whether the watchdog's connection is known to be closed (then opened again)."""
        return False

    # -- the drivers' side ---------------------------------------------------------------
    def watch(self, conn: Any, mine: frozenset[int]) -> Watched | None:
        """Register the statement about to run on ``conn`` (call ``done`` after it)."""
        watched = self.watched(conn, mine)
        if watched is None:
            return None
        with self._cond:
            if self._pid != os.getpid():  # a forked child: its own thread, its own state
                self._watched, self._thread, self._pid = set(), None, os.getpid()
            self._watched.add(watched)
            if self._thread is None and not self._stopping.is_set():
                self._thread = threading.Thread(
                    target=self._run, name=self.thread_name, daemon=True
                )
                self._thread.start()
            self._cond.notify()
        return watched

    def done(self, watched: Watched | None) -> None:
        if watched is None:
            return
        with self._cond:
            self._watched.discard(watched)

    def stop(self, timeout: float | None = None) -> None:
        """End the thread (it closes its connection); a later ``watch`` starts none.
        The process's watchdogs never stop: this is for tests."""
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    # -- the thread ----------------------------------------------------------------------
    def _next(self) -> list[Watched] | None:
        """The statements due a question (None: stopping)."""
        with self._cond:
            while not self._watched and not self._stopping.is_set():
                self._cond.wait()
            if not self._stopping.is_set():
                self._cond.wait(self.interval)
            if self._stopping.is_set():
                return None
            return due(self._watched, time.monotonic(), self.interval)

    def _catch(self, conn: Any, found: list[Watched]) -> None:
        pairs = self.blockers(conn, sorted({w.conn_id for w in found}))
        blockers: dict[int, set[int]] = {}
        for waiting, blocking in pairs:
            blockers.setdefault(int(waiting), set()).add(int(blocking))
        with self._cond:  # still registered: its connection runs no other statement yet
            for w in found:
                own = own_blocker(w, blockers)
                if own is not None and w in self._watched:
                    w.blocker = own
                    self.cancel(conn, w)

    def _run(self) -> None:
        conn: Any = None
        try:
            while (found := self._next()) is not None:
                if not found:
                    continue
                try:
                    if conn is None or self.lost(conn):
                        conn = self.connect()
                    self._catch(conn, found)
                except self.errors:
                    self.logger.debug(
                        "the self-deadlock watchdog could not ask the server", exc_info=True
                    )
                    _close(conn)
                    conn = None
                    self._stopping.wait(self.interval)
        finally:
            _close(conn)


def _close(conn: Any) -> None:
    if conn is not None:
        with contextlib.suppress(Exception):
            conn.close()


_D = TypeVar("_D", bound=Watchdog)
_LOCK: Final = threading.Lock()


def one_per(dogs: dict[Any, _D], key: Hashable, make: Callable[[], _D]) -> _D:
    """The process's watchdog in ``dogs`` for ``key`` (made by ``make`` on first use)."""
    found = dogs.get(key)
    if found is None:
        with _LOCK:
            found = dogs.get(key)
            if found is None:
                found = dogs[key] = make()
    return found


# -- whose transaction a borrowed connection holds (``bound.py`` records it) -------------
def owner() -> tuple[int, int]:
    """The current thread, and asyncio task (0: none)."""
    try:
        task = asyncio.current_task()
    except RuntimeError:
        task = None
    return threading.get_ident(), 0 if task is None else id(task)


_W = TypeVar("_W")


class Holders(Generic[_W]):
    """By thread (and task): the connections it last ran a step of ``store.using`` on,
    and where each one is (``_W``: the store's say; compared with a store's own)."""

    def __init__(self, locate: Callable[[Any], _W] | None = None) -> None:
        self._locate = locate  # where a connection is, read from it once
        self._by_owner: dict[tuple[int, int], weakref.WeakSet[Any]] = {}
        self._owner_of: weakref.WeakKeyDictionary[Any, tuple[int, int]] = (
            weakref.WeakKeyDictionary()
        )
        self._where: weakref.WeakKeyDictionary[Any, _W] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def hold(self, conn: Any, where: _W | None = None) -> None:
        """``conn`` (given to ``store.using``) is the current thread's (or task's); it is
        at ``where`` (None: where ``locate`` reads, once per connection)."""
        current = owner()
        try:
            if self._owner_of.get(conn) == current and (
                where is None or self._where.get(conn) == where
            ):
                return
            with self._lock:
                before = self._owner_of.get(conn)
                if before is not None and before in self._by_owner:
                    self._by_owner[before].discard(conn)
                self._owner_of[conn] = current
                self._by_owner.setdefault(current, weakref.WeakSet()).add(conn)
                if where is not None:
                    self._where[conn] = where
                elif conn not in self._where and self._locate is not None:
                    self._where[conn] = self._locate(conn)
                if len(self._by_owner) > 64:  # owners gone (threads ended, tasks done)
                    for gone in [o for o, conns in self._by_owner.items() if not conns]:
                        del self._by_owner[gone]
        except TypeError:  # cannot be weakly referenced: not watched
            pass

    def held(self) -> list[tuple[Any, _W | None]]:
        """The current thread's (or task's) connections, each with where it is."""
        if not self._by_owner:
            return []
        found = self._by_owner.get(owner())
        if not found:
            return []
        with self._lock:
            return [(conn, self._where.get(conn)) for conn in found]
