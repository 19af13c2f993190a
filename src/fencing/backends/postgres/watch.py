"""Self-deadlock detection for the store's own PostgreSQL connections (issue 18, item 5).

A statement on one of the store's own connections can wait for a lock that the *same*
thread's (or asyncio task's) open transaction holds, on a connection that thread gave to
``store.using``: a row that transaction updated or locked (``select_for_update()``), or
the lease row a fenced commit in it key-share-locked (a takeover in the same thread). That
lock is released only when the transaction ends, and the thread is waiting here: it can
never be granted. ``lock_timeout`` bounds the wait; this module names the cause, and does
not wait that long.

* ``bound.py`` records which thread (or task) each borrowed connection last ran a step
  for (``held_here``: those of the current one, still in a transaction).
* The drivers run a statement *watched* only when the current thread (or task) has such
  a connection (else nothing is done: no cost on the usual path). A watched statement
  is registered with the process's ``Watchdog``: one daemon thread and one connection of
  its own, started on first use. Every ``INTERVAL`` it asks the server
  (``pg_blocking_pids``) what blocks the statements registered longer than that; a
  blocker that is one of the statement's own thread's borrowed connections is a
  certain self-deadlock (the thread cannot end that transaction while it waits): the
  statement is cancelled (``PQcancel``: it is rolled back whole, nothing written) and
  the driver raises ``SelfDeadlock`` naming that connection's pid.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Final

import psycopg
from psycopg.pq import TransactionStatus

__all__ = ["INTERVAL", "Watchdog", "Watched", "held_here", "hold", "watchdog"]

logger = logging.getLogger("fencing.postgres")

INTERVAL: Final = 0.2  # seconds a watched statement runs before its blockers are asked
_BLOCKERS: Final = "SELECT p, pg_blocking_pids(p) FROM unnest(%(pids)s::int[]) AS p"


@dataclass(eq=False)
class Watched:
    """A statement being watched: its connection's pid and cancel handle, and the pids of
    its own thread's borrowed connections in a transaction."""

    pid: int
    cancel: Any  # psycopg.pq.PGcancel: thread-safe
    mine: frozenset[int]
    since: float = field(default_factory=time.monotonic)
    blocker: int | None = None  # set (and the statement cancelled) on a self-deadlock


class Watchdog:
    """One daemon thread (per process and server) asking the server what blocks the
    watched statements."""

    def __init__(self, conninfo: str) -> None:
        self._conninfo = conninfo
        self._cond = threading.Condition()
        self._watched: set[Watched] = set()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def watch(self, conn: Any, mine: frozenset[int]) -> Watched:
        """Register the statement about to run on ``conn`` (call ``done`` after it)."""
        pgconn = conn.pgconn
        watched = Watched(pgconn.backend_pid, pgconn.get_cancel(), mine)
        with self._cond:
            if self._pid != os.getpid():  # a forked child: its own thread, its own state
                self._watched, self._thread, self._pid = set(), None, os.getpid()
            self._watched.add(watched)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="fencing-postgres-watchdog", daemon=True
                )
                self._thread.start()
            self._cond.notify()
        return watched

    def done(self, watched: Watched) -> None:
        with self._cond:
            self._watched.discard(watched)

    def _due(self) -> list[Watched]:
        with self._cond:
            while not self._watched:
                self._cond.wait()
            self._cond.wait(INTERVAL)
            now = time.monotonic()
            return [w for w in self._watched if w.blocker is None and now - w.since >= INTERVAL]

    def _run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        while True:
            due = self._due()
            if not due:
                continue
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self._conninfo, autocommit=True)
                rows = conn.execute(_BLOCKERS, {"pids": [w.pid for w in due]}).fetchall()
            except psycopg.Error:
                logger.debug("the self-deadlock watchdog could not ask the server", exc_info=True)
                if conn is not None:
                    conn.close()
                conn = None
                time.sleep(INTERVAL)
                continue
            blockers = {pid: set(found or ()) for pid, found in rows}
            with self._cond:
                for w in due:
                    own = sorted(blockers.get(w.pid, set()) & w.mine)
                    if own and w in self._watched:
                        w.blocker = own[0]
                        w.cancel.cancel()


# -- whose transaction a borrowed connection holds (``bound.py`` records it) -------------
# By thread (and task): the connections it last ran a step of ``store.using`` on, and
# each one's (host, port, database, pid), read once.
_BY_OWNER: dict[tuple[int, int], weakref.WeakSet[Any]] = {}
_OWNER_OF: weakref.WeakKeyDictionary[Any, tuple[int, int]] = weakref.WeakKeyDictionary()
_WHERE: weakref.WeakKeyDictionary[Any, tuple[Any, ...]] = weakref.WeakKeyDictionary()
_HELD_LOCK: Final = threading.Lock()
_OPEN: Final = (TransactionStatus.INTRANS, TransactionStatus.INERROR)


def _owner() -> tuple[int, int]:
    """The current thread, and asyncio task (0: none)."""
    try:
        task = asyncio.current_task()
    except RuntimeError:
        task = None
    return threading.get_ident(), 0 if task is None else id(task)


def hold(conn: Any) -> None:
    """``conn`` (given to ``store.using``: psycopg 3's or psycopg2's, whose ``info`` says
    the same) is the current thread's (or task's)."""
    owner = _owner()
    try:
        if _OWNER_OF.get(conn) == owner:
            return
        with _HELD_LOCK:
            before = _OWNER_OF.get(conn)
            if before is not None and before in _BY_OWNER:
                _BY_OWNER[before].discard(conn)
            _OWNER_OF[conn] = owner
            _BY_OWNER.setdefault(owner, weakref.WeakSet()).add(conn)
            if conn not in _WHERE:
                info = conn.info
                _WHERE[conn] = (info.host, info.port, info.dbname, info.backend_pid)
            if len(_BY_OWNER) > 64:  # owners gone (threads ended, tasks done)
                for gone in [o for o, conns in _BY_OWNER.items() if not conns]:
                    del _BY_OWNER[gone]
    except TypeError:  # cannot be weakly referenced: not watched
        pass


def held_here(info: Any) -> frozenset[int]:
    """The server pids of the current thread's (or task's) borrowed connections that are
    in a transaction, on the server and database ``info`` (a connection's) describes."""
    if not _BY_OWNER:
        return frozenset()
    found = _BY_OWNER.get(_owner())
    if not found:
        return frozenset()
    with _HELD_LOCK:
        mine = [(conn, _WHERE.get(conn)) for conn in found]
    here = (info.host, info.port, info.dbname)
    return frozenset(
        where[3]
        for conn, where in mine
        if where is not None
        and where[:3] == here
        and not conn.closed
        and conn.info.transaction_status in _OPEN  # (psycopg2's: the same numbers)
    )


_WATCHDOGS: dict[str, Watchdog] = {}
_LOCK: Final = threading.Lock()


def watchdog(conninfo: str) -> Watchdog:
    """The process's watchdog for the server ``conninfo`` reaches (made on first use)."""
    found = _WATCHDOGS.get(conninfo)
    if found is None:
        with _LOCK:
            found = _WATCHDOGS.setdefault(conninfo, Watchdog(conninfo))
    return found
