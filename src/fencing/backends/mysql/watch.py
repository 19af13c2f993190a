"""Self-deadlock detection for the store's own MySQL / MariaDB connections.

A statement on one of the store's own connections can wait for a row lock that the
*same* thread's open transaction holds, on a connection that thread gave to
``store.using`` (PyMySQL's or mysqlclient's: Django's): a row that transaction inserted,
updated or locked (``select_for_update()``), or the lease row a fenced commit in it
locked. That lock is released only when the transaction ends, and the thread is waiting
here: it can never be granted. ``innodb_lock_wait_timeout`` bounds the wait (then a
retryable error, which a queue retries into the same wait, again and again: a test
suite inside Django's ``TestCase`` transactions looked hung); this module names the
cause, and does not wait that long.

* ``bound.py`` records which thread (or task) each borrowed connection last ran a step
  for, and on which server (``hold``; ``held_here``: the server thread ids of the current
  thread's borrowed connections there).
* The driver runs a statement *watched* only when the current thread has such a
  connection (else nothing is done: no cost on the usual path). A watched statement is
  registered with the process's ``Watchdog`` for the server: one daemon thread and one
  connection of its own, started on first use. Every ``INTERVAL`` it asks the server
  which transactions block the statements registered longer than that (InnoDB's lock
  waits); a blocker that is one of the statement's own thread's borrowed connections is
  a certain self-deadlock: the statement is killed (``KILL QUERY``: InnoDB rolls the
  statement back, and the driver rolls the flow's transaction back, nothing written)
  and the driver raises ``SelfDeadlock`` naming that connection's thread id.

Metadata locks (DDL on the store's own connection while the caller's transaction read
the table) are not InnoDB lock waits: the server's ``lock_wait_timeout`` bounds those.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Final

from ..._errors import SelfDeadlock

__all__ = ["INTERVAL", "Watchdog", "Watched", "held_here", "hold", "self_deadlock", "watchdog"]

logger = logging.getLogger("fencing.mysql")

INTERVAL: Final = 0.2  # seconds a watched statement runs before its blockers are asked
#: MariaDB and MySQL 5.7: InnoDB's lock waits in information_schema; MySQL 8: sys's view
_BLOCKERS: Final = (
    "SELECT r.trx_mysql_thread_id, b.trx_mysql_thread_id"
    " FROM information_schema.INNODB_LOCK_WAITS w"
    " JOIN information_schema.INNODB_TRX r ON r.trx_id = w.requesting_trx_id"
    " JOIN information_schema.INNODB_TRX b ON b.trx_id = w.blocking_trx_id"
    " WHERE r.trx_mysql_thread_id IN ({})",
    "SELECT waiting_pid, blocking_pid FROM sys.innodb_lock_waits WHERE waiting_pid IN ({})",
)
_IN_TRANS: Final = 1  # SERVER_STATUS_IN_TRANS


def thread_id(conn: Any) -> int | None:
    """The server's thread id of a PyMySQL, aiomysql or mysqlclient connection."""
    found = getattr(conn, "server_thread_id", None)  # PyMySQL, aiomysql: a tuple
    if found:
        return int(found[0])
    ask = getattr(conn, "thread_id", None)  # mysqlclient
    if callable(ask):
        try:
            return int(ask())
        except Exception:  # closed
            return None
    return None


@dataclass(eq=False)
class Watched:
    """A statement being watched: its connection's thread id, and the thread ids of its
    own thread's borrowed connections."""

    thread: int
    mine: frozenset[int]
    since: float = field(default_factory=time.monotonic)
    blocker: int | None = None  # set (and the statement killed) on a self-deadlock


class Watchdog:
    """One daemon thread (per process and server) asking the server what blocks the
    watched statements."""

    def __init__(self, connect: Any) -> None:
        self._connect = connect
        self._cond = threading.Condition()
        self._watched: set[Watched] = set()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._query = 0  # which of _BLOCKERS the server answers

    def watch(self, conn: Any, mine: frozenset[int]) -> Watched | None:
        """Register the statement about to run on ``conn`` (call ``done`` after it)."""
        own = thread_id(conn)
        if own is None:
            return None
        watched = Watched(own, mine)
        with self._cond:
            if self._pid != os.getpid():  # a forked child: its own thread, its own state
                self._watched, self._thread, self._pid = set(), None, os.getpid()
            self._watched.add(watched)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="fencing-mysql-watchdog", daemon=True
                )
                self._thread.start()
            self._cond.notify()
        return watched

    def done(self, watched: Watched | None) -> None:
        if watched is None:
            return
        with self._cond:
            self._watched.discard(watched)

    def _due(self) -> list[Watched]:
        with self._cond:
            while not self._watched:
                self._cond.wait()
            self._cond.wait(INTERVAL)
            now = time.monotonic()
            return [w for w in self._watched if w.blocker is None and now - w.since >= INTERVAL]

    def _blockers(self, conn: Any, threads: list[int]) -> list[tuple[int, int]]:
        marks = ", ".join(["%s"] * len(threads))
        while True:
            try:
                with conn.cursor() as cur:
                    cur.execute(_BLOCKERS[self._query].format(marks), threads)
                    return [(int(a), int(b)) for a, b in cur.fetchall()]
            except Exception as exc:
                code = exc.args[0] if exc.args else None
                if code in (1109, 1146) and self._query + 1 < len(_BLOCKERS):
                    self._query += 1  # no such table here: the other server's view
                    continue
                raise

    def _run(self) -> None:
        conn: Any = None
        while True:
            due = self._due()
            if not due:
                continue
            try:
                if conn is None:
                    conn = self._connect()
                rows = self._blockers(conn, sorted({w.thread for w in due}))
                blockers: dict[int, set[int]] = {}
                for waiting, blocking in rows:
                    blockers.setdefault(waiting, set()).add(blocking)
                with self._cond:
                    kill = []
                    for w in due:
                        own = sorted(blockers.get(w.thread, set()) & w.mine)
                        if own and w in self._watched:
                            w.blocker = own[0]
                            kill.append(w.thread)
                for thread in kill:
                    with conn.cursor() as cur:
                        cur.execute(f"KILL QUERY {int(thread)}")
            except Exception:
                logger.debug("the self-deadlock watchdog could not ask the server", exc_info=True)
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()
                conn = None
                time.sleep(INTERVAL)


