"""Recorded effects on a real PostgreSQL server: what the contract suite cannot show.

``tests/test_effects.py`` already runs every effect test on this backend, sync and
async. Here: a store made before effects gains them on migrate; spawned processes
recording one effect at once make one row; the races READ COMMITTED decides (forced
deterministically by holding a row lock from another session); the stored columns;
and one statement, one round trip per operation (libpq's protocol trace).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pytest

import fencing
from fencing import Stale
from fencing._effects import dump_detail, effect_key

from ._syncify import Syncified
from .backends_postgres import Setup, Traffic, admin, cleanup, new_setup, opened, pgconn_of, traced

psycopg = pytest.importorskip("psycopg")

SPAWN = multiprocessing.get_context("spawn")
WAIT = 30.0  # seconds any single blocked step may take before the test fails


def backend_of(store: Any) -> Any:
    """The store's backend, its async methods made to look sync."""
    if isinstance(store, Syncified):
        return Syncified(store.unwrapped.backend, store._loop)
    return store.backend


@contextmanager
def session(schema: str) -> Iterator[Any]:
    """An autocommit connection of our own, the test's schema first on its search path."""
    from psycopg import sql

    with admin() as conn:
        conn.execute(sql.SQL("SET search_path TO {}, public").format(sql.Identifier(schema)))
        yield conn


def wait_for_lock_waiter(app: str) -> None:
    """Wait until one of the store's connections waits for a lock."""
    deadline = time.monotonic() + WAIT
    with admin() as conn:
        while not conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
            " AND wait_event_type = 'Lock'",
            [app],
        ).fetchone()[0]:
            assert time.monotonic() < deadline, "the store's statement never blocked"
            time.sleep(0.01)


def in_thread(fn: Any, *args: Any, **kwargs: Any) -> Future[Any]:
    pool = ThreadPoolExecutor(1)
    future = pool.submit(fn, *args, **kwargs)
    pool.shutdown(wait=False)
    return future


def _row(conn: Any, key: str) -> tuple[Any, ...]:
    found = conn.execute(
        "SELECT scope, record_key, intent_id, transition, name, status, detail, outcome,"
        " reconciled_at, recorded_at, updated_at FROM fencing_effects"
        " WHERE idempotency_key = %s",
        [key],
    ).fetchall()
    assert len(found) == 1, found
    return tuple(found[0])


# -- migration -------------------------------------------------------------------------
def test_a_store_from_before_effects_gains_them_on_migrate(pg: Setup, api: str) -> None:
    from fencing.backends.postgres.schema import SCHEMA_VERSION

    assert SCHEMA_VERSION == 6
    with opened(pg.url, api) as old:
        orders = old.collection("orders")
        orders.create("o-1", {"status": "new"})
        # what the previous release made: no effects table, schema version 1
        with session(pg.schema) as conn:
            conn.execute("DROP TABLE fencing_effects")
            conn.execute("UPDATE fencing_schema SET version = 1 WHERE component = 'core'")
        intent = orders.intent("o-1", "charge")
        with pytest.raises(fencing.SchemaError, match="migrate"):
            orders.effect(intent, "charge")
        with pytest.raises(fencing.SchemaError, match="migrate"):
            old.effects_to_reconcile()

    with opened(pg.url, api) as store:  # opening migrates
        store.migrate()  # and again: nothing to do
        with session(pg.schema) as conn:
            (version,) = conn.execute("SELECT version FROM fencing_schema").fetchone()
            indexes = conn.execute(
                "SELECT indexname FROM pg_indexes WHERE schemaname = %s"
                " AND tablename = 'fencing_effects' ORDER BY indexname",
                [pg.schema],
            ).fetchall()
        assert version == SCHEMA_VERSION
        assert [i for (i,) in indexes] == [
            "fencing_effects_intent",
            "fencing_effects_open",
            "fencing_effects_pkey",
        ]
        orders = store.collection("orders")
        assert orders.get("o-1").state == {"status": "new"}  # the old data is kept
        fx = orders.effect(intent, "charge", detail={"amount": 10})
        assert fx.status == "pending" and orders.effects(intent) == [fx]
        assert orders.commit(orders.intent("o-1", "cancel"), {"status": "cancelled"}).committed
        assert isinstance(orders.commit(intent, {"status": "charged"}), Stale)
        (settled,) = store.effects_to_reconcile()
        assert (settled.idempotency_key, settled.outcome) == (fx.idempotency_key, "stale")
        assert store.mark_reconciled(settled).reconciled
        assert store.effects_to_reconcile() == []


