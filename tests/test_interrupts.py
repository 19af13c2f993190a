"""An exception raised anywhere inside a store call leaves the store whole and usable.

Signal handlers raise wherever the main thread happens to be (Celery soft time limits,
RQ job timeouts); asyncio cancels a task at any await (``wait_for``, timeouts). Each
test here storms one backend: thousands of calls (create, get, commit, commit_many,
lease acquire / renew / release, effects), each with a one-shot timer (``setitimer``,
a random delay about as long as a call) whose handler raises ``Interrupt``, or, in the
async test, each under ``asyncio.wait_for`` with such a timeout. After every interrupted
commit the same intent is committed again, uninterrupted: it must answer ``Committed``
(the first attempt wrote nothing) or ``Duplicate`` with the state it wrote (it wrote
all of it), never anything else (half of it). After the storm the store must work, lease
tokens must only have grown, no pooled connection may be lost or left in a
transaction, no SQLite transaction may stay open (another process gets the write lock),
and every Redis key must be in the configured database.
"""

from __future__ import annotations

import asyncio
import gc
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest

import fencing
from fencing import Intent

from ._backends import CASES

pytestmark = pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs setitimer")

SEED = 20261203
CALLS = {"memory": 3000, "sqlite-memory": 3000, "sqlite-file": 2000}
SERVER_CALLS = 1500
ASYNC_CALLS = 800
REDIS_DB = 5  # not 0: a command sent before the connection's SELECT would land in 0


class Interrupt(Exception):
    """What the timer's signal handler raises, wherever the main thread is."""


