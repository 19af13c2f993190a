"""The self-deadlock watchdog the server stores share (``backends/_watch.py``), with no
server: a scripted store under it. What is due and what is caught (pure), the thread's
loop (ask, catch, cancel while still registered; an error closes its connection and it
asks again on a new one), stopping, and the registry of whose connections are where.
The stores' own parts (``postgres/watch.py``, ``mysql/watch.py``) are checked on fake
connections here and on real servers in ``test_pg_own_locks.py`` and
``test_mysql_own_locks.py``."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import pytest

from fencing.backends import _watch
from fencing.backends._watch import Holders, Watchdog, Watched, due, one_per, own_blocker

WAIT = 30.0  # a bound on waiting for the watchdog's thread, never an assertion on time


class Conn:
    """The watchdog's own connection, as the scripted store opens it."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.closed = False

    def close(self) -> None:
        self.closed = True


class Scripted(Watchdog):
    """A store whose server answers from ``self.blocks`` (waiting id -> blocking ids);
    ``fail`` makes the next question raise."""

    thread_name = "fencing-test-watchdog"

    def __init__(self, interval: float = 0.001) -> None:
        super().__init__(self._open, interval)
        self.blocks: dict[int, set[int]] = {}
        self.conns: list[Conn] = []
        self.asked: queue.Queue[tuple[int, list[int]]] = queue.Queue()
        self.cancelled: queue.Queue[tuple[int, int, int | None]] = queue.Queue()
        self.fail: Exception | None = None

    def _open(self) -> Conn:
        conn = Conn(len(self.conns))
        self.conns.append(conn)
        return conn

    def watched(self, conn: Any, mine: frozenset[int]) -> Watched | None:
        return None if conn is None else Watched(int(conn), mine)

    def blockers(self, conn: Any, ids: list[int]) -> Iterable[tuple[int, int]]:
        self.asked.put((conn.number, ids))
        if self.fail is not None:
            error, self.fail = self.fail, None
            raise error
        return [(w, b) for w in ids for b in sorted(self.blocks.get(w, ()))]

    def lost(self, conn: Any) -> bool:
        return bool(conn.closed)

    def cancel(self, conn: Any, watched: Watched) -> None:
        assert self._cond._is_owned()  # type: ignore[attr-defined]  # under the lock
        self.cancelled.put((conn.number, watched.conn_id, watched.blocker))

    def ask_round(self) -> list[int]:
        """Wait for the next question; what it asked about."""
        return self.asked.get(timeout=WAIT)[1]

    def ask_on(self) -> int:
        """Wait for the next question; the number of the connection it was asked on."""
        return self.asked.get(timeout=WAIT)[0]


@pytest.fixture
def dog() -> Iterator[Scripted]:
    made = Scripted()
    yield made
    made.stop(WAIT)


# -- the pure decisions --------------------------------------------------------------------
def test_due_is_what_waited_an_interval_and_is_not_caught() -> None:
    young = Watched(1, frozenset(), since=10.0)
    old = Watched(2, frozenset(), since=9.0)
    exact = Watched(3, frozenset(), since=9.5)
    caught = Watched(4, frozenset(), since=0.0, blocker=7)
    assert due([young, old, exact, caught], now=10.0, interval=0.5) == [old, exact]
    assert due([young, old], now=10.0, interval=2.0) == []


def test_own_blocker_is_the_lowest_of_the_threads_own() -> None:
    w = Watched(5, frozenset({30, 20, 99}))
    assert own_blocker(w, {5: {40, 30, 20}}) == 20
    assert own_blocker(w, {5: [40, 41]}) is None  # blocked, by someone else: not ours
    assert own_blocker(w, {6: {20}}) is None  # another statement's blockers
    assert own_blocker(w, {}) is None
    assert own_blocker(Watched(5, frozenset()), {5: {20}}) is None


# -- one round, without the thread ---------------------------------------------------------
def test_a_round_cancels_only_what_its_own_thread_blocks() -> None:
    dog = Scripted()
    dog.stop()  # no thread: the rounds are run here
    mine = dog.watch(1, frozenset({100, 101}))
    other = dog.watch(2, frozenset({100}))
    free = dog.watch(3, frozenset({100}))
    assert mine is not None and other is not None and free is not None
    dog.blocks = {1: {101, 500, 100}, 2: {500}}
    conn = Conn(0)
    dog._catch(conn, [mine, other, free])
    assert dog.cancelled.get_nowait() == (0, 1, 100)
    assert dog.cancelled.empty()
    assert (mine.blocker, other.blocker, free.blocker) == (100, None, None)
    assert due([mine, other, free], now=float("inf"), interval=0) == [other, free]