# -- processes ---------------------------------------------------------------------------
def record_main(url: str, api: str, intent_json: str, go: Any, out: Any) -> None:
    """A spawned process: open its own store, report ready, wait for go, record."""
    try:
        intent = fencing.Intent.from_json(intent_json)
        if api == "sync":
            store = fencing.open(url)
            out.put(("ready", None))
            go.wait(WAIT)
            fx = store.collection("orders").effect(intent, "charge", detail={"by": api})
            store.close()
        else:

            async def main() -> Any:
                store = await fencing.open_async(url)
                out.put(("ready", None))
                await asyncio.to_thread(go.wait, WAIT)
                fx = await store.collection("orders").effect(intent, "charge", detail={"by": api})
                await store.close()
                return fx

            fx = asyncio.run(main())
        out.put(("done", (fx.idempotency_key, fx.recorded_at, fx.updated_at, fx.detail)))
    except BaseException as exc:
        out.put(("error", repr(exc)))
        raise


def test_processes_recording_the_same_effect_make_one_row(pg: Setup) -> None:
    with opened(pg.url, "sync") as store:
        orders = store.collection("orders")
        orders.create("o-1", {"status": "new"})
        intent = orders.intent("o-1", "charge")
    go, out = SPAWN.Event(), SPAWN.Queue()
    procs = [
        SPAWN.Process(
            target=record_main,
            args=(pg.url, ("sync", "async")[i % 2], intent.to_json(), go, out),
            daemon=True,
        )
        for i in range(4)
    ]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            kind, detail = out.get(timeout=120)
            assert kind == "ready", detail
        go.set()
        answers = []
        for _ in procs:
            kind, detail = out.get(timeout=120)
            assert kind == "done", detail
            answers.append(detail)
    finally:
        for p in procs:
            p.join(timeout=WAIT)
            if p.is_alive():
                p.kill()
    assert [p.exitcode for p in procs] == [0] * 4
    # exactly one recording won: every process got its row, the same recorded_at
    assert all(a == answers[0] for a in answers), answers
    key, recorded_at, updated_at, detail = answers[0]
    assert key == effect_key("c:orders", intent.root_id, "charge")
    assert recorded_at == updated_at and detail in ({"by": "sync"}, {"by": "async"})
    with session(pg.schema) as conn:
        rows = conn.execute("SELECT idempotency_key, recorded_at FROM fencing_effects").fetchall()
    assert rows == [(key, recorded_at)]


# -- races READ COMMITTED decides ---------------------------------------------------------
def test_recording_waits_for_a_concurrent_first_recording(api: str) -> None:
    """Another transaction inserted the same key and has not committed: the store's
    insert waits, finds it, and answers that row (its snapshot could not see it: the
    statement runs again)."""
    setup = new_setup(max_size="2")
    try:
        with opened(setup.url, api) as store:
            orders = store.collection("orders")
            orders.create("o-1", {"status": "new"})
            intent = orders.intent("o-1", "charge")
            key = effect_key("c:orders", intent.root_id, "charge")
            with session(setup.schema) as conn, conn.transaction():
                conn.execute(
                    "INSERT INTO fencing_effects (idempotency_key, scope, record_key, intent_id,"
                    " transition, name, status, detail, recorded_at, updated_at)"
                    " VALUES (%s, 'c:orders', '\"o-1\"', %s, 'charge', 'charge', 'done',"
                    " '\"first\"', 1000.5, 1000.5)",
                    [key, intent.root_id],
                )
                pending = in_thread(orders.effect, intent, "charge", detail="second")
                wait_for_lock_waiter(setup.app)
                assert not pending.done()
            fx = pending.result(timeout=WAIT)
            assert (fx.idempotency_key, fx.status, fx.detail) == (key, "done", "first")
            assert fx.recorded_at == fx.updated_at == 1000.5
            assert orders.effects(intent) == [fx]
    finally:
        cleanup(setup.url)


