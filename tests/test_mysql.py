"""MySQL / MariaDB specifics: killed connections, lock timeouts, hot keys across threads and
processes (with a naive baseline that must lose updates), matched rows, tokens, keys."""

from __future__ import annotations

import json
import multiprocessing
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import fencing
from fencing import Committed, Contended, Duplicate, Recompute, Stale
from fencing._effects import dump_detail

from . import backends_mysql as mysql_case
from ._backends import require_server
from ._syncify import Loop, Syncified

PROCESSES = 4
THREADS = 16


def _require() -> None:
    require_server("MariaDB", mysql_case.HOST, mysql_case.PORT)


@pytest.fixture
def mysql_url(tmp_path: Path) -> Iterator[str]:
    _require()
    url = mysql_case.make_url(tmp_path)
    yield url
    mysql_case.cleanup(url)


class Opener:
    """Opens stores on one database through the sync or the async API; closes them all."""

    def __init__(self, url: str, api: str, loop: Loop) -> None:
        self.url, self.api, self.loop = url, api, loop
        self._open: list[Any] = []

    def __call__(self, **options: Any) -> Any:
        if self.api == "sync":
            store = fencing.open(self.url, **options)
        else:
            store = Syncified(self.loop.run(fencing.open_async(self.url, **options)), self.loop)
        self._open.append(store)
        return store

    def close_all(self) -> None:
        for store in self._open:
            store.close()


@pytest.fixture
def opener(mysql_url: str, api: str, loop: Loop) -> Iterator[Opener]:
    """Stores are closed before the loop (a fixture this one depends on) stops."""
    op = Opener(mysql_url, api, loop)
    yield op
    op.close_all()


@pytest.fixture
def mstore(opener: Opener) -> Any:
    return opener()


def _raw(url: str) -> Any:
    """A plain PyMySQL connection to a store's database, outside fencing."""
    import pymysql

    from fencing._url import StoreURL
    from fencing.backends.mysql.settings import settings_from_url

    settings = settings_from_url(StoreURL.parse(url), {})
    return pymysql.connect(**settings.driver_kwargs())


def _sql(url: str, statement: str, *params: Any) -> list[tuple[Any, ...]]:
    """Run one statement on a short-lived connection of the store's database."""
    conn = _raw(url)
    try:
        with conn.cursor() as cur:
            cur.execute(statement, params or None)
            return list(cur.fetchall())
    finally:
        conn.close()


def _database(url: str) -> str:
    return url.rsplit("/", 1)[1].split("?", 1)[0]


def _kill(url: str, thread_id: int) -> None:
    try:
        _sql(url, f"KILL CONNECTION {int(thread_id)}")
    except Exception as exc:  # already gone: 1094 unknown thread id
        if getattr(exc, "args", (None,))[0] != 1094:
            raise


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(fn())
        except BaseException as exc:
            box.append(exc)

    t = threading.Thread(target=run)
    t.start()
    return t, box


# -- (a) a connection killed mid-commit --------------------------------------------------
def test_killed_mid_commit_is_transient_and_retry_is_safe(mstore: Any, mysql_url: str) -> None:
    orders = mstore.collection("orders")
    orders.create("k", {"n": 0})
    intent = orders.intent("k", "inc")

    blocker = _raw(mysql_url)
    try:
        with blocker.cursor() as cur:
            cur.execute("START TRANSACTION")
            cur.execute(
                "SELECT * FROM fencing_records WHERE collection = 'orders' AND `key` = 'k'"
                " FOR UPDATE"
            )
            cur.execute("SELECT CONNECTION_ID()")
            blocker_id = int(cur.fetchone()[0])
        thread, box = _in_thread(lambda: orders.commit(intent, {"n": 1}))
        waiting: list[int] = []
        deadline = time.monotonic() + 10
        while not waiting and time.monotonic() < deadline:
            time.sleep(0.02)
            rows = _sql(
                mysql_url,
                "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = %s"
                " AND ID NOT IN (%s, CONNECTION_ID()) AND INFO IS NOT NULL",
                _database(mysql_url),
                blocker_id,
            )
            waiting = [int(r[0]) for r in rows]
        assert waiting, "the commit never reached the locked row"
        _kill(mysql_url, waiting[0])
        thread.join(10)
        assert len(box) == 1 and isinstance(box[0], fencing.TransientStoreError), box
        with blocker.cursor() as cur:
            cur.execute("ROLLBACK")
    finally:
        blocker.close()

    # the killed transaction left nothing behind: not the write, not the claim
    assert orders.get("k").version == 1
    first = orders.commit(intent, {"n": 1})
    assert isinstance(first, Committed) and first.record.version == 2
    assert isinstance(orders.commit(intent, {"n": 1}), Duplicate)
    assert orders.get("k").state["n"] == 1