# -- whose transaction a borrowed connection holds (``bound.py`` records it) -------------
_BY_OWNER: dict[tuple[int, int], weakref.WeakSet[Any]] = {}
_OWNER_OF: weakref.WeakKeyDictionary[Any, tuple[int, int]] = weakref.WeakKeyDictionary()
_WHERE: weakref.WeakKeyDictionary[Any, object] = weakref.WeakKeyDictionary()
_HELD_LOCK: Final = threading.Lock()


def _owner() -> tuple[int, int]:
    """The current thread, and asyncio task (0: none)."""
    try:
        task = asyncio.current_task()
    except RuntimeError:
        task = None
    return threading.get_ident(), 0 if task is None else id(task)


def hold(conn: Any, where: object) -> None:
    """``conn`` (given to ``store.using`` of a store on server ``where``) is the current
    thread's (or task's)."""
    owner = _owner()
    try:
        if _OWNER_OF.get(conn) == owner and _WHERE.get(conn) == where:
            return
        with _HELD_LOCK:
            before = _OWNER_OF.get(conn)
            if before is not None and before in _BY_OWNER:
                _BY_OWNER[before].discard(conn)
            _OWNER_OF[conn] = owner
            _WHERE[conn] = where
            _BY_OWNER.setdefault(owner, weakref.WeakSet()).add(conn)
            if len(_BY_OWNER) > 64:  # owners gone (threads ended, tasks done)
                for gone in [o for o, conns in _BY_OWNER.items() if not conns]:
                    del _BY_OWNER[gone]
    except TypeError:  # cannot be weakly referenced: not watched
        pass


def _open(conn: Any) -> bool:
    state = getattr(conn, "open", None)  # PyMySQL: a property; mysqlclient: an int
    return bool(state() if callable(state) else state)


def _may_hold_locks(conn: Any) -> bool:
    """Whether ``conn`` may be in a transaction (PyMySQL knows; mysqlclient: unless its
    autocommit is on, it may be: Django's ``atomic()`` turns autocommit off)."""
    status = getattr(conn, "server_status", None)
    if status is not None and status & _IN_TRANS:
        return True
    try:
        return not conn.get_autocommit() or status is None
    except Exception:
        return False


def held_here(where: object) -> frozenset[int]:
    """The server thread ids of the current thread's (or task's) borrowed connections
    on server ``where`` that may hold locks in a transaction."""
    if not _BY_OWNER:
        return frozenset()
    found = _BY_OWNER.get(_owner())
    if not found:
        return frozenset()
    with _HELD_LOCK:
        mine = [conn for conn in found if _WHERE.get(conn) == where]
    ids = set()
    for conn in mine:
        if _open(conn) and _may_hold_locks(conn):
            ident = thread_id(conn)
            if ident is not None:
                ids.add(ident)
    return frozenset(ids)


_WATCHDOGS: dict[object, Watchdog] = {}
_LOCK: Final = threading.Lock()


def watchdog(where: object, connect: Any) -> Watchdog:
    """The process's watchdog for server ``where`` (made on first use; ``connect()``
    opens its connection)."""
    found = _WATCHDOGS.get(where)
    if found is None:
        with _LOCK:
            found = _WATCHDOGS.setdefault(where, Watchdog(connect))
    # the latest store's: the store that made the watchdog may be closed and its database
    # dropped since, and a connection the watchdog lost (a server restart) is made again
    found._connect = connect
    return found


def self_deadlock(thread: int) -> SelfDeadlock:
    """The error for a statement of the store's own that the watchdog killed: it waited
    for a lock of the connection with server thread id ``thread``, the same thread's."""
    return SelfDeadlock(
        "mysql: a statement on the store's own connection waited for a row locked by your"
        f" own open transaction, on connection thread id {thread} (given to store.using in"
        " this thread): it could never be granted while your code waits here, so it was"
        " killed, and nothing of it was written. End (commit or roll back) that"
        " transaction first, or make the call inside it through store.using(conn)",
        (thread,),
    )
