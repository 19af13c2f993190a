"""The effects of a refused commit made through ``store.using(conn)`` are the store's.

A commit through the view that ends ``Stale``, ``Missing``, ``Fenced`` or ``Contended``
settles the intent's recorded effects on the store's own connections, not in the
caller's transaction: the caller's usual reaction to a refusal is to roll back, and a
charged card must still be listed for reconciliation. A ``Reconcile`` handler gets them,
and may mark them reconciled on the store (PostgreSQL, MySQL) without waiting on the
caller's own transaction. SQLite's write lock is one per file: while the caller's
transaction holds it, the settlement is written as soon as it is free (when the caller
commits or rolls back). Every SQL store, sync and async.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import pytest

import fencing
from fencing import Effect, Intent, Missing, Reconcile, Record, Stale

from .test_using import ASYNC, AUDIT, TABLE, Env, env, one, sql

pytestmark = pytest.mark.backends(only=lambda name: name in {"postgresql", "mysql", "sqlite-file"})
__all__ = ["env"]  # the fixture, shared with tests/test_using.py

DEADLINE = 10.0  # a bound on waiting for SQLite's settlement, never a timing assertion


def settled(store: Any, key: str) -> Effect:
    """The effect ``key`` once settled (SQLite's settler writes it when its write lock is
    free: poll until then, at most ``DEADLINE``)."""
    end = time.monotonic() + DEADLINE
    while True:
        found = store.get_effect(key)
        assert found is not None
        if found.outcome is not None or time.monotonic() > end:
            return found
        time.sleep(0.01)


def _moved_on(env: Env, key: int = 1) -> Intent:
    """An intent on row ``key``, made stale by the store itself, with a recorded effect."""
    old = env.table.intent(key, "charge")
    assert env.table.commit(env.table.intent(key, "cancel"), {"status": "cancelled"}).committed
    return old


@pytest.mark.parametrize("mode", ["after-a-write", "no-write", "autocommit"])
def test_a_refused_commit_stays_settled_when_the_caller_rolls_back(env: Env, mode: str) -> None:
    old = _moved_on(env)
    effect = env.table.effect(old, "charge-card", detail={"amount": 10})
    conn = env.lender.connect_autocommit(env.url) if mode == "autocommit" else env.conn
    try:
        if mode == "after-a-write":
            env.audit("charging")  # (SQLite: the caller's transaction holds the write lock)
        out = env.view(conn).commit(old, {"status": "charged"})
        assert isinstance(out, Stale)
        if env.backend != "sqlite-file" or mode == "autocommit":  # at once, on the store's
            assert env.store.get_effect(effect.idempotency_key).outcome == "stale"
        conn.rollback()  # the caller's reaction to the refusal
    finally:
        if conn is not env.conn:
            conn.close()
    found = settled(env.store, effect.idempotency_key)
    assert (found.outcome, found.reconciled) == ("stale", False)
    listed = env.store.effects_to_reconcile()
    assert [e.idempotency_key for e in listed] == [effect.idempotency_key]
    assert env.table.get(1).state["status"] == "cancelled"


def test_missing_and_batches_are_settled_too(env: Env) -> None:
    carts = env.store.collection("carts")
    gone = carts.create("c-1", {"n": 1})
    intent = gone.intent("fill")
    effect = carts.effect(intent, "reserve")
    assert carts.delete("c-1")
    old = _moved_on(env, 2)
    other = env.table.effect(old, "email")
    env.audit("batch")
    view = env.store.using(env.conn)
    assert isinstance(view.collection("carts").commit(intent, {"n": 2}), Missing)
    outs = view.table(TABLE).commit_many([(old, {"status": "x"})])
    assert isinstance(outs[0], Stale)
    env.conn.rollback()
    assert settled(env.store, effect.idempotency_key).outcome == "missing"
    assert settled(env.store, other.idempotency_key).outcome == "stale"


@pytest.mark.timeout(30)
def test_a_reconcile_handler_marks_them_on_the_store(env: Env) -> None:
    """The handler gets the effects, settled; it marks them reconciled on the store
    itself, which does not wait for the caller's transaction (PostgreSQL deadlocked on
    its own row locks; MySQL waited innodb_lock_wait_timeout). SQLite: its one write
    lock is the caller's until it ends, so the handler marks them after it."""
    old = _moved_on(env)
    effect = env.table.effect(old, "charge-card")
    seen: list[tuple[Intent, Record, Sequence[Effect]]] = []
    sqlite = env.backend == "sqlite-file"

    def handler(intent: Intent, current: Record, effects: Sequence[Effect]) -> None:
        seen.append((intent, current, effects))
        if not sqlite:
            for found in effects:
                assert env.store.mark_reconciled(found).reconciled

    env.audit("charging")
    out = env.view().apply(old, lambda r: {"status": "charged"}, on_stale=Reconcile(handler))
    assert isinstance(out, Stale)
    ((intent, current, effects),) = seen
    assert intent.id == old.id and current.version == old.expected_version + 1
    assert [(e.idempotency_key, e.outcome) for e in effects] == [(effect.idempotency_key, "stale")]
    env.conn.rollback()
    if sqlite:
        assert settled(env.store, effect.idempotency_key).outcome == "stale"
        env.store.mark_reconciled(effect)
    found = env.store.get_effect(effect.idempotency_key)
    assert found is not None and (found.outcome, found.reconciled) == ("stale", True)
    assert env.store.effects_to_reconcile() == []