def test_random_kills_never_lose_or_double_apply(opener: Opener, mysql_url: str) -> None:
    """Kill the store's connections at random moments while one writer increments a
    counter, retrying each transient failure with the same intent."""
    store = opener(pool_size=2)
    orders = store.collection("orders")
    orders.create("k", {"n": 0})
    stop = threading.Event()
    kills = 0

    def killer() -> None:
        nonlocal kills
        rng = random.Random(7)
        admin = _raw(mysql_url)
        try:
            with admin.cursor() as cur:
                while not stop.is_set():
                    time.sleep(rng.uniform(0.002, 0.03))
                    cur.execute(
                        "SELECT ID FROM information_schema.PROCESSLIST"
                        " WHERE DB = %s AND ID <> CONNECTION_ID()",
                        (_database(mysql_url),),
                    )
                    ids = [int(r[0]) for r in cur.fetchall()]
                    if ids:
                        try:
                            cur.execute(f"KILL CONNECTION {rng.choice(ids)}")
                            kills += 1
                        except Exception as exc:  # gone already: 1094 unknown thread
                            if getattr(exc, "args", (None,))[0] != 1094:
                                raise
        finally:
            admin.close()

    def retried(fn: Callable[[], Any]) -> Any:
        for _ in range(200):
            try:
                return fn()
            except fencing.TransientStoreError:
                continue
        raise AssertionError("the store never came back")

    acknowledged = transient = duplicates = 0
    thread = threading.Thread(target=killer)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        # Enough of each for the test to mean something: a kill that lands on an idle
        # pooled connection is healed at checkout and surfaces no error, so run on
        # until some kill met a call in flight.
        while acknowledged < 100 or kills < 10 or transient == 0:
            assert time.monotonic() < deadline, (acknowledged, kills, transient)
            rec = retried(lambda: orders.get("k"))
            intent = rec.intent("inc")
            state = {"n": rec.state["n"] + 1}
            for _attempt in range(200):
                try:
                    out = orders.commit(intent, state)
                except fencing.TransientStoreError:
                    transient += 1
                    continue
                break
            assert isinstance(out, Committed | Duplicate), out
            duplicates += isinstance(out, Duplicate)
            acknowledged += 1
    finally:
        stop.set()
        thread.join()
    final = retried(lambda: orders.get("k"))
    assert kills >= 10 and transient > 0
    # every acknowledged increment is there, none twice
    assert final.state["n"] == acknowledged
    assert final.version == 1 + acknowledged
    print(f"kills={kills} transient={transient} landed-before-the-kill={duplicates}")


def test_lock_wait_timeout_is_transient_and_leaves_nothing(opener: Opener, mysql_url: str) -> None:
    store = opener(lock_wait_timeout=1)
    orders = store.collection("orders")
    orders.create("k", {"n": 0})
    intent = orders.intent("k", "inc")
    blocker = _raw(mysql_url)
    try:
        with blocker.cursor() as cur:
            cur.execute("START TRANSACTION")
            cur.execute("SELECT 1 FROM fencing_records WHERE `key` = 'k' FOR UPDATE")
        with pytest.raises(fencing.TransientStoreError, match="1205"):
            orders.commit(intent, {"n": 1})
        with blocker.cursor() as cur:
            cur.execute("ROLLBACK")
    finally:
        blocker.close()
    assert _sql(mysql_url, "SELECT COUNT(*) FROM fencing_applied") == [(0,)]
    assert isinstance(orders.commit(intent, {"n": 1}), Committed)


