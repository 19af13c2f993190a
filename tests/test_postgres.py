"""What only a real PostgreSQL server shows: faults, races and round trips.

The contract suite already runs on this backend (sync and async); here: a connection
killed or cut in the middle of a commit, races that READ COMMITTED decides with row
locks (each forced deterministically by holding a row lock from another session),
threads and processes on one hot key next to a naive baseline that must lose updates,
the statements and round trips each call costs (libpq's protocol trace), and tokens
that survive closing the store.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import random
import signal
import socket
import sys
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, suppress
from typing import Any

import pytest

import fencing
from fencing import (
    Committed,
    Duplicate,
    Fenced,
    FenceReason,
    Intent,
    Recompute,
    Stale,
)

from ._backends import TABLE_COLUMNS
from .backends_postgres import (
    HOST,
    PORT,
    Setup,
    Traffic,
    admin,
    cleanup,
    create_table,
    new_setup,
    opened,
    pgconn_of,
    schema_of,
    traced,
)

psycopg = pytest.importorskip("psycopg")

SPAWN = multiprocessing.get_context("spawn")
WAIT = 30.0  # seconds any single blocked step may take before the test fails


@contextmanager
def session(schema: str) -> Iterator[Any]:
    """An autocommit connection of our own, the test's schema first on its search path."""
    from psycopg import sql

    with admin() as conn:
        conn.execute(sql.SQL("SET search_path TO {}, public").format(sql.Identifier(schema)))
        yield conn


def lock_waiters(app: str, n: int) -> list[int]:
    """Wait until ``n`` of the store's connections wait for a lock; their pids, oldest first."""
    deadline = time.monotonic() + WAIT
    with admin() as conn:
        while True:
            pids = [
                row[0]
                for row in conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = %s"
                    " AND wait_event_type = 'Lock' ORDER BY query_start",
                    [app],
                )
            ]
            if len(pids) >= n:
                return pids
            assert time.monotonic() < deadline, f"only {len(pids)} of {n} commits blocked"
            time.sleep(0.01)


def in_thread(fn: Callable[..., Any], *args: Any) -> Future[Any]:
    pool = ThreadPoolExecutor(1)
    future = pool.submit(fn, *args)
    pool.shutdown(wait=False)
    return future


def test_driver_errors_are_translated_at_the_boundary() -> None:
    from fencing.backends.postgres.errors import translate

    errors = psycopg.errors
    assert isinstance(translate(errors.AdminShutdown("x")), fencing.TransientStoreError)
    assert isinstance(translate(psycopg.OperationalError("lost")), fencing.TransientStoreError)
    assert isinstance(translate(errors.SerializationFailure("x")), fencing.TransientStoreError)
    assert isinstance(translate(errors.DeadlockDetected("x")), fencing.TransientStoreError)
    assert isinstance(translate(errors.UndefinedTable("x")), fencing.SchemaError)
    assert isinstance(translate(errors.UndefinedColumn("x")), fencing.SchemaError)
    assert isinstance(translate(errors.NumericValueOutOfRange("x")), fencing.InvalidInput)
    plain = translate(errors.InsufficientPrivilege("x"))
    assert type(plain) is fencing.StoreError


# -- (a) a connection killed, or its reply cut, in the middle of a commit ----------------
def test_commit_killed_mid_statement_then_retried_applies_once(pg: Setup, api: str) -> None:
    with opened(pg.url, api) as store:
        orders = store.collection("orders")
        intent = orders.create("o-1", {"n": 0}).intent("inc")
        with session(pg.schema) as lock:
            lock.execute("BEGIN")
            lock.execute("SELECT 1 FROM fencing_records WHERE key = 'o-1' FOR UPDATE")
            pending = in_thread(orders.commit, intent, {"n": 1})
            [pid] = lock_waiters(pg.app, 1)
            with admin() as killer:
                assert killer.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()[0]
            with pytest.raises(fencing.TransientStoreError):
                pending.result(timeout=WAIT)
            lock.execute("ROLLBACK")
        assert orders.get("o-1").version == 1  # the killed statement wrote nothing
        again = orders.commit(intent, {"n": 1})
        assert isinstance(again, Committed) and again.record.version == 2
        assert isinstance(orders.commit(intent, {"n": 1}), Duplicate)
        assert orders.get("o-1").version == 2


