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
  is registered with the process's ``Watchdog`` (``backends/_watch.py``): one daemon
  thread and one connection of its own, started on first use. Every ``INTERVAL`` it asks
  the server (``pg_blocking_pids``) what blocks the statements registered longer than
  that; a blocker that is one of the statement's own thread's borrowed connections is a
  certain self-deadlock (the thread cannot end that transaction while it waits): the
  statement is cancelled (``PQcancel``: it is rolled back whole, nothing written) and
  the driver raises ``SelfDeadlock`` naming that connection's pid.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Final

import psycopg
from psycopg.pq import TransactionStatus

from .. import _watch
from .._watch import INTERVAL, Watched

__all__ = ["INTERVAL", "Watchdog", "Watched", "held_here", "hold", "watchdog"]

_BLOCKERS: Final = "SELECT p, pg_blocking_pids(p) FROM unnest(%(pids)s::int[]) AS p"


class Watchdog(_watch.Watchdog):
    """The watchdog of one PostgreSQL server: ``pg_blocking_pids``, then ``PQcancel``."""

    thread_name = "fencing-postgres-watchdog"
    errors = (psycopg.Error,)
    logger = logging.getLogger("fencing.postgres")

    def __init__(self, conninfo: str, interval: float = INTERVAL) -> None:
        super().__init__(lambda: psycopg.connect(conninfo, autocommit=True), interval)

    def watched(self, conn: Any, mine: frozenset[int]) -> Watched:
        pgconn = conn.pgconn
        return Watched(pgconn.backend_pid, mine, pgconn.get_cancel())  # PGcancel: thread-safe

    def lost(self, conn: Any) -> bool:
        return bool(conn.closed)

    def blockers(self, conn: Any, ids: list[int]) -> Iterable[tuple[int, int]]:
        rows = conn.execute(_BLOCKERS, {"pids": ids}).fetchall()
        return [(pid, blocker) for pid, found in rows for blocker in found or ()]

    def cancel(self, conn: Any, watched: Watched) -> None:
        watched.handle.cancel()


# -- whose transaction a borrowed connection holds (``bound.py`` records it) -------------
# Each one's (host, port, database, pid), read once.
_OPEN: Final = (TransactionStatus.INTRANS, TransactionStatus.INERROR)


def _where(conn: Any) -> tuple[Any, ...]:
    info = conn.info
    return (info.host, info.port, info.dbname, info.backend_pid)


_HOLDERS: Final[_watch.Holders[tuple[Any, ...]]] = _watch.Holders(_where)


def hold(conn: Any) -> None:
    """``conn`` (given to ``store.using``: psycopg 3's or psycopg2's, whose ``info`` says
    the same) is the current thread's (or task's)."""
    _HOLDERS.hold(conn)


def held_here(info: Any) -> frozenset[int]:
    """The server pids of the current thread's (or task's) borrowed connections that are
    in a transaction, on the server and database ``info`` (a connection's) describes."""
    mine = _HOLDERS.held()
    if not mine:
        return frozenset()
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


def watchdog(conninfo: str) -> Watchdog:
    """The process's watchdog for the server ``conninfo`` reaches (made on first use)."""
    return _watch.one_per(_WATCHDOGS, conninfo, lambda: Watchdog(conninfo))