def test_a_flow_chosen_as_a_deadlock_victim_starts_again(
    mstore: Any, mysql_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """InnoDB rolls a deadlock's victim back whole: the error is thrown into the flow,
    which starts its transaction again (on the same connection) and applies."""
    from fencing.backends.mysql import restart

    restarts: list[int] = []
    monkeypatch.setattr(restart, "_backoff", lambda attempt: restarts.append(attempt) or 0.0)
    orders = mstore.collection("orders")
    orders.create("k1", {"n": 0})
    orders.create("k2", {"n": 0})
    items = [(orders.intent(k, "inc"), {"n": 1}) for k in ("k1", "k2")]
    _sql(mysql_url, "CREATE TABLE ballast (n INTEGER)")
    blocker = _raw(mysql_url)
    try:
        with blocker.cursor() as cur:
            cur.execute("START TRANSACTION")  # heavier than the commit: never the victim
            cur.executemany("INSERT INTO ballast VALUES (%s)", [(n,) for n in range(2000)])
            cur.execute("SELECT 1 FROM fencing_records WHERE `key` = 'k1' FOR UPDATE")
            cur.execute("SELECT CONNECTION_ID()")
            blocker_id = int(cur.fetchone()[0])
        thread, box = _in_thread(lambda: orders.commit_many(items))
        deadline = time.monotonic() + 10
        while not _sql(
            mysql_url,
            "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = %s"
            " AND ID NOT IN (%s, CONNECTION_ID()) AND INFO IS NOT NULL",
            _database(mysql_url),
            blocker_id,
        ):  # the commit waits for k1's record, holding k1's tombstone row
            assert time.monotonic() < deadline, "the commit never reached the locked row"
            time.sleep(0.02)
        with blocker.cursor() as cur:  # waits for the commit's lock: a deadlock
            cur.execute(
                "INSERT INTO fencing_tombstones (collection, `key`, version)"
                " VALUES ('orders', 'k1', 0) ON DUPLICATE KEY UPDATE version = version"
            )
            cur.execute("ROLLBACK")
        thread.join(10)
    finally:
        blocker.close()
    assert restarts == [1]
    assert len(box) == 1 and [type(o) for o in box[0]] == [Committed, Committed], box
    assert [orders.get(k).version for k in ("k1", "k2")] == [2, 2]


# -- (b) one hot key: threads and processes, then a naive baseline -------------------------
@pytest.fixture(scope="module")
def processes() -> Iterator[ProcessPoolExecutor]:
    _require()
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(PROCESSES, mp_context=ctx) as pool:
        list(pool.map(time.sleep, [0.0] * PROCESSES))  # warm: imports done before the race
        yield pool


DELAY = 0.002  # between reading and writing, in both runs


def _wait_until(start_at: float) -> None:
    time.sleep(max(0.0, start_at - time.time()))


def fenced_worker(store: Any, worker: int, ops: int, start_at: float) -> list[str]:
    """Even workers use apply(Recompute); odd ones commit under a lease."""
    orders = store.collection("orders")
    kinds: list[str] = []
    _wait_until(start_at)

    def decide(rec: fencing.Record) -> dict[str, Any]:
        time.sleep(DELAY)
        return {"n": rec.state["n"] + 1}

    for _ in range(ops):
        if worker % 2 == 0:
            out = orders.apply(
                orders.intent("hot", "inc"),
                decide,
                on_stale=Recompute(attempts=100, backoff=0.001, max_backoff=0.02),
            )
        else:
            with store.lease("orders/hot", owner=f"w{worker}", ttl=10, wait=30) as lease:
                rec = orders.get("hot")
                out = orders.commit(rec.intent("inc"), decide(rec), lease=lease)
        assert isinstance(out, Committed | Stale | Contended), out
        kinds.append(out.kind)
    return kinds


def fenced_process(url: str, worker: int, ops: int, start_at: float) -> list[str]:
    store = fencing.open(url, migrate=False)
    try:
        return fenced_worker(store, worker, ops, start_at)
    finally:
        store.close()


def naive_process(url: str, ops: int, start_at: float) -> int:
    """Read, decide, write back unconditionally: what fencing exists to prevent."""
    conn = _raw(url)
    _wait_until(start_at)
    try:
        for _ in range(ops):
            with conn.cursor() as cur:
                cur.execute("SELECT state FROM fencing_records WHERE `key` = 'hot'")
                n = json.loads(cur.fetchone()[0])["n"]
                time.sleep(DELAY)
                cur.execute(
                    "UPDATE fencing_records SET state = %s, version = version + 1"
                    " WHERE `key` = 'hot'",
                    (json.dumps({"n": n + 1}),),
                )
        return ops
    finally:
        conn.close()


def _threads(fn: Callable[[int], Any], count: int) -> list[Any]:
    results: list[Any] = [None] * count

    def run(i: int) -> None:
        try:
            results[i] = fn(i)
        except BaseException as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


@pytest.mark.slow
def test_hot_key_threads_and_processes(
    mstore: Any, mysql_url: str, processes: ProcessPoolExecutor
) -> None:
    orders = mstore.collection("orders")
    ops_thread, ops_process = 5, 8

    # fencing: apply(Recompute) and fenced commits, 16 threads here and 4 processes
    orders.create("hot", {"n": 0})
    start_at = time.time() + 0.5
    futures = [
        processes.submit(fenced_process, mysql_url, THREADS + p, ops_process, start_at)
        for p in range(PROCESSES)
    ]
    kinds = [
        k
        for ks in _threads(lambda i: fenced_worker(mstore, i, ops_thread, start_at), THREADS)
        for k in ks
    ]
    kinds += [k for f in futures for k in f.result(timeout=120)]
    assert len(kinds) == THREADS * ops_thread + PROCESSES * ops_process
    committed = kinds.count("committed")
    final = orders.get("hot")
    assert committed > 0
    assert final.version == 1 + committed
    assert final.state["n"] == committed

    # the naive baseline on the same schedule must lose updates, or this test proves nothing
    orders.delete("hot")
    base = orders.create("hot", {"n": 0}).version  # continues the deleted record's versions
    assert base == final.version + 1
    start_at = time.time() + 0.5
    futures = [
        processes.submit(naive_process, mysql_url, ops_process, start_at) for _ in range(PROCESSES)
    ]
    writes = sum(_threads(lambda i: naive_process(mysql_url, ops_thread, start_at), THREADS))
    writes += sum(f.result(timeout=120) for f in futures)
    naive = orders.get("hot")
    assert naive.version == base + writes  # every write landed...
    assert naive.state["n"] < writes  # ...and some of them overwrote others: lost updates
    print(
        f"fencing: {committed} committed of {len(kinds)}; naive: {writes - naive.state['n']} lost"
    )


def test_concurrent_duplicate_intent_applies_once(opener: Opener, mysql_url: str) -> None:
    """A guard-only table: the version cannot stop a second apply, only the claim can."""
    store = opener()
    _sql(mysql_url, "CREATE TABLE jobs (id INTEGER PRIMARY KEY, status VARCHAR(20), note TEXT)")
    _sql(mysql_url, "CREATE TABLE job_writes (n INTEGER NOT NULL)")
    _sql(mysql_url, "INSERT INTO job_writes VALUES (0)")
    _sql(mysql_url, "INSERT INTO jobs VALUES (1, 'packed', NULL)")
    _sql(
        mysql_url,
        "CREATE TRIGGER jobs_writes AFTER UPDATE ON jobs FOR EACH ROW"
        " UPDATE job_writes SET n = n + 1",
    )
    jobs = store.table("jobs", version=None)
    for round_ in range(5):
        intent = jobs.intent(1, "note", guard={"status": "packed"})
        barrier = threading.Barrier(8)

        def commit(
            i: int,
            intent: fencing.Intent = intent,
            r: int = round_,
            barrier: threading.Barrier = barrier,
        ) -> fencing.Outcome:
            barrier.wait()
            return jobs.commit(intent, {"note": f"round {r}"})

        kinds = sorted(o.kind for o in _threads(commit, 8))
        assert kinds == ["committed"] + ["duplicate"] * 7
        assert _sql(mysql_url, "SELECT n FROM job_writes") == [(round_ + 1,)]


def test_first_acquire_race_grants_exactly_one(mstore: Any) -> None:
    for round_ in range(4):
        name = f"fresh/{round_}"
        barrier = threading.Barrier(10)

        def grab(i: int, name: str = name, barrier: threading.Barrier = barrier) -> Any:
            barrier.wait()
            return mstore.try_acquire(name, owner=f"w{i}", ttl=30)

        leases = [lease for lease in _threads(grab, 10) if lease is not None]
        assert len(leases) == 1 and leases[0].token == 1
        leases[0].release()


# -- (c) matched rows, not changed rows ---------------------------------------------------
def test_identical_state_counts_as_applied(mstore: Any, mysql_url: str) -> None:
    orders = mstore.collection("orders")
    rec = orders.create("o", {"status": "new"})
    out = orders.commit(rec.intent("same"), {"status": "new"})
    assert isinstance(out, Committed) and out.record.version == 2

    # a table with no version column: nothing in the row changes at all
    _sql(mysql_url, "CREATE TABLE flags (id INTEGER PRIMARY KEY, status VARCHAR(20))")
    _sql(mysql_url, "INSERT INTO flags VALUES (1, 'on')")
    flags = mstore.table("flags", version=None)
    intent = flags.intent(1, "same", guard={"status": "on"})
    same = flags.commit(intent, {"status": "on"})
    assert isinstance(same, Committed) and same.record.state["status"] == "on"
    assert isinstance(flags.commit(intent, {"status": "on"}), Duplicate)


def test_text_guards_are_exact(mstore: Any, mysql_url: str) -> None:
    # the table's default collation is case-insensitive and pads spaces; guards are not
    _sql(mysql_url, "CREATE TABLE flags (id INTEGER PRIMARY KEY, status VARCHAR(20))")
    _sql(mysql_url, "INSERT INTO flags VALUES (1, 'On')")
    flags = mstore.table("flags", version=None)
    for wrong in ("on", "On ", "ON"):
        assert isinstance(
            flags.commit(flags.intent(1, "x", guard={"status": wrong}), {"status": "x"}), Stale
        )
    assert flags.commit(flags.intent(1, "x", guard={"status": "On"}), {"status": "x"}).committed


# -- (d) tokens ---------------------------------------------------------------------------
def test_tokens_keep_increasing_across_reopen(opener: Opener) -> None:
    seen: list[int] = []
    for _ in range(3):
        store = opener()
        with store.lease("jobs/nightly", owner="w", ttl=30) as lease:
            seen.append(lease.token)
        short = store.acquire("jobs/nightly", owner="w", ttl=0.05)
        seen.append(short.token)
        time.sleep(0.1)  # expires by the server's clock; the next token is still higher
        store.close()
    assert seen == sorted(set(seen)) and seen[0] == 1


# -- keys, batches, schema, errors ----------------------------------------------------------
def test_keys_are_exact_bytes(mstore: Any) -> None:
    things = mstore.collection("things")
    keys = ["a", "A", "a ", "ä", "a\u0308", "🦊" * 512]
    for i, key in enumerate(keys):
        things.create(key, {"i": i})
    for i, key in enumerate(keys):
        assert things.get(key).state["i"] == i
    with pytest.raises(fencing.AlreadyExists):
        things.create("a ", {})


def test_commit_many_big_batch_and_guards(mstore: Any) -> None:
    orders = mstore.collection("orders")
    big = "x" * 60_000
    recs = [orders.create(f"o{i}", {"n": 0}) for i in range(40)]
    outs = orders.commit_many([(r.intent("fill"), {"n": 1, "pad": big}) for r in recs])
    assert [o.kind for o in outs] == ["committed"] * 40  # sent in several parts, one transaction
    assert all(orders.get(f"o{i}").version == 2 for i in range(40))

    a = orders.create("a", {"status": "packed"})
    b = orders.create("b", {"status": "new"})
    ia = a.intent("ship", guard={"status": "packed"})
    outs = orders.commit_many(
        [
            (ia, {"status": "shipped"}),
            (b.intent("ship", guard={"status": "packed"}), {"status": "shipped"}),
            (a.intent("deliver").derive(2, 1), {"status": "delivered"}),  # sees the first
            (a.intent("late"), {"status": "x"}),
        ]
    )
    assert [o.kind for o in outs] == ["committed", "stale", "committed", "stale"]
    assert orders.get("a").state["status"] == "delivered"


def test_myisam_table_refused(mstore: Any, mysql_url: str) -> None:
    _sql(mysql_url, "CREATE TABLE loose (id INTEGER PRIMARY KEY, version INTEGER) ENGINE=MyISAM")
    with pytest.raises(fencing.SchemaError, match="InnoDB"):
        mstore.table("loose").get(1)


def test_schema_errors(opener: Opener, mysql_url: str) -> None:
    bare = opener(migrate=False)
    with pytest.raises(fencing.SchemaError):
        bare.collection("orders").get("x")
    store = opener()
    _sql(mysql_url, "UPDATE fencing_schema SET version = 99")
    with pytest.raises(fencing.SchemaError, match="newer"):
        store.migrate()


def test_bad_urls_and_options(mysql_url: str, api: str, loop: Loop) -> None:
    def open_(url: str, **options: Any) -> Any:
        if api == "sync":
            return fencing.open(url, **options)
        return loop.run(fencing.open_async(url, **options))

    with pytest.raises(fencing.ConfigurationError, match="database"):
        open_("mysql://root@127.0.0.1:3306")
    with pytest.raises(fencing.ConfigurationError, match="unknown mysql option"):
        open_(mysql_url + "?pool_sise=3")
    with pytest.raises(fencing.ConfigurationError, match="pool_size"):
        open_(mysql_url, pool_size=0)
    with pytest.raises(fencing.ConfigurationError, match="1049"):  # not retried forever
        open_(f"mysql://root@{mysql_case.HOST}:{mysql_case.PORT}/fencing_no_such_db")
    with pytest.raises(fencing.TransientStoreError):
        open_("mysql://root@127.0.0.1:1/test?connect_timeout=1")


def test_table_keys_match_exactly(mstore: Any, mysql_url: str) -> None:
    _sql(mysql_url, "CREATE TABLE nums (id INTEGER PRIMARY KEY, version INTEGER, status TEXT)")
    _sql(mysql_url, "INSERT INTO nums VALUES (0, 1, 'zero')")
    nums = mstore.table("nums")
    assert nums.get(0).state["status"] == "zero"
    assert nums.get("abc") is None  # MySQL alone would compare 'abc' as the number 0
    assert nums.get("0") is None  # one row, one key type: its fence is never split

    # a case-insensitive, PAD SPACE key column: keys still match exactly
    _sql(
        mysql_url,
        "CREATE TABLE codes (code VARCHAR(20) COLLATE utf8mb4_general_ci PRIMARY KEY,"
        " version INTEGER NOT NULL DEFAULT 1, status TEXT)",
    )
    _sql(mysql_url, "INSERT INTO codes (code, status) VALUES ('k', 'a')")
    codes = mstore.table("codes", key="code")
    _sql(mysql_url, "INSERT INTO codes (code, status) VALUES ('05', 'a')")
    assert codes.get("K") is None and codes.get("k ") is None and codes.get(5) is None
    assert codes.get("05").state["status"] == "a"
    out = codes.commit(codes.intent("k", "x"), {"status": "b"})
    assert isinstance(out, Committed) and out.record.key == "k" and out.record.version == 2


def test_value_a_column_cannot_hold_is_invalid_state(mstore: Any, mysql_url: str) -> None:
    _sql(
        mysql_url,
        "CREATE TABLE strict_t (id INTEGER PRIMARY KEY, version INTEGER NOT NULL,"
        " status VARCHAR(5) NOT NULL, total TINYINT)",
    )
    _sql(mysql_url, "INSERT INTO strict_t VALUES (1, 1, 'a', 0)")
    table = mstore.table("strict_t")
    intent = table.intent(1, "x")
    for state in ({"status": "much too long"}, {"status": None}, {"total": 1000}):
        with pytest.raises(fencing.InvalidState):
            table.commit(intent, state)
    assert _sql(mysql_url, "SELECT COUNT(*) FROM fencing_applied") == [(0,)]
    assert table.commit(intent, {"status": "b"}).committed


def test_missing_driver_names_the_extra(
    mysql_url: str, api: str, loop: Loop, monkeypatch: pytest.MonkeyPatch
) -> None:
    driver = "pymysql" if api == "sync" else "aiomysql"

    def open_() -> Any:
        if api == "sync":
            return fencing.open(mysql_url)
        return loop.run(fencing.open_async(mysql_url))

    # undone before the fixtures' teardown, which drops the test database with pymysql
    # (the monkeypatch fixture itself may be torn down after them)
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, driver, None)
        with pytest.raises(fencing.MissingDependency, match=r"fencing\[mysql\]"):
            open_()


