"""A refused commit settles its intent's effects without a call of its own when the store
can tell, in the refusal itself, that there is nothing to settle (issue 21:
``CommitResult.unsettled``). SQLite, PostgreSQL and MySQL/MariaDB look, in the same
transaction and round trip; Redis and the memory store answer "maybe" and the store asks
to settle as before (on a Redis cluster the effects are in other hash slots than the
record a commit's script may touch).

On every store: what is recorded is settled as before (``Stale`` and ``Contended`` of
``commit``, ``commit_many`` and ``apply``); on the stores that look, a refusal with no
effect to settle makes no settling call at all."""

from __future__ import annotations

from typing import Any

import pytest

from fencing import Committed, Contended, Recompute, Stale

LOOKS = {"sqlite-memory", "sqlite-file", "postgresql", "mysql"}


class Counted:
    """The store's backend, its ``settle_effects`` calls counted."""

    def __init__(self, store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        backend = store.unwrapped.backend if hasattr(store, "unwrapped") else store.backend
        real = backend.settle_effects

        def counting(*args: Any) -> Any:
            self.calls += 1
            return real(*args)

        monkeypatch.setattr(backend, "settle_effects", counting)

    def taken(self) -> int:
        calls, self.calls = self.calls, 0
        return calls


def test_a_stale_commit_settles_only_what_needs_it(
    store: Any, backend_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    orders = store.collection("orders")
    orders.create("o-1", {"n": 0})
    plain, charged = orders.intent("o-1", "plain"), orders.intent("o-1", "charge")
    fx = orders.effect(charged, "charge")
    assert isinstance(orders.commit(orders.intent("o-1", "first"), {"n": 1}), Committed)
    counted = Counted(store, monkeypatch)

    assert isinstance(orders.commit(plain, {"n": 2}), Stale)
    assert counted.taken() == (0 if backend_name in LOOKS else 1)
    assert orders.effects(plain) == []

    assert isinstance(orders.commit(charged, {"n": 2}), Stale)
    assert counted.taken() == 1
    (settled,) = orders.effects(charged)
    assert (settled.idempotency_key, settled.outcome) == (fx.idempotency_key, "stale")
    assert isinstance(orders.commit(charged, {"n": 2}), Stale)  # settled already
    assert counted.taken() == (0 if backend_name in LOOKS else 1)
    assert orders.effects(charged) == [settled]

    many = orders.commit_many([(plain, {"n": 3}), (charged, {"n": 3})])
    assert [type(o) for o in many] == [Stale, Stale]
    assert orders.effects(charged) == [settled]


def test_apply_settles_its_last_refusal_s_effects(
    store: Any, backend_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``decide`` records an effect, and every commit is refused (another writer commits
    between decide and commit): the refusal that ends the work sees the effect."""
    orders = store.collection("orders")
    orders.create("o-1", {"n": 0})
    intent = orders.intent("o-1", "charge")
    counted = Counted(store, monkeypatch)
    others = iter(range(100))

    def decide(record: Any) -> dict[str, int]:
        if record.state["n"] == 1:  # the second decision makes a call first
            orders.effect(intent, "charge")
        bump = orders.intent("o-1", f"other-{next(others)}")
        assert isinstance(orders.commit(bump, {"n": record.state["n"] + 1}), Committed)
        return {"n": -1}

    ended = orders.apply(intent, decide, on_stale=Recompute(attempts=3, backoff=0))
    assert isinstance(ended, Contended)
    assert counted.taken() == 1
    (fx,) = orders.effects(intent)
    assert fx.outcome == "contended"

    dropped = orders.intent("o-1", "dropped")  # the default policy, Drop: Stale
    assert isinstance(orders.apply(dropped, decide), Stale)
    assert counted.taken() == (0 if backend_name in LOOKS else 1)
    assert orders.effects(dropped) == []