class CuttingProxy:
    """A TCP proxy to the server. Once armed, it cuts the connection as soon as the
    server starts to answer: the statement ran and committed, its reply is lost."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.armed = threading.Event()
        self.cut = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            self.sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, answers: bool) -> None:
        try:
            while data := src.recv(65536):
                if answers and self.armed.is_set():
                    self.armed.clear()
                    self.cut.set()
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self.listener.close()
        for s in self.sockets:
            s.close()


def test_reply_lost_after_the_server_committed_retry_is_duplicate(api: str) -> None:
    proxy = CuttingProxy(HOST, PORT)
    setup = new_setup(port=str(proxy.port), min_size="1", max_size="1", sslmode="disable")
    try:
        with opened(setup.url, api) as store:
            orders = store.collection("orders")
            intent = orders.create("o-1", {"n": 0}).intent("inc")
            proxy.armed.set()
            with pytest.raises(fencing.TransientStoreError):
                orders.commit(intent, {"n": 1})
            assert proxy.cut.is_set()
            with session(setup.schema) as conn:  # the commit did land
                row = conn.execute("SELECT version FROM fencing_records WHERE key = 'o-1'")
                assert row.fetchone()[0] == 2
            retried = orders.commit(intent, {"n": 1})
            assert isinstance(retried, Duplicate) and retried.record.version == 2
            assert dict(orders.get("o-1").state) == {"n": 1}
    finally:
        proxy.close()
        cleanup(setup.url)


def test_random_kills_lose_nothing_and_apply_nothing_twice(pg: Setup) -> None:
    """Workers append to a log through commits retried with the same intent after every
    transient error, while their connections are killed at random."""
    workers, rounds = 3, 12
    stop = threading.Event()
    kills = 0

    def killer() -> None:
        nonlocal kills
        rng = random.Random(7)
        with admin() as conn:
            while not stop.is_set():
                row = conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE application_name = %s AND state = 'active'"
                    " ORDER BY random() LIMIT 1",
                    [pg.app],
                ).fetchone()
                kills += bool(row and row[0])
                time.sleep(rng.uniform(0.001, 0.01))

    with opened(pg.url, "sync") as store:
        log = store.collection("log")
        log.create("k", {"log": []})
        acked: dict[str, str] = {}
        transient = Counter[str]()

        def retry(call: Callable[[], Any]) -> Any:
            while True:
                try:
                    return call()
                except fencing.TransientStoreError:
                    transient["errors"] += 1

        def work(w: int) -> None:
            for i in range(rounds):
                entry = f"{w}-{i}"
                while True:
                    rec = retry(lambda: log.get("k"))
                    intent = rec.intent("append")
                    state = {"log": [*rec.state["log"], entry]}
                    out = retry(lambda i=intent, s=state: log.commit(i, s))  # same intent
                    if isinstance(out, Committed | Duplicate):
                        acked[entry] = out.kind
                        break
                    assert isinstance(out, Stale), out

        threading.Thread(target=killer, daemon=True).start()
        try:
            with ThreadPoolExecutor(workers) as pool:
                list(pool.map(work, range(workers)))
        finally:
            stop.set()
        final = retry(lambda: log.get("k"))
    entries = final.state["log"]
    assert len(entries) == len(set(entries)), "an intent was applied twice"
    assert final.version == 1 + len(entries)
    assert set(entries) == set(acked), "an acknowledged commit was lost, or one never acked"
    assert len(acked) == workers * rounds
    assert kills > 0 and transient["errors"] > 0, "no connection was killed: nothing tested"


# -- races decided by row locks, forced deterministically ---------------------------------
def test_refused_by_a_concurrent_writer_reports_its_record(pg: Setup, api: str) -> None:
    """The statement's snapshot still shows the old version, but the UPDATE waited for a
    concurrent writer and re-checked: Stale, with the record that writer left."""
    with opened(pg.url, api) as store:
        orders = store.collection("orders")
        orders.create("o-1", {"n": 0})
        commits = [
            lambda intent: orders.commit(intent, {"n": 1}),
            lambda intent: orders.commit_many([(intent, {"n": 1})])[0],
        ]
        for commit in commits:
            current = orders.get("o-1")
            with session(pg.schema) as writer:
                writer.execute("BEGIN")
                writer.execute(
                    "UPDATE fencing_records SET version = version + 1,"
                    " state = jsonb_build_object('n', version * 100) WHERE key = 'o-1'"
                )
                pending = in_thread(commit, current.intent("x"))
                lock_waiters(pg.app, 1)
                writer.execute("COMMIT")
            out = pending.result(timeout=WAIT)
            assert isinstance(out, Stale), out
            assert out.current.version == current.version + 1
            assert out.current.state["n"] == current.version * 100


def test_lease_refused_by_a_concurrent_change_reports_the_newest_row(pg: Setup, api: str) -> None:
    """A lease statement waited for a concurrent change its snapshot does not show: the
    answer is the row after that change (the holder's name, "a newer owner")."""
    take_over = (
        "UPDATE fencing_leases SET owner = 'x', token = token + 1,"
        " expires_at = extract(epoch FROM now()) + 60 WHERE name = %s"
    )
    with opened(pg.url, api) as store:
        store.acquire("jobs/free", owner="a", ttl=60).release()
        lease = store.acquire("jobs/held", owner="a", ttl=60)
        calls: list[tuple[str, Callable[[], Any]]] = [
            ("jobs/free", lambda: store.acquire("jobs/free", owner="b", ttl=5)),
            ("jobs/held", lease.renew),
        ]
        errors = []
        for name, call in calls:
            with session(pg.schema) as writer:
                writer.execute("BEGIN")
                writer.execute(take_over, [name])
                pending = in_thread(call)
                lock_waiters(pg.app, 1)
                writer.execute("COMMIT")
            errors.append(pending.exception(timeout=WAIT))
        held, lost = errors
        assert isinstance(held, fencing.LeaseHeld) and held.holder == "x", held
        assert isinstance(lost, fencing.LeaseLost) and lease.lost_reason == "newer_owner"


def _audited_table(store: Any, schema: str) -> None:
    create_table(store, "orders_t", "id", None, TABLE_COLUMNS, [{"id": 1, "status": "packed"}])
    with session(schema) as conn:
        conn.execute("CREATE TABLE audit (id serial PRIMARY KEY, total INTEGER)")
        conn.execute(
            "CREATE FUNCTION audit_it() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN INSERT INTO audit (total) VALUES (NEW.total); RETURN NEW; END $$"
        )
        conn.execute(
            "CREATE TRIGGER audit_it AFTER UPDATE ON orders_t"
            " FOR EACH ROW EXECUTE FUNCTION audit_it()"
        )


def _race(pg: Setup, calls: list[Callable[[], Any]]) -> list[Any]:
    """Run ``calls`` one after the other into a row lock held on orders_t, then let go:
    they take the row in that order."""
    with session(pg.schema) as lock:
        lock.execute("BEGIN")
        lock.execute("SELECT 1 FROM orders_t WHERE id = 1 FOR UPDATE")
        pending = []
        for n, call in enumerate(calls, 1):
            pending.append(in_thread(call))
            lock_waiters(pg.app, n)
        lock.execute("ROLLBACK")
    return [p.result(timeout=WAIT) for p in pending]


def test_same_intent_twice_at_once_applies_once(pg: Setup, api: str) -> None:
    """A guard-only table whose guard still holds after the write: the second commit
    re-checks and passes, then its claim of the intent hits the first one's: the
    statement rolls back whole (its trigger's row too) and reports Duplicate."""
    with opened(pg.url, api) as store:
        _audited_table(store, pg.schema)
        table = store.table("orders_t", version=None)
        intent = table.intent(1, "total", guard={"status": "packed"})
        outs = _race(pg, [lambda: table.commit(intent, {"total": 5})] * 2)
        assert sorted(o.kind for o in outs) == ["committed", "duplicate"]
        with session(pg.schema) as conn:
            assert conn.execute("SELECT count(*) FROM audit").fetchone()[0] == 1
            assert conn.execute("SELECT count(*) FROM fencing_applied").fetchone()[0] == 1


def test_newer_fence_wins_a_race_on_a_table(pg: Setup, api: str) -> None:
    """Two leases on one row: the newer token writes first; the older one's statement
    passed its snapshot's fence check, but the fence it must raise is newer: rolled
    back whole, Fenced(newer_owner)."""
    with opened(pg.url, api) as store:
        _audited_table(store, pg.schema)
        table = store.table("orders_t", version=None)
        old = store.acquire("zombie", owner="z", ttl=30)
        store.acquire("fresh", owner="n", ttl=30).release()
        new = store.acquire("fresh", owner="n", ttl=30)
        assert new.token > old.token
        guard = {"status": "packed"}
        mine, theirs = table.intent(1, "z", guard=guard), table.intent(1, "n", guard=guard)
        newer, older = _race(
            pg,
            [
                lambda: table.commit(theirs, {"total": 2}, lease=new),
                lambda: table.commit(mine, {"total": 1}, lease=old),
            ],
        )
        assert isinstance(newer, Committed) and newer.record.fence == new.token
        assert isinstance(older, Fenced) and older.reason is FenceReason.NEWER_OWNER
        assert table.get(1).state["total"] == 2
        with session(pg.schema) as conn:
            assert [r[0] for r in conn.execute("SELECT total FROM audit")] == [2]


# -- (b) threads and processes on one hot key, and a naive baseline ----------------------
HOT, KEY = "hot", "counter"
POLICY = Recompute(attempts=200, backoff=0.001, max_backoff=0.02)


def _decide(worker: str) -> Callable[[fencing.Record], dict[str, Any]]:
    def decide(record: fencing.Record) -> dict[str, Any]:
        time.sleep(0.001)  # the decision takes a while: others get in meanwhile
        counts = dict(record.state["counts"])
        counts[worker] = counts.get(worker, 0) + 1
        return {"n": record.state["n"] + 1, "counts": counts}

    return decide


def fenced_worker(store: Any, worker: str, rounds: int, leased: bool) -> list[str]:
    """``rounds`` increments through apply(Recompute), under a lease when ``leased``."""
    hot, kinds = store.collection(HOT), []
    for _ in range(rounds):
        if leased:
            with store.lease(f"{HOT}/{KEY}", owner=worker, ttl=60, wait=WAIT) as lease:
                out = hot.apply(
                    hot.intent(KEY, "inc"), _decide(worker), on_stale=POLICY, lease=lease
                )
        else:
            out = hot.apply(hot.intent(KEY, "inc"), _decide(worker), on_stale=POLICY)
        kinds.append(out.kind)
    return kinds


def naive_worker(schema: str, worker: str, rounds: int) -> list[str]:
    """The same schedule as a plain read, decide, write: no version in the UPDATE."""
    from psycopg.types.json import Jsonb

    with session(schema) as conn:
        for _ in range(rounds):
            (state,) = conn.execute(
                "SELECT state FROM fencing_records WHERE collection = %s AND key = %s", [HOT, KEY]
            ).fetchone()
            time.sleep(0.001)
            counts = dict(state["counts"])
            counts[worker] = counts.get(worker, 0) + 1
            conn.execute(
                "UPDATE fencing_records SET state = %s, version = version + 1"
                " WHERE collection = %s AND key = %s",
                [Jsonb({"n": state["n"] + 1, "counts": counts}), HOT, KEY],
            )
    return ["committed"] * rounds


def process_main(
    url: str, mode: str, worker: str, rounds: int, leased: bool, go: Any, out: Any
) -> None:
    """A spawned process: open its own store, report ready, wait for go, hammer."""
    try:
        store = fencing.open(url) if mode == "fencing" else None
        out.put(("ready", worker, None))
        go.wait(WAIT)
        if store is not None:
            kinds = fenced_worker(store, worker, rounds, leased)
            store.close()
        else:
            kinds = naive_worker(schema_of(url), worker, rounds)
        out.put(("done", worker, kinds))
    except BaseException as exc:
        out.put(("error", worker, repr(exc)))
        raise


def _run_schedule(setup: Setup, mode: str, store: Any) -> dict[str, list[str]]:
    """16 threads here and 4 spawned processes, a quarter of each under a lease."""
    threads, processes, rounds = 16, 4, 4
    go, out = SPAWN.Event(), SPAWN.Queue()
    procs = [
        SPAWN.Process(
            target=process_main,
            args=(setup.url, mode, f"p{i}", rounds, i % 4 == 0, go, out),
            daemon=True,
        )
        for i in range(processes)
    ]
    for p in procs:
        p.start()
    results: dict[str, list[str]] = {}
    try:
        for _ in procs:
            kind, worker, detail = out.get(timeout=120)
            assert kind == "ready", (worker, detail)

        def thread(i: int) -> None:
            worker = f"t{i}"
            if mode == "fencing":
                results[worker] = fenced_worker(store, worker, rounds, i % 4 == 0)
            else:
                results[worker] = naive_worker(setup.schema, worker, rounds)

        with ThreadPoolExecutor(threads) as pool:
            go.set()
            futures = [pool.submit(thread, i) for i in range(threads)]
            for _ in procs:
                kind, worker, detail = out.get(timeout=240)
                assert kind == "done", (worker, detail)
                results[worker] = detail
            for f in futures:
                f.result()
    finally:
        for p in procs:
            p.join(timeout=WAIT)
            if p.is_alive():
                p.kill()
    return results


@pytest.fixture
def pg16() -> Iterator[Setup]:
    setup = new_setup(max_size="16")  # a connection for each of the 16 threads
    yield setup
    cleanup(setup.url)


@pytest.mark.slow
def test_threads_and_processes_on_one_hot_key(pg16: Setup) -> None:
    setup = pg16
    start = {"n": 0, "counts": {}}
    with opened(setup.url, "sync") as store:
        hot = store.collection(HOT)
        hot.create(KEY, start)
        results = _run_schedule(setup, "fencing", store)
        final = hot.get(KEY)
    committed = Counter({w: kinds.count("committed") for w, kinds in results.items()})
    assert all(set(kinds) <= {"committed", "contended"} for kinds in results.values()), results
    total = sum(committed.values())
    assert total > 0
    assert final.version == 1 + total
    assert final.state["n"] == total
    assert final.state["counts"] == {w: n for w, n in committed.items() if n}
    assert final.fence > 0  # the leased workers' tokens reached the record

    # The naive baseline, same workers and schedule, from the same starting state.
    with session(setup.schema) as conn:
        conn.execute(
            "UPDATE fencing_records SET state = %s::jsonb, version = 1 WHERE key = %s",
            ['{"n": 0, "counts": {}}', KEY],
        )
    naive = _run_schedule(setup, "naive", None)
    acknowledged = sum(len(kinds) for kinds in naive.values())
    with session(setup.schema) as conn:
        (state,) = conn.execute(
            "SELECT state FROM fencing_records WHERE key = %s", [KEY]
        ).fetchone()
    assert acknowledged == 20 * 4
    assert state["n"] < acknowledged, "the naive baseline lost no update: the test proves nothing"


# -- (c) one statement, one round trip -----------------------------------------------------
def _each_once(traffic: list[Traffic], statements: int = 1) -> None:
    """Every call: ``statements`` statements, one round trip; one call may need one more
    round trip, the single time psycopg prepares a lone statement (threshold 5); in a
    pipeline, preparing costs no round trip."""
    assert [t.statements for t in traffic] == [statements] * len(traffic), traffic
    if statements == 1:
        assert all(t.round_trips == 1 + t.prepares for t in traffic), traffic
        assert sum(1 for t in traffic if t.prepares) <= 1, traffic
    else:
        assert all(t.round_trips == 1 for t in traffic), traffic
    assert traffic[-1].round_trips == 1


def test_commit_is_one_statement_and_one_round_trip(api: str) -> None:
    setup = new_setup(min_size="1", max_size="1")
    try:
        with opened(setup.url, api) as store:
            orders = store.collection("orders")
            for key in ("o-1", "b-0", "b-1", "b-2"):
                orders.create(key, {"n": 0})
            create_table(store, "orders_t", "id", "version", TABLE_COLUMNS, [{"id": 1}])
            table = store.table("orders_t")
            lease = store.acquire("orders/o-1", owner="w", ttl=60)
            pgconn = pgconn_of(store)
            plain, guarded, fenced, rows, batches, leases = [], [], [], [], [], []
            repeated, fenced_batches = [], []
            for n in range(8):
                intent = orders.intent("o-1", "inc")
                with traced(pgconn) as t:
                    assert orders.commit(intent, {"n": n}).committed
                plain += t
                intent = orders.intent("o-1", "inc", guard={"n": n})
                with traced(pgconn) as t:
                    assert orders.commit(intent, {"n": n + 1}, lease=lease).committed
                guarded += t
                intent = table.intent(1, "x")
                with traced(pgconn) as t:
                    assert table.commit(intent, {"total": n}, lease=lease).committed
                fenced += t
                intent = table.intent(1, "y")
                with traced(pgconn) as t:
                    assert table.commit(intent, {"status": "s", "note": None}).committed
                rows += t
                items = [(orders.intent(k, "b"), {"n": n}) for k in ("b-0", "b-1", "b-2")]
                with traced(pgconn) as t:
                    outs = orders.commit_many(items)
                assert [o.kind for o in outs] == ["committed"] * 3
                batches += t
                items = [(orders.intent(k, "f"), {"n": n}) for k in ("b-0", "b-1", "b-2")]
                with traced(pgconn) as t:
                    outs = orders.commit_many(items, lease=lease)
                assert [o.kind for o in outs] == ["committed"] * 3
                fenced_batches += t
                first = orders.intent("b-0", "r")  # a key twice: the pipeline, in order
                second = Intent.new("orders", "b-0", first.expected_version + 1, "r")
                with traced(pgconn) as t:
                    outs = orders.commit_many([(first, {"n": n}), (second, {"n": n + 1})])
                assert [o.kind for o in outs] == ["committed"] * 2
                repeated += t
                with traced(pgconn) as t:
                    lease.renew()
                leases += t
            with traced(pgconn) as t:
                lease.release()
            with traced(pgconn) as t2:
                store.acquire("orders/o-1", owner="w", ttl=60).release()
        for traffic in (plain, guarded, fenced, rows, leases):
            _each_once(traffic)
        # a batch: its locks (tombstones made, then shared; records; the lease when
        # fenced), then one statement for the whole batch, or one per item: one round trip
        _each_once(batches, statements=4)
        _each_once(fenced_batches, statements=5)
        _each_once(repeated, statements=5)
        assert t[0].statements == 1 and t[0].round_trips == 1
        assert t2[0].statements == 2 and t2[0].round_trips == 2  # acquire, then release
    finally:
        cleanup(setup.url)


def test_a_batch_is_one_transaction(pg: Setup, api: str) -> None:
    """A value the column cannot hold, last in a batch: the whole batch rolls back."""
    with opened(pg.url, api) as store:
        create_table(store, "orders_t", "id", "version", TABLE_COLUMNS, [{"id": 1}, {"id": 2}])
        table = store.table("orders_t")
        items = [(table.intent(1, "a"), {"total": 1}), (table.intent(2, "b"), {"total": 2**40})]
        with pytest.raises(fencing.InvalidInput):
            table.commit_many(items)
        assert table.get(1).version == 1 and table.get(1).state["total"] is None
        orders = store.collection("orders")
        orders.create("o-1", {"n": 0})
        with pytest.raises(fencing.InvalidState):  # jsonb cannot hold \u0000
            orders.commit_many([(orders.intent("o-1", "x"), {"n": 1, "s": "a\x00b"})])
        assert orders.get("o-1").version == 1
        assert [o.kind for o in table.commit_many(items[:1])] == ["committed"]


# -- (e) a collection's batch in one statement ----------------------------------------------
def test_a_batch_statement_judges_each_item_on_its_own(pg: Setup, api: str) -> None:
    """One statement for the batch, one outcome per item in the caller's order: applied,
    duplicate, stale (version, and guard), missing and fenced side by side; each
    refused item reports the record as it is, and only the applied ones wrote."""
    with opened(pg.url, api) as store:
        orders = store.collection("orders")
        for key in ("a", "b", "c", "d", "e", "f"):
            orders.create(key, {"status": "new", "n": 0})
        old = store.acquire("zombie", owner="z", ttl=60)
        store.acquire("fresh", owner="n", ttl=60).release()
        new = store.acquire("fresh", owner="n", ttl=60)
        assert new.token > old.token
        dup = orders.intent("b", "ship")
        assert orders.commit(dup, {"status": "shipped", "n": 1}).committed
        stale = orders.intent("c", "ship")
        assert orders.commit(orders.intent("c", "other"), {"status": "held", "n": 7}).committed
        guarded = orders.intent("d", "ship", guard={"status": "packed"})
        assert orders.commit(
            orders.intent("e", "x"), {"status": "new", "n": 5}, lease=new
        ).committed
        fenced = orders.intent("e", "ship")
        gone = orders.intent("f", "ship")
        orders.delete("f")
        applied = orders.intent("a", "ship")
        items = [
            (fenced, {"n": 10}),
            (applied, {"n": 11}),
            (stale, {"n": 12}),
            (gone, {"n": 13}),
            (dup, {"n": 14}),
            (guarded, {"n": 15}),
        ]
        outs = orders.commit_many(items, lease=old)
        assert [o.kind for o in outs] == [
            "fenced",
            "committed",
            "stale",
            "missing",
            "duplicate",
            "stale",
        ]
        assert outs[0].reason is FenceReason.NEWER_OWNER
        assert outs[0].current.fence == new.token and outs[0].current.state["n"] == 5
        assert outs[1].record.version == 2 and outs[1].record.fence == old.token
        assert dict(outs[1].record.state) == {"n": 11}
        assert outs[2].current.version == 2 and dict(outs[2].current.state) == {
            "status": "held",
            "n": 7,
        }
        assert outs[4].record.version == 2 and outs[4].record.state["n"] == 1
        assert outs[5].current.version == 1 and outs[5].current.state["status"] == "new"
        assert orders.get("a").version == 2 and orders.get("a").fence == old.token
        assert [orders.get(k).version for k in ("b", "c", "d", "e")] == [2, 2, 1, 2]
        assert orders.get("e").fence == new.token and orders.get("f") is None
        # the same shapes without a lease (the statement without lease checks)
        again = [
            (orders.intent("d", "ship", guard={"status": "new"}), {"status": "packed"}),
            (applied, {"n": 99}),  # applied above: a duplicate now
            (stale, {"n": 99}),
            (Intent.new("orders", "never", 1, "ship"), {"n": 99}),
        ]
        outs = orders.commit_many(again)
        assert [o.kind for o in outs] == ["committed", "duplicate", "stale", "missing"]
        assert dict(orders.get("d").state) == {"status": "packed"}
        assert orders.get("a").state["n"] == 11


# -- (e2) a guarded table's batch in one statement ------------------------------------------
def test_a_table_batch_is_one_statement(api: str) -> None:
    """A guarded table's batch of distinct keys, one shape: ONE statement, one round
    trip, with or without a lease; a key twice (or items of different shapes): the
    locks, then one statement per item, still one round trip."""
    setup = new_setup(min_size="1", max_size="1")
    try:
        with opened(setup.url, api) as store:
            rows = [{"id": i, "status": "new", "total": 0} for i in (1, 2, 3)]
            create_table(store, "orders_t", "id", "version", TABLE_COLUMNS, rows)
            table = store.table("orders_t")
            lease = store.acquire("orders/t", owner="w", ttl=60)
            pgconn = pgconn_of(store)
            plain, fenced, mixed = [], [], []
            for n in range(7):
                items = [(table.intent(k, "b"), {"total": n, "status": "s"}) for k in (1, 2, 3)]
                with traced(pgconn) as t:
                    outs = table.commit_many(items)
                assert [o.kind for o in outs] == ["committed"] * 3
                plain += t
                items = [(table.intent(k, "f"), {"total": n}) for k in (1, 2, 3)]
                with traced(pgconn) as t:
                    outs = table.commit_many(items, lease=lease)
                assert [o.kind for o in outs] == ["committed"] * 3
                fenced += t
                items = [
                    (table.intent(1, "m"), {"total": n}),
                    (table.intent(2, "m"), {"note": "x"}),
                ]
                with traced(pgconn) as t:
                    outs = table.commit_many(items)
                assert [o.kind for o in outs] == ["committed"] * 2
                mixed += t
        _each_once(plain)
        _each_once(fenced)
        _each_once(mixed, statements=3)  # the rows' lock, then one per item
    finally:
        cleanup(setup.url)


def test_a_table_batch_judges_each_item_on_its_own(pg: Setup, api: str) -> None:
    """One statement, one outcome per item in the caller's order: applied, duplicate,
    stale (version, and guard), missing and fenced side by side; each refused item
    reports the row as it is, and only the applied ones wrote."""
    with opened(pg.url, api) as store:
        rows = [{"id": i, "status": "new", "total": 0} for i in range(1, 7)]
        create_table(store, "orders_t", "id", "version", TABLE_COLUMNS, rows)
        table = store.table("orders_t")
        old = store.acquire("zombie", owner="z", ttl=60)
        store.acquire("fresh", owner="n", ttl=60).release()
        new = store.acquire("fresh", owner="n", ttl=60)
        dup = table.intent(2, "ship")
        assert table.commit(dup, {"status": "shipped", "total": 1}).committed
        stale = table.intent(3, "ship")
        assert table.commit(table.intent(3, "other"), {"status": "held", "total": 7}).committed
        guarded = table.intent(4, "ship", guard={"status": "packed"})
        assert table.commit(table.intent(5, "x"), {"total": 5}, lease=new).committed
        fenced = table.intent(5, "ship")
        gone = Intent.new("orders_t", 9, 1, "ship", kind="table")
        applied = table.intent(1, "ship")
        items = [
            (fenced, {"total": 10}),
            (applied, {"total": 11}),
            (stale, {"total": 12}),
            (gone, {"total": 13}),
            (dup, {"total": 14}),
            (guarded, {"total": 15}),
        ]
        outs = table.commit_many(items, lease=old)
        kinds = ["fenced", "committed", "stale", "missing", "duplicate", "stale"]
        assert [o.kind for o in outs] == kinds
        assert outs[0].reason is FenceReason.NEWER_OWNER
        assert outs[0].current.fence == new.token and outs[0].current.state["total"] == 5
        assert outs[1].record.version == 2 and outs[1].record.fence == old.token
        assert outs[1].record.state["total"] == 11 and outs[1].record.state["status"] == "new"
        assert outs[2].current.version == 2 and outs[2].current.state["status"] == "held"
        assert outs[4].record.version == 2 and outs[4].record.state["total"] == 1
        assert outs[5].current.version == 1 and outs[5].current.state["status"] == "new"
        assert [table.get(k).version for k in (1, 2, 3, 4, 5)] == [2, 2, 2, 1, 2]
        assert table.get(1).state["total"] == 11 and table.get(5).state["total"] == 5
        again = [  # the same shapes without a lease
            (table.intent(4, "ship", guard={"status": "new"}), {"total": 20}),
            (applied, {"total": 99}),  # applied above: a duplicate now
            (stale, {"total": 99}),
            (gone, {"total": 99}),
        ]
        outs = table.commit_many(again)
        assert [o.kind for o in outs] == ["committed", "duplicate", "stale", "missing"]
        assert table.get(4).state["total"] == 20 and table.get(1).state["total"] == 11
        # guard-only intents (a table without versions): only the claim tells a duplicate
        create_table(store, "plain_t", "id", None, TABLE_COLUMNS, rows)
        plain = store.table("plain_t", version=None)
        repeat = Intent.new("plain_t", 6, None, "g", guard={"status": "new"}, kind="table")
        assert plain.commit(repeat, {"total": 6}).committed
        other = Intent.new("plain_t", 3, None, "g", guard={"status": "new"}, kind="table")
        outs = plain.commit_many([(repeat, {"total": 60}), (other, {"total": 30})])
        assert [o.kind for o in outs] == ["duplicate", "committed"]
        assert plain.get(6).state["total"] == 6 and plain.get(3).state["total"] == 30


def test_a_table_batch_writes_what_single_commits_write(pg: Setup, api: str) -> None:
    """The batch statement reads its values as a single commit's parameters are read;
    a table with a jsonb column (where JSON text would read otherwise) and values
    beyond strings, integers and booleans take the per-item statements: the same rows
    as one commit at a time, in each case."""
    columns = {"doc": "JSONB", "amount": "NUMERIC", "label": "TEXT"}
    with opened(pg.url, api) as store:
        rows = [{"id": i} for i in (1, 2, 3, 4)]
        create_table(store, "docs_t", "id", "version", columns, rows)
        create_table(store, "nums_t", "id", "version", {"amount": "NUMERIC"}, rows)
        docs, nums = store.table("docs_t"), store.table("nums_t")
        for table, states in (
            (docs, [{"doc": '{"a": 1}', "label": 5}, {"doc": "[1, 2]", "label": True}]),
            (nums, [{"amount": 0.1 + 0.2}, {"amount": 7}]),
        ):
            for key, state in zip((1, 2), states, strict=True):
                assert table.commit(table.intent(key, "one"), state).committed
            items = [(table.intent(k, "many"), st) for k, st in zip((3, 4), states, strict=True)]
            assert [o.kind for o in table.commit_many(items)] == ["committed"] * 2
            assert [dict(table.get(k).state) for k in (3, 4)] == [
                dict(table.get(k).state) for k in (1, 2)
            ]


def test_a_table_batch_sees_a_row_changed_while_it_waited(pg: Setup, api: str) -> None:
    """Another session changes row 1 (version 1 -> 2) and holds it; the batch, whose
    snapshot still shows version 1, waits for that row. Once the other commits, every
    outcome the batch reports must hold at its own commit: its item decided against
    version 2 applies (not a refusal showing the row its snapshot saw), and the item
    decided against version 1 is stale against version 2; row 2 applies once."""
    with opened(pg.url, api) as store:
        rows = [{"id": i, "status": "new", "total": 0} for i in (1, 2, 3)]
        create_table(store, "orders_t", "id", "version", TABLE_COLUMNS, rows)
        table = store.table("orders_t")
        on_new = Intent.new("orders_t", 1, 2, "ship", kind="table")
        on_old = table.intent(3, "ship")
        items = [(on_new, {"total": 1}), (table.intent(2, "ship"), {"total": 2})]
        with session(pg.schema) as other:
            other.execute("BEGIN")
            other.execute("UPDATE orders_t SET version = 2, status = 'moved' WHERE id = 1")
            other.execute("UPDATE orders_t SET version = 2, status = 'moved' WHERE id = 3")
            pending = in_thread(table.commit_many, [*items, (on_old, {"total": 3})])
            lock_waiters(pg.app, 1)  # its snapshot is taken: it waits for row 1
            other.execute("COMMIT")
            outs = pending.result(timeout=WAIT)
        assert [o.kind for o in outs] == ["committed", "committed", "stale"]
        assert outs[0].record.version == 3 and outs[0].record.state["status"] == "moved"
        assert outs[2].current.version == 2 and outs[2].current.state["status"] == "moved"
        assert [table.get(k).version for k in (1, 2, 3)] == [3, 2, 2]


def test_a_batch_sees_rows_changed_or_made_while_it_waited(pg: Setup, api: str) -> None:
    """A record another session changed (version 1 -> 2), and a record another session
    created (its tombstone and row), each committed while the batch waited for its
    locks, are what the batch judges against: its items decided against them apply, and an
    item decided against the version before is stale against the new one."""
    with opened(pg.url, api) as store:
        orders = store.collection("orders")
        for key in ("k1", "k2", "k3"):
            orders.create(key, {"n": 0})
        on_new = Intent.new("orders", "k1", 2, "x")
        on_old = orders.intent("k3", "x")
        made = Intent.new("orders", "late", 1, "x")
        with session(pg.schema) as other:
            other.execute("BEGIN")
            for key in ("k1", "k3"):
                other.execute(
                    "UPDATE fencing_records SET version = 2, state = '{\"n\": 5}'"
                    " WHERE collection = 'orders' AND key = %s",
                    (key,),
                )
            items = [(on_new, {"n": 1}), (orders.intent("k2", "x"), {"n": 2}), (on_old, {"n": 3})]
            pending = in_thread(orders.commit_many, items)
            lock_waiters(pg.app, 1)
            other.execute("COMMIT")
            outs = pending.result(timeout=WAIT)
            assert [o.kind for o in outs] == ["committed", "committed", "stale"]
            assert outs[0].record.version == 3
            assert outs[2].current.version == 2 and outs[2].current.state["n"] == 5
            other.execute("BEGIN")
            other.execute(
                "INSERT INTO fencing_tombstones (collection, key, version)"
                " VALUES ('orders', 'late', 0)"
            )
            other.execute(
                "INSERT INTO fencing_records (collection, key, version, fence, state, updated_at)"
                " VALUES ('orders', 'late', 1, 0, '{\"n\": 7}', 0)"
            )
            pending = in_thread(
                orders.commit_many, [(made, {"n": 8}), (orders.intent("k2", "y"), {"n": 9})]
            )
            lock_waiters(pg.app, 1)
            other.execute("COMMIT")
            outs = pending.result(timeout=WAIT)
            assert [o.kind for o in outs] == ["committed", "committed"]
        assert orders.get("late").version == 2 and orders.get("late").state["n"] == 8
        assert [orders.get(k).version for k in ("k1", "k2", "k3")] == [3, 3, 2]


def test_a_batch_that_repeats_a_key_sees_its_earlier_items(pg: Setup, api: str) -> None:
    """A key twice in one batch: the later item sees the earlier one's write (the batch
    then runs as one pipeline of statements, in order, still one transaction)."""
    with opened(pg.url, api) as store:
        orders = store.collection("orders")
        orders.create("k", {"log": []})
        orders.create("other", {"log": []})
        first = orders.intent("k", "append")
        second = Intent.new("orders", "k", 2, "append")  # decided as if after the first
        late = Intent.new("orders", "k", 2, "append")  # decided against what first replaced
        outs = orders.commit_many(
            [
                (first, {"log": ["first"]}),
                (orders.intent("other", "append"), {"log": ["o"]}),
                (second, {"log": ["first", "second"]}),
                (late, {"log": ["first", "late"]}),
            ]
        )
        assert [o.kind for o in outs] == ["committed", "committed", "committed", "stale"]
        assert [outs[0].record.version, outs[2].record.version] == [2, 3]
        assert outs[3].current.version == 3
        assert outs[3].current.state["log"] == ["first", "second"]
        assert orders.get("k").state["log"] == ["first", "second"]


def test_a_batch_chosen_as_a_deadlock_victim_runs_again(pg: Setup, api: str) -> None:
    """Another session holds k2 and then asks for k1, which the batch holds while it
    waits for k2: the server rolls the batch back whole (the other session waits
    longer before it looks for deadlocks), and the batch runs again and applies."""
    with opened(pg.url, api) as store:
        orders = store.collection("orders")
        orders.create("k1", {"n": 0})
        orders.create("k2", {"n": 0})
        first = orders.intent("k1", "a")
        items = [
            (first, {"n": 1}),
            (orders.intent("k2", "b"), {"n": 1}),
            (Intent.new("orders", "k1", first.expected_version + 1, "c"), {"n": 2}),
        ]
        deadlocks = "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
        with session(pg.schema) as other:
            before = other.execute(deadlocks).fetchone()[0]
            other.execute("SET deadlock_timeout = '60s'")
            other.execute("BEGIN")
            other.execute("UPDATE fencing_records SET updated_at = 0 WHERE key = 'k2'")
            pending = in_thread(orders.commit_many, items)
            lock_waiters(pg.app, 1)  # the batch holds k1 and waits for k2
            other.execute("UPDATE fencing_records SET updated_at = 0 WHERE key = 'k1'")
            other.execute("ROLLBACK")
            outs = pending.result(timeout=WAIT)
            assert [o.kind for o in outs] == ["committed"] * 3
            deadline = time.monotonic() + WAIT
            while other.execute(deadlocks).fetchone()[0] == before:  # stats lag a little
                assert time.monotonic() < deadline, "no deadlock happened: nothing tested"
                time.sleep(0.05)
        assert orders.get("k1").version == 3 and orders.get("k2").version == 2


def test_two_batches_on_overlapping_keys_lose_nothing(pg: Setup) -> None:
    """Threads commit batches over overlapping keys, in opposite orders: every item is
    applied or refused on its own, and the history checker finds no anomaly."""
    from fencing.testing import MemoryHistory, Recorder, check_history

    keys = [f"k{i}" for i in range(8)]
    rounds = 15
    with opened(pg.url, "sync") as store:
        orders = store.collection("orders")
        for key in keys:
            orders.create(key, {"log": []})
        sink = MemoryHistory()

        def worker(name: str, mine: list[str]) -> Counter[str]:
            rec, kinds = Recorder(orders, sink, worker=name), Counter[str]()
            for r in range(rounds):
                items = []
                for key in mine:
                    record = orders.get(key)
                    entry = f"{name}-{r}"
                    items.append((record.intent("append"), {"log": [*record.state["log"], entry]}))
                kinds.update(o.kind for o in rec.commit_many(items))
            return kinds

        with ThreadPoolExecutor(3) as pool:
            futures = [
                pool.submit(worker, "w0", keys[:6]),
                pool.submit(worker, "w1", keys[2:][::-1]),
                pool.submit(worker, "w2", keys[1:7:2] + keys[0:7:2]),
            ]
            kinds = sum((f.result(timeout=240) for f in futures), Counter[str]())
        assert set(kinds) <= {"committed", "stale"}, kinds
        Recorder(orders, sink, worker="final").write_final(keys)
        report = check_history(sink.events)
        assert report.ok, report.summary()
        committed = 0
        for key in keys:
            record = orders.get(key)
            log = record.state["log"]
            assert record.version == 1 + len(log)  # every write is in the log, none lost
            assert len(log) == len(set(log))
            committed += len(log)
        assert committed == kinds["committed"] > 0


# -- (d) tokens, schema, configuration ----------------------------------------------------
def test_tokens_survive_closing_and_reopening(pg: Setup) -> None:
    tokens: list[int] = []
    for api in ("sync", "async", "sync"):
        with opened(pg.url, api) as store:
            with store.lease("jobs/x", owner="a", ttl=5) as lease:
                tokens.append(lease.token)
            tokens.append(store.acquire("jobs/x", owner="b", ttl=0.05).token)  # left to expire
            time.sleep(0.1)
            with store.lease("jobs/x", owner="c", ttl=5) as lease:  # takes over
                tokens.append(lease.token)
            assert store.prune(0) >= 0
    assert tokens == list(range(1, len(tokens) + 1))
    with session(pg.schema) as conn:
        assert conn.execute("SELECT token FROM fencing_leases").fetchall() == [(len(tokens),)]


def test_migrate_is_idempotent_and_refuses_a_newer_schema(pg: Setup) -> None:
    with opened(pg.url, "sync") as store:
        store.collection("c").create("k", {"n": 1})
        store.migrate()
        store.migrate()
        assert store.collection("c").get("k").state == {"n": 1}
    with session(pg.schema) as conn:
        conn.execute("UPDATE fencing_schema SET version = 99")
    for api in ("sync", "async"):
        with pytest.raises(fencing.SchemaError, match="newer"), opened(pg.url, api):
            pass


def test_without_migrate_fencing_tables_are_a_schema_error(pg: Setup) -> None:
    with opened(pg.url, "sync", migrate=False) as store:
        with pytest.raises(fencing.SchemaError, match="migrate"):
            store.collection("c").get("k")
        store.migrate()
        assert store.collection("c").get("k") is None


def test_schemas_keep_stores_apart(pg: Setup) -> None:
    other = new_setup()
    try:
        with opened(pg.url, "sync") as a, opened(other.url, "async") as b:
            a.collection("c").create("k", {"in": "a"})
            assert b.collection("c").get("k") is None
            b.collection("c").create("k", {"in": "b"})
            assert a.collection("c").get("k").state["in"] == "a"
            with a.lease("l", owner="x", ttl=5) as la, b.lease("l", owner="y", ttl=5) as lb:
                assert la.token == lb.token == 1
    finally:
        cleanup(other.url)


def test_a_guarded_key_column_must_be_unique(pg: Setup) -> None:
    with opened(pg.url, "sync") as store:
        create_table(store, "orders_t", "id", "version", TABLE_COLUMNS, [{"id": 1}])
        with pytest.raises(fencing.SchemaError, match="unique"):
            store.table("orders_t", key="status").get("x")
        with pytest.raises(fencing.SchemaError, match="does not exist"):
            store.table("nope_t").get(1)


def test_json_state_round_trips(pg: Setup, api: str) -> None:
    state = {"s": 'é ✓ "q" \\', "n": [1, 2.5, None, True, False], "o": {"x": {}}, "big": 2**62}
    with opened(pg.url, api) as store:
        orders = store.collection("orders")
        assert dict(orders.create("o-1", state).state) == state
        assert dict(orders.get("o-1").state) == state
        intent = orders.intent("o-1", "x", guard={"big": 2**62, "s": state["s"]})
        assert orders.commit(intent, {**state, "n": []}).committed
        assert orders.get("o-1").state["n"] == []
        refused = orders.commit(orders.intent("o-1", "y", guard={"o": None}), {})
        assert isinstance(refused, Stale)
        # true is not 1
        orders.create("o-2", {"flag": 1})
        assert isinstance(orders.commit(orders.intent("o-2", "z", guard={"flag": True}), {}), Stale)
        assert orders.commit(orders.intent("o-2", "z", guard={"flag": 1.0}), {}).committed


@pytest.mark.parametrize(
    ("query", "problem"),
    [
        ("min_size=x", "number"),
        ("min_size=3&max_size=2", "below"),
        ("schema=no-dash", "schema"),
        ("bogus_option=1", "bogus_option"),
        ("max_size=0", "at least"),
    ],
)
def test_bad_options_are_configuration_errors(query: str, problem: str) -> None:
    with pytest.raises(fencing.ConfigurationError, match=problem):
        fencing.open(f"postgresql://root@127.0.0.1:5432/test?{query}")


def test_unreachable_server_is_transient() -> None:
    with pytest.raises(fencing.TransientStoreError, match="cannot connect"):
        fencing.open("postgresql://root@127.0.0.1:1/test?connect_timeout=2")


def test_missing_driver_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)
    monkeypatch.delitem(sys.modules, "fencing.backends.postgres")
    with pytest.raises(fencing.MissingDependency, match=r"fencing\[postgres\]"):
        fencing.open("postgresql://root@127.0.0.1:5432/test")
    with pytest.raises(fencing.MissingDependency, match=r"fencing\[postgres\]"):
        asyncio.run(fencing.open_async("postgres://root@127.0.0.1:5432/test"))


def test_a_forked_child_opens_its_own_connections(pg: Setup) -> None:
    """RQ and Celery's prefork pool fork a process that already opened the store: the
    child must not talk over its parent's sockets."""
    with opened(pg.url, "sync") as store:
        orders = store.collection("orders")
        orders.create("o-1", {"n": 0})
        inherited = store.backend.pool
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads
            pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 3
            try:
                out = orders.commit(orders.intent("o-1", "child"), {"n": 1})
                own = store.backend.pool is not inherited  # its own pool, its own sockets
                code = 2 if not out.committed else 0 if own else 4
            finally:
                os._exit(code)
        deadline = time.monotonic() + WAIT
        while (done := os.waitpid(pid, os.WNOHANG)) == (0, 0) and time.monotonic() < deadline:
            time.sleep(0.01)
        if done == (0, 0):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung")
        assert os.waitstatus_to_exitcode(done[1]) == 0
        assert orders.get("o-1").state == {"n": 1}  # the parent's connection still works
        assert orders.commit(orders.intent("o-1", "parent"), {"n": 2}).committed