def test_idle_connection_killed_is_replaced_quietly(mstore: Any, mysql_url: str) -> None:
    orders = mstore.collection("orders")
    orders.create("k", {"n": 0})  # one connection, now idle in the pool
    rows = _sql(
        mysql_url,
        "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = %s AND ID <> CONNECTION_ID()",
        _database(mysql_url),
    )
    assert rows
    for (thread_id,) in rows:
        _kill(mysql_url, int(thread_id))
    time.sleep(0.2)
    assert orders.get("k").version == 1  # a dead idle connection is dropped, not used


# -- effects --------------------------------------------------------------------------------
def test_store_before_effects_gains_them_on_migrate(opener: Opener, mysql_url: str) -> None:
    first = opener()
    first.collection("orders").create("o-1", {"status": "new"})
    # the store as the previous release left it: no effects table, schema version 1
    _sql(mysql_url, "DROP TABLE fencing_effects")
    _sql(mysql_url, "UPDATE fencing_schema SET version = 1")

    bare = opener(migrate=False)
    late = bare.collection("orders").intent("o-1", "charge")
    with pytest.raises(fencing.SchemaError):
        bare.collection("orders").effect(late, "charge")

    store = opener()  # migrates: the table and its indexes appear, the version moves on
    assert _sql(mysql_url, "SELECT component, version FROM fencing_schema") == [("core", 7)]
    indexes = _sql(
        mysql_url,
        "SELECT DISTINCT INDEX_NAME FROM information_schema.STATISTICS"
        " WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'fencing_effects'",
    )
    assert {i for (i,) in indexes} == {"PRIMARY", "fencing_effects_intent", "fencing_effects_open"}

    orders = store.collection("orders")
    fx = orders.effect(late, "charge", detail={"amount": 10})
    assert orders.commit(orders.intent("o-1", "cancel"), {"status": "cancelled"}).committed
    assert isinstance(orders.commit(late, {"status": "charged"}), Stale)
    (listed,) = store.effects_to_reconcile()
    assert (listed.idempotency_key, listed.outcome) == (fx.idempotency_key, "stale")
    marked = store.mark_reconciled(listed)

    store.migrate()  # again: nothing changes, nothing is lost
    assert _sql(mysql_url, "SELECT version FROM fencing_schema") == [(7,)]
    assert store.get_effect(fx.idempotency_key) == marked
    assert store.effects_to_reconcile() == []