def test_a_statement_done_before_its_round_is_not_cancelled() -> None:
    """Its connection may run another statement by now: the check and the cancel are one
    step under the lock that ``done`` takes."""
    dog = Scripted()
    dog.stop()
    watched = dog.watch(1, frozenset({100}))
    assert watched is not None
    dog.done(watched)
    dog.blocks = {1: {100}}
    dog._catch(Conn(0), [watched])
    assert dog.cancelled.empty()
    assert watched.blocker is None


def test_what_cannot_be_watched_is_not_registered() -> None:
    dog = Scripted()
    dog.stop()
    assert dog.watch(None, frozenset({1})) is None
    dog.done(None)
    assert dog._watched == set()
    assert dog._thread is None


# -- the thread ----------------------------------------------------------------------------
def test_the_thread_cancels_a_self_deadlock_and_asks_no_more_about_it(dog: Scripted) -> None:
    dog.blocks = {7: {70}}
    watched = dog.watch(7, frozenset({70, 71}))
    assert watched is not None
    assert dog.cancelled.get(timeout=WAIT) == (0, 7, 70)
    assert watched.blocker == 70
    assert dog._thread is not None and dog._thread.name == "fencing-test-watchdog"
    assert dog._thread.daemon
    other = dog.watch(8, frozenset({70}))  # still registered, caught: not asked again
    while 8 not in dog.ask_round():
        pass
    assert 7 not in dog.ask_round()
    dog.done(watched)
    dog.done(other)
    assert dog.cancelled.empty()
    assert len(dog.conns) == 1  # one connection for every round


def test_a_foreign_blocker_is_asked_about_again_and_never_cancelled(dog: Scripted) -> None:
    dog.blocks = {7: {500}}
    watched = dog.watch(7, frozenset({70}))
    assert watched is not None
    for _ in range(3):
        while 7 not in dog.ask_round():
            pass
    assert dog.cancelled.empty()  # the rounds before the third have ended
    dog.blocks = {7: {500, 70}}  # now its own thread's too
    assert dog.cancelled.get(timeout=WAIT) == (0, 7, 70)
    dog.done(watched)


def test_an_error_closes_the_connection_and_the_next_round_opens_another(
    dog: Scripted, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="fencing")
    dog.fail = OSError("the server went away")
    dog.blocks = {7: {70}}
    watched = dog.watch(7, frozenset({70}))
    assert watched is not None
    assert dog.cancelled.get(timeout=WAIT) == (1, 7, 70)  # on the second connection
    assert dog.conns[0].closed and not dog.conns[1].closed
    assert "could not ask the server" in caplog.text
    assert "the server went away" in caplog.text
    dog.done(watched)


def test_a_connection_found_closed_is_opened_again(dog: Scripted) -> None:
    watched = dog.watch(7, frozenset({70}))  # blocked by no one: asked again and again
    assert dog.ask_on() == 0
    dog.conns[0].closed = True  # the server closed it
    while dog.ask_on() == 0:
        pass
    assert len(dog.conns) == 2
    dog.done(watched)


def test_a_failed_cancel_is_an_error_of_the_round_too(dog: Scripted) -> None:
    failed = threading.Event()
    cancel = dog.cancel

    def once(conn: Any, watched: Watched) -> None:
        if not failed.is_set():
            failed.set()
            raise OSError("the cancel was refused")
        cancel(conn, watched)

    dog.cancel = once  # type: ignore[method-assign]
    dog.blocks = {7: {70}, 8: {80}}
    first = dog.watch(7, frozenset({70}))
    assert first is not None
    assert failed.wait(WAIT)
    assert first.blocker == 70  # caught: the driver says SelfDeadlock once it ends
    second = dog.watch(8, frozenset({80}))  # the thread lives on, on a new connection
    assert dog.cancelled.get(timeout=WAIT) == (1, 8, 80)
    assert dog.conns[0].closed
    dog.done(first)
    dog.done(second)


