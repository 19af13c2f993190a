"""A store's lifetime. Closed means closed: after ``close()`` every call on the store,
its collections, tables and leases raises ``StoreClosed``, on every backend, sync and
async; ``close()`` itself stays idempotent. An async store belongs to the event loop
that opened it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

import fencing


def test_every_call_after_close_raises_store_closed(store: Any) -> None:
    orders = store.collection("orders")
    rec = orders.create("o-1", {"status": "new"})
    intent = rec.intent("ship")
    effect = orders.effect(intent, "charge")
    lease = store.acquire("orders/o-1", owner="A", ttl=30)
    store.close()
    store.close()  # idempotent
    assert "closed" in repr(store)

    calls: dict[str, Callable[[], Any]] = {
        "collection": lambda: store.collection("orders"),
        "table": lambda: store.table("orders_t"),
        "lease": lambda: store.lease("orders/o-2", owner="A", ttl=30),
        "acquire": lambda: store.acquire("orders/o-2", owner="A", ttl=30),
        "try_acquire": lambda: store.try_acquire("orders/o-2", owner="A", ttl=30),
        "migrate": store.migrate,
        "prune": store.prune,
        "effects_to_reconcile": store.effects_to_reconcile,
        "pending_effects": store.pending_effects,
        "get_effect": lambda: store.get_effect(effect.idempotency_key),
        "mark_reconciled": lambda: store.mark_reconciled(effect),
        "create": lambda: orders.create("o-2", {"status": "new"}),
        "get": lambda: orders.get("o-1"),
        "delete": lambda: orders.delete("o-1"),
        "intent": lambda: orders.intent("o-1", "ship"),
        "commit": lambda: orders.commit(intent, {"status": "shipped"}),
        "commit_many": lambda: orders.commit_many([(intent, {"status": "shipped"})]),
        "apply": lambda: orders.apply(intent, lambda r: {"status": "shipped"}),
        "effect": lambda: orders.effect(intent, "email"),
        "effect_done": lambda: orders.effect_done(effect),
        "effect_failed": lambda: orders.effect_failed(effect),
        "effects": lambda: orders.effects(intent),
        "abandon": lambda: orders.abandon(intent),
        "renew": lease.renew,
        "release": lease.release,
    }
    worked, said = [], []
    for name, call in calls.items():
        try:
            call()
        except fencing.StoreClosed as exc:
            said.append(str(exc))
        else:
            worked.append(name)
    assert worked == [], "these worked on a closed store"
    assert all("closed" in text for text in said)


def test_an_async_store_belongs_to_the_loop_that_opened_it(store_url: str) -> None:
    first = asyncio.new_event_loop()
    try:
        store = first.run_until_complete(fencing.open_async(store_url))
        orders = store.collection("orders")  # a factory: no loop needed
        first.run_until_complete(orders.create("o-1", {"status": "new"}))

        async def elsewhere() -> Any:
            return await orders.get("o-1")

        with pytest.raises(fencing.WrongEventLoop, match="event loop that opened it"):
            asyncio.run(elsewhere())
        with pytest.raises(fencing.WrongEventLoop):
            asyncio.run(store.migrate())
        # still fine on its own loop
        rec = first.run_until_complete(orders.get("o-1"))
        assert rec is not None and rec.version == 1
        first.run_until_complete(store.close())
    finally:
        first.close()