def test_settling_waits_for_a_concurrent_settle(api: str) -> None:
    """An effect settled by another, uncommitted transaction keeps that outcome; the
    intent's other effects get this one; the answer shows both as stored."""
    setup = new_setup(max_size="2")
    try:
        with opened(setup.url, api) as store:
            orders = store.collection("orders")
            orders.create("o-1", {"status": "new"})
            intent = orders.intent("o-1", "charge")
            charge = orders.effect(intent, "charge")
            email = orders.effect(intent, "email")
            backend = backend_of(store)
            with session(setup.schema) as conn, conn.transaction():
                conn.execute(
                    "UPDATE fencing_effects SET outcome = 'fenced', status = 'done'"
                    " WHERE idempotency_key = %s",
                    [charge.idempotency_key],
                )
                pending = in_thread(backend.settle_effects, "c:orders", intent.root_id, "stale")
                wait_for_lock_waiter(setup.app)
                assert not pending.done()
            settled = pending.result(timeout=WAIT)
            got = {e.name: (e.outcome, e.status) for e in settled}
            assert got == {"charge": ("fenced", "done"), "email": ("stale", "pending")}
            assert [e.idempotency_key for e in settled] == [
                charge.idempotency_key,
                email.idempotency_key,
            ]
            assert [e.recorded_at for e in settled] == sorted(e.recorded_at for e in settled)
            # settling again changes nothing and answers the same
            assert backend.settle_effects("c:orders", intent.root_id, "missing") == settled
            listed = {e.name: e.outcome for e in store.effects_to_reconcile()}
            assert listed == {"charge": "fenced", "email": "stale"}
    finally:
        cleanup(setup.url)


def test_marking_waits_for_a_concurrent_mark(pg: Setup, api: str) -> None:
    """A concurrent, uncommitted reconcile: this one waits, keeps its reconciled_at
    (the first reconcile's), and sets its own status on the newest row."""
    with opened(pg.url, api) as store:
        orders = store.collection("orders")
        orders.create("o-1", {"status": "new"})
        fx = orders.effect(orders.intent("o-1", "charge"), "charge")
        backend = backend_of(store)
        with session(pg.schema) as conn, conn.transaction():
            conn.execute(
                "UPDATE fencing_effects SET reconciled_at = 7.25, detail = '{\"ref\":1}'"
                " WHERE idempotency_key = %s",
                [fx.idempotency_key],
            )
            pending = in_thread(backend.mark_effect, fx.idempotency_key, "done", None, True)
            wait_for_lock_waiter(pg.app)
            assert not pending.done()
        marked = pending.result(timeout=WAIT)
        assert (marked.status, marked.detail, marked.reconciled) == ("done", {"ref": 1}, True)
        with session(pg.schema) as conn:
            assert _row(conn, fx.idempotency_key)[8] == 7.25
        assert (
            backend.mark_effect(effect_key("c:orders", "nobody", "x"), "done", None, True) is None
        )