def test_an_error_the_store_does_not_expect_ends_the_thread() -> None:
    """``errors`` is the store's: PostgreSQL's watchdog lets anything but psycopg's errors
    end its thread (as it did before it was shared)."""

    class Narrow(Scripted):
        errors = (OSError,)

        def blockers(self, conn: Any, ids: list[int]) -> Iterable[tuple[int, int]]:
            raise KeyError("a bug")

    seen: queue.Queue[threading.ExceptHookArgs] = queue.Queue()
    before = threading.excepthook
    threading.excepthook = seen.put
    try:
        dog = Narrow()
        dog.watch(7, frozenset({70}))
        assert isinstance(seen.get(timeout=WAIT).exc_value, KeyError)
        assert dog._thread is not None
        dog._thread.join(WAIT)
        assert not dog._thread.is_alive()
        assert dog.conns[0].closed
    finally:
        threading.excepthook = before


def test_stop_ends_the_thread_and_closes_its_connection() -> None:
    dog = Scripted()
    dog.blocks = {7: {70}}
    watched = dog.watch(7, frozenset({70}))
    assert dog.cancelled.get(timeout=WAIT)[1] == 7
    thread = dog._thread
    assert thread is not None
    dog.stop(WAIT)
    assert not thread.is_alive()
    assert dog.conns[0].closed
    dog.done(watched)
    later = dog.watch(9, frozenset())  # registered, but no thread starts again
    assert later is not None and dog._thread is thread
    dog.done(later)


def _waiting(dog: Scripted) -> None:
    """Wait (bounded) until the dog's thread waits on its condition."""
    waiters = dog._cond._waiters  # type: ignore[attr-defined]
    for _ in range(int(WAIT / 0.001)):
        if waiters:
            return
        threading.Event().wait(0.001)
    raise AssertionError("the thread never waited")


@pytest.mark.parametrize("registered", [False, True], ids=["idle", "waiting-an-interval"])
def test_stop_wakes_the_waiting_thread(registered: bool) -> None:
    dog = Scripted(interval=3600.0)  # a round only after an hour: it waits
    if registered:
        dog._watched.add(Watched(1, frozenset(), since=0.0))
    thread = dog._thread = threading.Thread(target=dog._run, daemon=True)
    thread.start()
    _waiting(dog)
    dog.stop(WAIT)
    assert not thread.is_alive()
    assert dog.asked.empty() and dog.conns == []


def test_stop_while_resting_after_an_error() -> None:
    class Resting(Scripted):
        def blockers(self, conn: Any, ids: list[int]) -> Iterable[tuple[int, int]]:
            self.interval = 3600.0  # the rest after this error: an hour
            return super().blockers(conn, ids)

    dog = Resting()
    dog.fail = OSError("down")
    watched = dog.watch(1, frozenset())
    dog.ask_round()
    dog.stop(WAIT)
    assert dog._thread is not None and not dog._thread.is_alive()
    assert dog.conns[0].closed
    dog.done(watched)


def test_a_forked_child_starts_afresh() -> None:
    dog = Scripted()
    dog.stop()
    old = dog.watch(1, frozenset())
    dog._pid = -1  # as a child sees its parent's watchdog
    dog._stopping.clear()
    try:
        new = dog.watch(2, frozenset())
        assert dog._watched == {new} and old not in dog._watched
        assert dog._thread is not None and dog._thread.is_alive()
    finally:
        dog.stop(WAIT)


def test_one_watchdog_per_key() -> None:
    dogs: dict[Any, Scripted] = {}
    made: list[Scripted] = []

    def make() -> Scripted:
        made.append(Scripted())
        return made[-1]

    first = one_per(dogs, "a", make)
    assert one_per(dogs, "a", make) is first
    second = one_per(dogs, "b", make)
    assert second is not first and made == [first, second]


# -- whose connections, where --------------------------------------------------------------
class Borrowed:
    def __init__(self, where: str) -> None:
        self.where = where
        self.read = 0


def _in_thread(fn: Any) -> None:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(WAIT)
    assert not thread.is_alive()
    if errors:
        raise errors[0]