def _outbox_indexes(url: str) -> dict[str, list[str]]:
    rows = _sql(
        url,
        "SELECT INDEX_NAME, COLUMN_NAME FROM information_schema.STATISTICS"
        " WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'fencing_outbox'"
        " ORDER BY INDEX_NAME, SEQ_IN_INDEX",
    )
    found: dict[str, list[str]] = {}
    for index, column in rows:
        found.setdefault(str(index), []).append(str(column))
    return found


def test_outbox_of_version_4_gains_covering_indexes_on_migrate(
    opener: Opener, mysql_url: str
) -> None:
    """Version 5: the unsent rows' indexes carry what a claim's key check and the stats
    read (a big backlog made MariaDB scan the whole table for both)."""
    opener()
    _sql(
        mysql_url,
        "INSERT INTO fencing_outbox (kind, task, payload, options, okey, created_at)"
        " VALUES ('celery', 'shop.ship', '{}', '{}', 'k1', 1)",
    )
    covering = _outbox_indexes(mysql_url)
    assert covering["fencing_outbox_unsent"] == ["unsent_kind", "id", "created_at"]
    # version 7: a debounced row's due time and the queue kind too (supersede, debounce)
    assert covering["fencing_outbox_key"] == [
        "unsent_key", "id", "claimed_until", "due_at", "kind"
    ]  # fmt: skip
    # the outbox as version 4 left it
    _sql(
        mysql_url,
        "ALTER TABLE fencing_outbox DROP INDEX fencing_outbox_unsent,"
        " ADD INDEX fencing_outbox_unsent (unsent_kind, id), DROP INDEX fencing_outbox_key,"
        " ADD INDEX fencing_outbox_key (unsent_key, id), DROP INDEX fencing_outbox_superseded,"
        " DROP COLUMN superseded_at, DROP COLUMN due_at, DROP COLUMN burst_at",
    )  # (its dead rows' columns are kept: generated columns read them)
    _sql(mysql_url, "UPDATE fencing_schema SET version = 4")
    store = opener()  # migrates
    assert _sql(mysql_url, "SELECT version FROM fencing_schema") == [(7,)]
    assert _outbox_indexes(mysql_url) == covering
    assert [r.key for r in store.outbox.pending()] == ["k1"]  # nothing lost
    store.migrate()  # again: nothing changes
    assert _outbox_indexes(mysql_url) == covering