# -- the stored row ------------------------------------------------------------------------
def test_the_stored_row_is_the_given_text_and_the_server_clock(pg: Setup, api: str) -> None:
    with opened(pg.url, api) as store:
        orders = store.collection("orders")
        orders.create("7", {"n": 0})
        detail = {"b": "é ☃", "a": [1, 2.5, None], "z": {"nul": "a\x00b"}}  # jsonb cannot
        fx = orders.effect(orders.intent("7", "charge"), "charge", detail=detail)
        with session(pg.schema) as conn:
            (now,) = conn.execute("SELECT extract(epoch FROM now())::float8").fetchone()
            row = _row(conn, fx.idempotency_key)
        assert row[:8] == (
            "c:orders",
            '"7"',
            fx.intent_id,
            "charge",
            "charge",
            "pending",
            dump_detail(detail),
            None,
        )
        assert row[8] is None and row[9] == row[10] == fx.recorded_at <= now
        assert fx.detail == detail and fx.key == "7"

        done = orders.effect_done(fx, detail=[1, "x"])
        assert done.updated_at >= done.recorded_at == fx.recorded_at
        assert store.mark_reconciled(done).reconciled
        with session(pg.schema) as conn:
            first = _row(conn, fx.idempotency_key)
        assert (first[5], json.loads(first[6])) == ("done", [1, "x"])
        assert first[8] is not None and first[8] >= done.updated_at and first[10] == first[8]
        assert store.mark_reconciled(done).reconciled  # idempotent: the first time stays
        with session(pg.schema) as conn:
            row = _row(conn, fx.idempotency_key)
        assert row[:9] == first[:9] and row[10] >= first[10]


# -- one statement, one round trip ---------------------------------------------------------
def test_each_effect_operation_is_one_statement_and_one_round_trip(api: str) -> None:
    setup = new_setup(min_size="1", max_size="1")
    try:
        with opened(setup.url, api) as store:
            orders = store.collection("orders")
            pgconn = pgconn_of(store)
            calls: dict[str, list[Traffic]] = {}

            def call(kind: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
                with traced(pgconn) as t:
                    result = fn(*args, **kwargs)
                calls.setdefault(kind, []).extend(t)
                return result

            for n in range(8):
                orders.create(f"o-{n}", {"n": 0})
                late = orders.intent(f"o-{n}", "charge")
                fx = call("record", orders.effect, late, "charge", detail={"n": n})
                again = call("record again", orders.effect, late, "charge")
                assert again == fx
                call("mark", orders.effect_done, fx, detail={"ref": n})
                call("list intent", orders.effects, late)
                orders.commit(orders.intent(f"o-{n}", "cancel"), {"n": 1})
                with traced(pgconn) as t:  # the commit, then the settle
                    assert isinstance(orders.commit(late, {"n": 2}), Stale)
                assert t[0].statements == 2, t
                call("list open", store.effects_to_reconcile)
                call("get", store.get_effect, fx.idempotency_key)
                call("reconcile", store.mark_reconciled, fx.idempotency_key)
            backend = backend_of(store)
            for n in range(8):
                late = orders.intent(f"o-{n}", "charge")
                call("settle", backend.settle_effects, "c:orders", late.root_id, "stale")
        assert set(calls) == {
            "record",
            "record again",
            "mark",
            "list intent",
            "list open",
            "get",
            "reconcile",
            "settle",
        }
        for kind, traffic in calls.items():
            # one statement, one round trip; once, psycopg prepares it (threshold 5)
            assert [t.statements for t in traffic] == [1] * len(traffic), (kind, traffic)
            assert all(t.round_trips == 1 + t.prepares for t in traffic), (kind, traffic)
            assert sum(1 for t in traffic if t.prepares) <= 1, (kind, traffic)
    finally:
        cleanup(setup.url)


def test_concurrent_threads_record_and_settle_consistently(pg: Setup) -> None:
    """Threads record the same effects and settle the same intent at once: one row
    each, every answer shows every effect settled, all with one outcome each."""
    with opened(pg.url, "sync") as store:
        orders = store.collection("orders")
        orders.create("o-1", {"status": "new"})
        intent = orders.intent("o-1", "charge")
        backend = store.backend
        barrier = threading.Barrier(4)
        names = ("charge", "email", "label")

        def work(i: int) -> list[Any]:
            barrier.wait(WAIT)
            for name in names:
                orders.effect(intent, name, detail=i)
            return backend.settle_effects("c:orders", intent.root_id, ("stale", "missing")[i % 2])

        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(work, range(4)))
        final = orders.effects(intent)
        assert len(final) == 3 and all(e.outcome in ("stale", "missing") for e in final)
        for settled in answers:
            assert settled == final  # every answer: all of them, as they are now