def test_holders_are_by_thread_and_where_is_read_once() -> None:
    def locate(conn: Borrowed) -> str:
        conn.read += 1
        return conn.where

    holders: Holders[str] = Holders(locate)
    a, b = Borrowed("db1"), Borrowed("db2")
    assert holders.held() == []
    holders.hold(a)
    holders.hold(a)
    assert holders.held() == [(a, "db1")]
    _in_thread(lambda: holders.hold(b))
    assert holders.held() == [(a, "db1")]  # another thread's connection is not this one's
    _in_thread(lambda: holders.hold(a))  # moved to another thread
    assert holders.held() == []
    holders.hold(a)
    assert holders.held() == [(a, "db1")]
    assert a.read == 1 and b.read == 1
    holders.hold(object())  # no weak reference: not held, no error
    holders.hold(1)
    assert holders.held() == [(a, "db1")]


def test_holders_with_a_given_where_follow_it() -> None:
    holders: Holders[object] = Holders()
    conn = Borrowed("")
    holders.hold(conn, ("h", 1))
    assert holders.held() == [(conn, ("h", 1))]
    holders.hold(conn, ("h", 2))  # given to a store on another server
    assert holders.held() == [(conn, ("h", 2))]


def test_holders_are_by_task_too() -> None:
    import asyncio

    holders: Holders[str] = Holders(lambda conn: "db")
    a, b = Borrowed("db"), Borrowed("db")

    async def task(conn: Borrowed) -> list[Any]:
        holders.hold(conn)
        await asyncio.sleep(0)
        return [c for c, _ in holders.held()]

    async def main() -> list[list[Any]]:
        return list(await asyncio.gather(task(a), task(b)))

    assert asyncio.run(main()) == [[a], [b]]
    assert holders.held() == []  # neither is this thread's, outside a task