def _interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` is the interrupt, or what a driver made of it (psycopg, for one,
    turns any ``Exception`` raised while it parses a connection string into its own)."""
    seen: BaseException | None = exc
    for _ in range(10):
        if seen is None:
            return False
        if isinstance(seen, Interrupt):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _backend_names() -> list[str]:
    return list(CASES)


def _url(name: str, tmp_path: Path) -> str:
    url = CASES[name].url(tmp_path)
    if name == "postgresql":
        url += "&max_size=2&pool_timeout=10&application_name=" + _APP
    elif name == "mysql":
        url += "?pool_timeout=20"
    elif name == "redis":
        from .backends_redis import redis_url

        url = redis_url(client_name=_APP).replace(":6379/0?", f":6379/{REDIS_DB}?", 1)
        assert f":6379/{REDIS_DB}?" in url, url
    return url


_APP = "fencing_storm_" + uuid.uuid4().hex[:8]


class Workload:
    """Random store calls, and what must hold of their results."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.keys: list[str] = []
        self.tokens: dict[str, int] = {}
        self.n = 0
        self.interrupted_commits: list[tuple[Intent, dict[str, Any]]] = []
        self.partial: list[Any] = []

    def judge_partial(self, name: str) -> None:
        # (MariaDB kept the claim without the write until its scripts stopped trusting
        # ROW_COUNT(), which answers -1 once the interrupted client is gone)
        assert not self.partial, f"commits applied in part: {self.partial[:3]}"

    def state(self) -> dict[str, Any]:
        self.n += 1
        return {"n": self.n, "tag": uuid.uuid4().hex}

    def key(self) -> str:
        return self.rng.choice(self.keys)

    def saw_token(self, name: str, token: int) -> None:
        last = self.tokens.get(name, 0)
        assert token > last, f"lease {name}: token {token} after {last}"
        self.tokens[name] = token

    def judge_retry(self, outcome: Any, state: dict[str, Any]) -> None:
        if isinstance(outcome, fencing.Duplicate):
            if dict(outcome.record.state) != state:
                self.partial.append(outcome)  # its claim was kept, its write was not
        else:
            assert isinstance(outcome, fencing.Committed), outcome


def _sync_ops(store: Any, work: Workload) -> list[Callable[[], None]]:
    col = store.collection("storm")

    def create() -> None:
        key = f"k{len(work.keys)}-{work.rng.randrange(10**9)}"
        col.create(key, work.state())
        work.keys.append(key)

    def get() -> None:
        col.get(work.key())

    def commit() -> None:
        rec = col.get(work.key())
        if rec is not None:
            intent, state = rec.intent("bump"), work.state()
            try:
                col.commit(intent, state)
            except Exception as exc:
                if _interrupted(exc):
                    work.interrupted_commits.append((intent, state))
                raise

    def commit_many() -> None:
        recs = [col.get(k) for k in {work.key(), work.key()}]
        col.commit_many([(r.intent("many"), work.state()) for r in recs if r is not None])

    def lease() -> None:
        name = f"L{work.rng.randrange(16)}"
        held = store.try_acquire(name, owner="storm", ttl=5.0)
        if held is not None:
            work.saw_token(name, held.token)
            held.renew()
            held.release()

    def effect() -> None:
        rec = col.get(work.key())
        if rec is not None:
            done = col.effect(rec.intent("pay"), "charge")
            col.effect_done(done, detail={"ok": True})

    return [create, get, get, commit, commit, commit_many, lease, effect]


@contextmanager
def _finalizers() -> Iterator[list[str]]:
    """Exceptions raised in finalizers (``__del__``) meanwhile, which Python ignores.

    The storm's own exception lands in some (a driver's connection or socket object
    collected mid-storm), and a driver's object dropped by an interrupted call warns
    that it was not closed (``ResourceWarning``) as the collector closes it. Neither is
    a leak (the server-side counts below are the judge); anything else fails the test.
    """
    seen: list[str] = []
    old = sys.unraisablehook

    def hook(info: Any) -> None:
        # (a driver object whose __init__ was interrupted can fail in its __del__ too)
        code = getattr(info.object, "gi_code", None)  # (a driver's generator)
        where = getattr(info.object, "__module__", None) or getattr(code, "co_filename", "")
        driver = any(f"{name}." in where or f"/{name}/" in where for name in _DRIVERS)
        if not (driver or isinstance(info.exc_value, Interrupt | ResourceWarning)):
            old(info)
        seen.append(f"{type(info.exc_value).__name__} in {info.object!r}")

    sys.unraisablehook = hook
    try:
        yield seen
    finally:
        gc.collect()
        sys.unraisablehook = old


_DRIVERS = {"pymysql", "aiomysql", "psycopg", "redis", "socket"}


@contextmanager
def _timer() -> Iterator[Callable[[float], None]]:
    armed = [False]

    def handler(signum: int, frame: Any) -> None:
        if armed[0]:
            armed[0] = False
            raise Interrupt

    def arm(delay: float) -> None:
        """``arm(0)``: off, the flag first, so that a signal already on its way is
        handled as nothing, never as an interrupt of the test's own code after the call."""
        if delay <= 0:
            armed[0] = False
            signal.setitimer(signal.ITIMER_REAL, 0)
            return
        armed[0] = True
        signal.setitimer(signal.ITIMER_REAL, delay)

    old = signal.signal(signal.SIGALRM, handler)
    try:
        yield arm
    finally:
        armed[0] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


class Scale:
    """The timer's delays: random, from zero to a bound that starts at about one call
    (measured) and adapts, so that they land anywhere in a call and about half of the
    calls are interrupted however fast this machine is at the moment: the bound
    shrinks after a call that finished first and grows after one that did not."""

    def __init__(self, mean: float) -> None:
        self.bound = 1.5 * mean
        self.top = 20 * self.bound

    def delay(self, rng: random.Random) -> float:
        return rng.uniform(1e-6, self.bound)

    def missed(self) -> None:
        self.bound = max(1e-5, self.bound / 1.05)

    def landed(self) -> None:
        self.bound = min(self.top, self.bound * 1.05)


def _storm(store: Any, work: Workload, calls: int) -> int:
    ops = _sync_ops(store, work)
    col = store.collection("storm")
    for _ in range(20):
        ops[0]()
    started = time.perf_counter()
    for _ in range(100):  # the size of the timer's delays: about one call
        work.rng.choice(ops)()
    scale = Scale((time.perf_counter() - started) / 100)
    landed = 0
    with _timer() as arm:
        for _ in range(calls):
            op = work.rng.choice(ops)
            try:
                try:
                    arm(scale.delay(work.rng))
                    op()
                finally:
                    arm(0)
                scale.missed()
            except Exception as exc:
                if not _interrupted(exc):
                    raise
                landed += 1
                scale.landed()
                while work.interrupted_commits:  # retried uninterrupted, at once
                    intent, state = work.interrupted_commits.pop()
                    work.judge_retry(col.commit(intent, state), state)
                if landed % 2:  # (half the time the next call starts by reconnecting)
                    work.rng.choice(ops)()  # the next call, uninterrupted, works at once
    return landed


def _usable(store: Any) -> None:
    col = store.collection("after")
    key = "after-" + uuid.uuid4().hex
    rec = col.create(key, {"n": 0})
    assert col.commit(rec.intent("go"), {"n": 1}).committed
    got = col.get(key)
    assert got is not None and got.version == rec.version + 1 and dict(got.state) == {"n": 1}


def _eventually(check: Callable[[], bool], what: str) -> None:
    """A server forgets a closed connection a moment after it was closed."""
    for _ in range(200):
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(what)


def _check_sqlite(store: Any, name: str, url: str) -> None:
    backend = store.backend
    backend = getattr(backend, "sync", backend)
    assert not backend.conn.in_transaction
    free: list[bool] = []

    def take() -> None:
        free.append(backend._lock.acquire(blocking=False))
        if free[0]:
            backend._lock.release()

    taker = threading.Thread(target=take)
    taker.start()
    taker.join()
    assert free == [True], "the store's lock is still held"
    if name == "sqlite-file":
        path = url.removeprefix("sqlite:///")
        script = (
            "import sqlite3, sys\n"
            "c = sqlite3.connect(sys.argv[1], timeout=5, isolation_level=None)\n"
            "c.execute('BEGIN IMMEDIATE'); c.execute('COMMIT')\n"
        )
        done = subprocess.run([sys.executable, "-c", script, path], capture_output=True)
        assert done.returncode == 0, done.stderr.decode()


def _check_pool(pool: Any, size: int, at_rest: Callable[[Any], bool]) -> None:
    gc.collect()
    assert pool.stats()["size"] <= size, pool.stats()
    # Every place can be had again (a connection dropped by an interrupted call is
    # reclaimed once nothing holds it; a lost one would make this time out).
    slots = [pool.get() for _ in range(size)]
    try:
        assert all(at_rest(s.conn) for s in slots)
    finally:
        for slot in slots:
            pool.put(slot)


def _check_postgres(store: Any) -> None:
    from .backends_postgres import admin

    backend = store.backend
    if hasattr(backend.pool, "stats"):  # (not psycopg_pool's, which fencing used before)
        from fencing.backends.postgres.driver import _idle

        _check_pool(backend.pool, backend.settings.max_size, _idle)
    with admin() as conn:

        def settled() -> bool:
            rows = conn.execute(
                "SELECT state FROM pg_stat_activity WHERE application_name = %s", (_APP,)
            ).fetchall()
            return len(rows) <= backend.settings.max_size and all(r[0] == "idle" for r in rows)

        _eventually(settled, "PostgreSQL connections leaked or left in a transaction")


def _check_mysql(store: Any) -> None:
    from fencing.backends.mysql.connection import idle_ok

    from .backends_mysql import connect

    backend = store.backend
    settings = backend.settings
    if hasattr(backend._pool, "stats"):
        _check_pool(backend._pool, settings.pool_size, idle_ok)
    conn = connect(store)
    try:

        def settled() -> bool:
            with conn.cursor() as cur:
                cur.execute(
                    "SELECT COUNT(*), SUM(t.trx_id IS NOT NULL)"
                    " FROM information_schema.PROCESSLIST AS p LEFT JOIN"
                    " information_schema.INNODB_TRX AS t ON t.trx_mysql_thread_id = p.ID"
                    " WHERE p.DB = %s AND p.ID <> CONNECTION_ID()",
                    (settings.database,),
                )
                count, open_trx = cur.fetchone()
            return int(count) <= settings.pool_size and not open_trx

        _eventually(settled, "MySQL connections leaked or left in a transaction")
    finally:
        conn.close()


def _check_redis(url: str) -> None:
    import redis

    from fencing._url import StoreURL

    prefix = StoreURL.parse(url).options["prefix"]
    ours = redis.Redis(host="127.0.0.1", port=6379, db=REDIS_DB)
    db0 = redis.Redis(host="127.0.0.1", port=6379, db=0)
    try:
        clients = [c for c in db0.client_list() if c.get("name") == _APP]
        assert len(clients) <= 2, f"{len(clients)} connections left open"  # (a pool's worth)
        assert any(ours.scan_iter(match=f"{prefix}:*", count=1000))
        stray = list(db0.scan_iter(match=f"{prefix}:*", count=1000))
        assert not stray, f"keys written to database 0: {stray[:5]}"
    finally:
        ours.close()
        db0.close()


def _cleanup(name: str, url: str) -> None:
    """Delete what the test wrote, whatever happened (in both Redis databases)."""
    if name != "redis":
        cleanup = CASES[name].cleanup
        if cleanup is not None:
            with suppress(Exception):
                cleanup(url)
        return
    import redis

    from fencing._url import StoreURL

    prefix = StoreURL.parse(url).options["prefix"]
    assert prefix.startswith("fencing-test-"), prefix
    for db in (REDIS_DB, 0):
        client = redis.Redis(host="127.0.0.1", port=6379, db=db)
        try:
            for key in client.scan_iter(match=f"{prefix}:*", count=1000):
                client.unlink(key)
        finally:
            client.close()


def _check(name: str, store: Any, url: str) -> None:
    _usable(store)
    if name.startswith("sqlite"):
        _check_sqlite(store, name, url)
    elif name == "memory":
        backend = getattr(store.backend, "sync", store.backend)
        assert not backend._lock.locked()
    elif name == "postgresql":
        _check_postgres(store)
    elif name == "mysql":
        _check_mysql(store)
    elif name == "redis":
        _check_redis(url)


@pytest.mark.parametrize("name", _backend_names())
def test_signal_storm(name: str, tmp_path: Path) -> None:
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers run in the main thread")
    url = _url(name, tmp_path)
    work = Workload(random.Random(f"{SEED}-{name}"))
    calls = CALLS.get(name, SERVER_CALLS)
    try:
        with _finalizers() as ignored, fencing.open(url) as store:
            landed = _storm(store, work, calls)
            print(f"{name}: {landed} of {calls} calls interrupted (seed {SEED});", end=" ")
            print(f"{len(ignored)} exceptions in finalizers ignored")
            assert landed >= calls // 10, "the storm hardly landed: it proves nothing"
            _check(name, store, url)
        work.judge_partial(name)
    finally:
        _cleanup(name, url)


# -- asyncio: cancellation at any await ------------------------------------------------
def _async_ops(store: Any, work: Workload) -> list[Callable[[], Awaitable[None]]]:
    col = store.collection("storm")

    async def create() -> None:
        key = f"k{len(work.keys)}-{work.rng.randrange(10**9)}"
        await col.create(key, work.state())
        work.keys.append(key)

    async def get() -> None:
        await col.get(work.key())

    async def commit() -> None:
        rec = await col.get(work.key())
        if rec is not None:
            intent, state = rec.intent("bump"), work.state()
            try:
                await col.commit(intent, state)
            except asyncio.CancelledError:
                work.interrupted_commits.append((intent, state))
                raise

    async def commit_many() -> None:
        recs = [await col.get(k) for k in {work.key(), work.key()}]
        await col.commit_many([(r.intent("many"), work.state()) for r in recs if r is not None])

    async def lease() -> None:
        name = f"L{work.rng.randrange(16)}"
        held = await store.try_acquire(name, owner="storm", ttl=5.0)
        if held is not None:
            work.saw_token(name, held.token)
            await held.renew()
            await held.release()

    async def effect() -> None:
        rec = await col.get(work.key())
        if rec is not None:
            done = await col.effect(rec.intent("pay"), "charge")
            await col.effect_done(done, detail={"ok": True})

    return [create, get, get, commit, commit, commit_many, lease, effect]


async def _astorm(store: Any, work: Workload, calls: int) -> int:
    ops = _async_ops(store, work)
    col = store.collection("storm")
    for _ in range(20):
        await ops[0]()
    started = time.perf_counter()
    for _ in range(100):
        await work.rng.choice(ops)()
    scale = Scale((time.perf_counter() - started) / 100)
    landed = made = 0
    while landed < calls // 2 and made < 4 * calls:  # (a call that never suspends
        made += 1  # cannot be cancelled: some stores need more calls than others)
        op = work.rng.choice(ops)
        try:
            await asyncio.wait_for(op(), scale.delay(work.rng))
            scale.missed()
        except TimeoutError:
            landed += 1
            scale.landed()
            while work.interrupted_commits:
                intent, state = work.interrupted_commits.pop()
                work.judge_retry(await col.commit(intent, state), state)
            if landed % 2:
                await work.rng.choice(ops)()
    return landed


async def _acheck(name: str, store: Any) -> None:
    col = store.collection("after")
    key = "after-" + uuid.uuid4().hex
    rec = await col.create(key, {"n": 0})
    assert (await col.commit(rec.intent("go"), {"n": 1})).committed
    got = await col.get(key)
    assert got is not None and got.version == rec.version + 1
    backend = store.backend
    if name == "postgresql":
        pool = backend.pool
        conns = await asyncio.gather(*(pool.getconn(20) for _ in range(backend.settings.max_size)))
        try:
            assert all(c.info.transaction_status == 0 for c in conns)  # IDLE
        finally:
            for conn in conns:
                await pool.putconn(conn)
    elif name == "mysql":
        pool = backend._pool
        assert pool.size - pool.freesize == 0, "aiomysql connections still in use"


@pytest.mark.parametrize("name", _backend_names())
def test_cancellation_storm(name: str, tmp_path: Path) -> None:
    url = _url(name, tmp_path)
    work = Workload(random.Random(f"{SEED}-async-{name}"))

    async def main() -> int:
        store = await fencing.open_async(url)
        try:
            landed = await _astorm(store, work, ASYNC_CALLS)
            await _acheck(name, store)
            return landed
        finally:
            await store.close()

    try:
        with _finalizers():
            landed = asyncio.run(main())
        print(f"{name} async: {landed} of {ASYNC_CALLS} calls cancelled (seed {SEED})")
        # (memory's calls never await: there is nothing to cancel; redis-py's asyncio
        # Cluster client finishes most of the calls it is asked to cancel)
        if name not in ("memory", "redis-cluster"):
            assert landed >= ASYNC_CALLS // 10, "the storm hardly landed: it proves nothing"
        if name == "redis":
            _check_redis(url)
        elif name == "postgresql":
            _check_postgres_server_only(url)
        work.judge_partial(name)
    finally:
        _cleanup(name, url)


def _check_postgres_server_only(url: str) -> None:
    from .backends_postgres import admin

    with admin() as conn:

        def settled() -> bool:
            rows = conn.execute(
                "SELECT state FROM pg_stat_activity WHERE application_name = %s", (_APP,)
            ).fetchall()
            return all(r[0] == "idle" for r in rows)

        _eventually(settled, "PostgreSQL connections left in a transaction")