def test_effect_rows_hold_the_text_as_given_and_the_servers_clock(
    mstore: Any, mysql_url: str
) -> None:
    things = mstore.collection("things")
    key = "caf\u00e9 \U0001f98a" * 64
    things.create(key, {"n": 0})
    intent = things.intent(key, "ship")
    detail = {"note": "\u00e0 \u2615 \U0001f600", "n": [1, 2.5, None]}
    (before,) = _sql(mysql_url, "SELECT UNIX_TIMESTAMP(NOW(6))")
    fx = things.effect(intent, "label", detail=detail)
    (after,) = _sql(mysql_url, "SELECT UNIX_TIMESTAMP(NOW(6))")
    assert float(before[0]) <= fx.recorded_at == fx.updated_at <= float(after[0])
    assert (fx.key, fx.detail) == (key, detail)
    rows = _sql(
        mysql_url,
        "SELECT record_key, detail, outcome, reconciled_at FROM fencing_effects"
        " WHERE idempotency_key = %s",
        fx.idempotency_key,
    )
    assert rows == [(json.dumps(key), dump_detail(detail), None, None)]

    done = things.effect_done(fx)  # no detail: the stored one stays
    assert done.detail == detail and done.status == "done"
    assert done.updated_at >= done.recorded_at == fx.recorded_at


