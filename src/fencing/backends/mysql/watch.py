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
  registered with the process's ``Watchdog`` for the server (``backends/_watch.py``):
  one daemon thread and one connection of its own, started on first use. Every
  ``INTERVAL`` it asks the server which transactions block the statements registered
  longer than that (InnoDB's lock waits); a blocker that is one of the statement's own
  thread's borrowed connections is a certain self-deadlock: the statement is killed
  (``KILL QUERY``: InnoDB rolls the statement back, and the driver rolls the flow's
  transaction back, nothing written) and the driver raises ``SelfDeadlock`` naming that
  connection's thread id.

Metadata locks (DDL on the store's own connection while the caller's transaction read
the table) are not InnoDB lock waits: the server's ``lock_wait_timeout`` bounds those.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, Final

from ..._errors import SelfDeadlock
from .. import _watch
from .._watch import INTERVAL, Watched

__all__ = ["INTERVAL", "Watchdog", "Watched", "held_here", "hold", "self_deadlock", "watchdog"]

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


class Watchdog(_watch.Watchdog):
    """The watchdog of one MySQL / MariaDB server: InnoDB's lock waits, then ``KILL
    QUERY`` on its own connection."""

    thread_name = "fencing-mysql-watchdog"
    logger = logging.getLogger("fencing.mysql")

    def __init__(self, connect: Callable[[], Any], interval: float = INTERVAL) -> None:
        super().__init__(connect, interval)
        self._query = 0  # which of _BLOCKERS the server answers

    def watched(self, conn: Any, mine: frozenset[int]) -> Watched | None:
        own = thread_id(conn)
        return None if own is None else Watched(own, mine)

    def blockers(self, conn: Any, ids: list[int]) -> Iterable[tuple[int, int]]:
        marks = ", ".join(["%s"] * len(ids))
        while True:
            try:
                with conn.cursor() as cur:
                    cur.execute(_BLOCKERS[self._query].format(marks), ids)
                    return [(int(a), int(b)) for a, b in cur.fetchall()]
            except Exception as exc:
                code = exc.args[0] if exc.args else None
                if code in (1109, 1146) and self._query + 1 < len(_BLOCKERS):
                    self._query += 1  # no such table here: the other server's view
                    continue
                raise

    def cancel(self, conn: Any, watched: Watched) -> None:
        with conn.cursor() as cur:
            cur.execute(f"KILL QUERY {int(watched.conn_id)}")


# -- whose transaction a borrowed connection holds (``bound.py`` records it) -------------
_HOLDERS: Final[_watch.Holders[object]] = _watch.Holders()


def hold(conn: Any, where: object) -> None:
    """``conn`` (given to ``store.using`` of a store on server ``where``) is the current
    thread's (or task's)."""
    _HOLDERS.hold(conn, where)


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
    ids = set()
    for conn, at in _HOLDERS.held():
        if at == where and _open(conn) and _may_hold_locks(conn):
            ident = thread_id(conn)
            if ident is not None:
                ids.add(ident)
    return frozenset(ids)


_WATCHDOGS: dict[object, Watchdog] = {}


def watchdog(where: object, connect: Callable[[], Any]) -> Watchdog:
    """The process's watchdog for server ``where`` (made on first use; ``connect()``
    opens its connection)."""
    found = _watch.one_per(_WATCHDOGS, where, lambda: Watchdog(connect))
    # the latest store's: the store that made the watchdog may be closed and its database
    # dropped since, and a connection the watchdog lost (a server restart) is made again
    found.connect = connect
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