def test_the_owners_left_behind_are_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past 64 owners, those holding nothing any more (threads ended, tasks done, their
    connections moved on) are dropped."""
    holders: Holders[str] = Holders(lambda conn: "db")

    def hold_as(number: int, conn: Borrowed) -> None:
        monkeypatch.setattr(_watch, "owner", lambda: (number, 0))
        holders.hold(conn)

    conns = [Borrowed("db") for _ in range(60)]
    for number, conn in enumerate(conns):
        hold_as(number, conn)
    for conn in conns[:30]:  # 30 owners hold nothing now
        hold_as(999, conn)
    assert len(holders._by_owner) == 61  # not past 64: kept
    more = [Borrowed("db") for _ in range(4)]
    for number, conn in enumerate(more, start=100):
        hold_as(number, conn)  # the 65th owner: the 30 empty ones go
    assert len(holders._by_owner) == 61 + 4 - 30
    assert all(holders._by_owner.values())
    monkeypatch.setattr(_watch, "owner", lambda: (999, 0))
    assert sorted(id(c) for c, _ in holders.held()) == sorted(id(c) for c in conns[:30])


# -- the stores' parts, on fake connections ------------------------------------------------
def test_postgres_asks_pg_blocking_pids_and_cancels_with_the_handle() -> None:
    pytest.importorskip("psycopg")
    from fencing.backends.postgres import watch as pg

    class Cursor:
        def fetchall(self) -> list[tuple[int, list[int] | None]]:
            return [(1, [10, 11]), (2, None), (3, [])]

    class PgConn:
        closed = False

        def __init__(self) -> None:
            self.asked: list[Any] = []

        def execute(self, sql: str, params: Any) -> Cursor:
            self.asked.append((sql, params))
            return Cursor()

    class Handle:
        cancelled = 0

        def cancel(self) -> None:
            self.cancelled += 1

    class Lent:
        class pgconn:
            backend_pid = 42
            handle = Handle()

            @classmethod
            def get_cancel(cls) -> Handle:
                return cls.handle

    dog = pg.Watchdog("dbname=nowhere")
    conn = PgConn()
    assert list(dog.blockers(conn, [1, 2, 3])) == [(1, 10), (1, 11)]
    assert "pg_blocking_pids" in conn.asked[0][0] and conn.asked[0][1] == {"pids": [1, 2, 3]}
    watched = dog.watched(Lent, frozenset({10}))
    assert (watched.conn_id, watched.mine) == (42, frozenset({10}))
    assert watched.handle is Lent.pgconn.handle
    dog.cancel(conn, watched)
    assert Lent.pgconn.handle.cancelled == 1
    assert dog.lost(conn) is False
    conn.closed = True
    assert dog.lost(conn) is True
    import psycopg

    assert dog.errors == (psycopg.Error,) and dog.thread_name == "fencing-postgres-watchdog"
    assert pg.watchdog("dbname=a") is pg.watchdog("dbname=a")
    assert pg.watchdog("dbname=a") is not pg.watchdog("dbname=b")


def test_mysql_asks_innodb_then_sys_and_kills_the_query() -> None:
    from fencing.backends.mysql import watch as my

    class NoTable(Exception):
        pass

    class Cursor:
        def __init__(self, conn: MyConn) -> None:
            self.conn = conn

        def __enter__(self) -> Cursor:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def execute(self, sql: str, params: Any = None) -> None:
            self.conn.sent.append((sql, params))
            if "information_schema" in sql:
                raise NoTable(1146, "no such table")

        def fetchall(self) -> list[tuple[str, str]]:
            return [("5", "50"), ("5", "51")]

    class MyConn:
        def __init__(self) -> None:
            self.sent: list[tuple[str, Any]] = []

        def cursor(self) -> Cursor:
            return Cursor(self)

    dog = my.Watchdog(lambda: None)
    conn = MyConn()
    assert list(dog.blockers(conn, [5, 6])) == [(5, 50), (5, 51)]
    assert "sys.innodb_lock_waits" in conn.sent[1][0] and conn.sent[1][1] == [5, 6]
    assert "%s, %s" in conn.sent[1][0]
    assert list(dog.blockers(conn, [5])) == [(5, 50), (5, 51)]  # the view it found, kept
    assert len(conn.sent) == 3
    dog.cancel(conn, Watched(5, frozenset()))
    assert conn.sent[-1] == ("KILL QUERY 5", None)

    class Lent:
        server_thread_id = (77,)

    watched = dog.watched(Lent(), frozenset({1}))
    assert watched is not None and watched.conn_id == 77
    assert dog.watched(object(), frozenset({1})) is None  # no thread id: not watched
    first = my.watchdog(("h", 1, None), lambda: "a")
    again = my.watchdog(("h", 1, None), lambda: "b")
    assert again is first and first.connect() == "b"  # the latest store's connect
    assert dog.thread_name == "fencing-mysql-watchdog" and dog.errors == (Exception,)


def test_postgres_held_here_is_this_threads_open_transactions_on_that_database() -> None:
    pytest.importorskip("psycopg")
    from psycopg.pq import TransactionStatus

    from fencing.backends.postgres import watch as pg

    class Info:
        def __init__(self, db: str, pid: int, status: Any = TransactionStatus.INTRANS) -> None:
            self.host, self.port, self.dbname, self.backend_pid = "h", 5432, db, pid
            self.transaction_status = status

    class PgLent:
        def __init__(self, info: Info) -> None:
            self.info = info
            self.closed = False

    here = Info("db", 0)
    assert pg.held_here(here) == frozenset()
    lent = [
        PgLent(Info("db", 1)),
        PgLent(Info("db", 2, TransactionStatus.INERROR)),
        PgLent(Info("db", 3, TransactionStatus.IDLE)),  # no transaction: no lock
        PgLent(Info("other", 4)),  # another database
        PgLent(Info("db", 5)),
    ]
    lent[4].closed = True
    for conn in lent:
        pg.hold(conn)
    assert pg.held_here(here) == {1, 2}
    _in_thread(lambda: None if pg.held_here(here) == set() else pytest.fail("not its own"))


def test_mysql_held_here_is_this_threads_on_that_server() -> None:
    from fencing.backends.mysql import watch as my

    class MyLent:  # PyMySQL's shape
        def __init__(self, ident: int, status: int = 1, is_open: bool = True) -> None:
            self.server_thread_id = (ident,)
            self.server_status = status
            self.open = is_open

        def get_autocommit(self) -> bool:
            return True

    where, elsewhere = ("h", 3306, "db"), ("h2", 3306, "db")
    lent = [MyLent(1), MyLent(2, status=0), MyLent(3, is_open=False), MyLent(4)]
    for conn in lent[:3]:
        my.hold(conn, where)
    my.hold(lent[3], elsewhere)
    assert my.held_here(where) == {1}  # 2: autocommit, not in a transaction; 3: closed
    assert my.held_here(elsewhere) == {4}
    my.hold(lent[3], where)  # given to a store on the first server
    assert my.held_here(where) == {1, 4}