def record_effect_process(url: str, intent_json: str, rounds: int, start_at: float) -> list[Any]:
    """Record effect ``fx<round>`` of one intent at each round's start time."""
    store = fencing.open(url, migrate=False)
    try:
        orders = store.collection("orders")
        intent = fencing.Intent.from_json(intent_json)
        seen = []
        for round_ in range(rounds):
            _wait_until(start_at + round_ * 0.3)
            fx = orders.effect(intent, f"fx{round_}", detail={"round": round_})
            seen.append((fx.idempotency_key, fx.recorded_at, fx.status))
        return seen
    finally:
        store.close()


def test_processes_recording_one_effect_make_one_row(
    mstore: Any, mysql_url: str, processes: ProcessPoolExecutor
) -> None:
    orders = mstore.collection("orders")
    orders.create("o-1", {"status": "new"})
    intent = orders.intent("o-1", "charge")
    rounds = 5
    start_at = time.time() + 0.5
    futures = [
        processes.submit(record_effect_process, mysql_url, intent.to_json(), rounds, start_at)
        for _ in range(PROCESSES)
    ]
    seen = [f.result(timeout=120) for f in futures]
    stored = {e.name: e for e in orders.effects(intent)}
    assert sorted(stored) == [f"fx{r}" for r in range(rounds)]
    assert _sql(mysql_url, "SELECT COUNT(*) FROM fencing_effects") == [(rounds,)]
    for round_ in range(rounds):
        fx = stored[f"fx{round_}"]
        # every process got the one stored row back: the first recording won
        assert {s[round_] for s in seen} == {(fx.idempotency_key, fx.recorded_at, "pending")}


def test_a_commit_whose_client_left_is_applied_whole(
    mysql_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker is interrupted right after sending a commit: the server still runs the
    whole script, but ROW_COUNT() answers -1 there once a reply cannot be sent. The claim
    must never be kept without the write (a retry would answer Duplicate for lost work)."""
    import pymysql.connections

    store = fencing.open(mysql_url)
    try:
        orders = store.collection("orders")
        orders.create("k", {"n": 0})
        read = pymysql.connections.Connection._read_query_result
        armed = [False]

        class Interrupted(Exception):
            pass

        def interrupted(self: Any, unbuffered: bool = False) -> Any:
            if armed[0]:
                armed[0] = False
                raise Interrupted
            return read(self, unbuffered)

        monkeypatch.setattr(pymysql.connections.Connection, "_read_query_result", interrupted)
        for n in range(1, 6):
            intent = orders.intent("k", "bump")
            armed[0] = True
            with pytest.raises(Interrupted):
                orders.commit(intent, {"n": n})
            again = orders.commit(intent, {"n": n})
            assert isinstance(again, (fencing.Committed, fencing.Duplicate)), again
            assert again.record.version == n + 1 and dict(again.record.state) == {"n": n}
    finally:
        store.close()