def test_the_views_effects_are_read_on_the_store(env: Env) -> None:
    """An effect recorded (on the store's own connection) after the caller's transaction
    took its snapshot is listed through the view."""
    if env.backend == "postgresql":
        sql(env.conn, "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    elif env.backend == "sqlite-file":
        sql(env.conn, "BEGIN")
    assert one(env.conn, f"SELECT COUNT(*) FROM {AUDIT}")[0] == 0  # the snapshot
    view = env.view()
    intent = env.table.intent(1, "charge")
    effect = view.effect(intent, "charge-card")
    assert [e.idempotency_key for e in view.effects(intent)] == [effect.idempotency_key]
    assert env.store.using(env.conn).get_effect(effect.idempotency_key) is not None


# -- asyncio ----------------------------------------------------------------------------
async def _audit(conn: Any, note: str) -> None:
    text = f"INSERT INTO {AUDIT} (note) VALUES ('{note}')"
    if type(conn).__module__.split(".")[0] == "aiomysql":
        async with conn.cursor() as cur:
            await cur.execute(text)
        return
    cursor = await conn.execute(text)
    if type(conn).__module__.split(".")[0] == "aiosqlite":
        await cursor.close()


async def _asettled(store: Any, key: str) -> Effect:
    end = time.monotonic() + DEADLINE
    while True:
        found = await store.get_effect(key)
        assert found is not None
        if found.outcome is not None or time.monotonic() > end:
            return found
        await asyncio.sleep(0.01)


@ASYNC
@pytest.mark.timeout(30)
def test_async_refused_commits_and_reconcile(env: Env) -> None:
    aconnect = env.lender.aconnect
    assert aconnect is not None
    sqlite = env.backend == "sqlite-file"

    async def main() -> None:
        store = await fencing.open_async(env.url)
        conn = await aconnect(env.url)
        table = store.table(TABLE)
        try:
            old = await table.intent(1, "charge")
            assert (await table.commit(await table.intent(1, "x"), {"status": "x"})).committed
            charge = await table.effect(old, "charge-card")
            await _audit(conn, "charging")
            view = store.using(conn).table(TABLE)
            assert isinstance(await view.commit(old, {"status": "charged"}), Stale)
            await conn.rollback()
            found = await _asettled(store, charge.idempotency_key)
            assert (found.outcome, found.reconciled) == ("stale", False)

            late = await table.intent(2, "charge")
            assert (await table.commit(await table.intent(2, "x"), {"status": "x"})).committed
            email = await table.effect(late, "email")
            got: list[Sequence[Effect]] = []

            async def handler(intent: Intent, current: Record, effects: Sequence[Effect]) -> None:
                got.append(effects)
                if not sqlite:
                    for effect in effects:
                        await store.mark_reconciled(effect)

            await _audit(conn, "emailing")
            out = await view.apply(late, lambda r: {"status": "y"}, on_stale=Reconcile(handler))
            assert isinstance(out, Stale)
            assert [[(e.name, e.outcome) for e in effects] for effects in got] == [
                [("email", "stale")]
            ]
            await conn.rollback()
            if sqlite:
                await _asettled(store, email.idempotency_key)
                await store.mark_reconciled(email)
            listed = await store.effects_to_reconcile()
            assert [e.idempotency_key for e in listed] == [charge.idempotency_key]
        finally:
            closing = conn.close()
            if asyncio.iscoroutine(closing):
                await closing
            await store.close()

    asyncio.run(main())


@pytest.mark.backends(only=lambda name: name == "sqlite-file")
def test_sqlite_closing_while_the_lock_is_held_waits_busy_timeout(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    """A settlement still waiting for the caller's write lock when the store closes: the
    close waits ``busy_timeout`` for it, then says so; the effect stays pending (listed
    by ``pending_effects``), never lost silently, never a hang."""
    store = fencing.open(env.url + "?busy_timeout=0.2")
    try:
        table = store.table(TABLE)
        old = table.intent(1, "charge")
        assert table.commit(table.intent(1, "cancel"), {"status": "cancelled"}).committed
        effect = table.effect(old, "charge-card")
        env.audit("charging")  # the caller's transaction holds the write lock
        assert isinstance(store.using(env.conn).table(TABLE).commit(old, {"status": "x"}), Stale)
    finally:
        started = time.monotonic()
        store.close()
        waited = time.monotonic() - started
    assert waited < DEADLINE  # bounded by busy_timeout (plus one try in flight)
    assert "could not be written before the store closed" in caplog.text
    env.conn.rollback()
    found = env.store.get_effect(effect.idempotency_key)
    assert found is not None and found.outcome is None  # pending: pending_effects() has it
    assert [e.idempotency_key for e in env.store.pending_effects(older_than=0)] == [
        effect.idempotency_key
    ]
