"""The contract, for what a store reads and answers around a commit: on every backend,
sync and async. Each test here was written for a mutant that the rest of the suite let
through (issue 23): the line it guards is named in its docstring.
"""

from __future__ import annotations

from typing import Any

import pytest

from fencing import Committed, Fenced, FenceReason, Reconcile, SchemaError, Stale

from ._syncify import Syncified


def _backend(store: Any) -> Any:
    """The store's backend, called as the sync one is (an async store's, on its loop)."""
    if isinstance(store, Syncified):
        return Syncified(store.unwrapped.backend, store._loop)
    return store.backend


def test_a_superseded_lease_never_runs_decide(store: Any) -> None:
    """``apply``'s probe judges the lease (SQLite: a fenced probe is ``judged``, not the
    unfenced ``probed``): a token a newer holder superseded is ``Fenced`` before
    ``decide`` runs, so the task computes nothing it cannot commit."""
    orders = store.collection("orders")
    orders.create("o-1", {"n": 0})
    old = store.acquire("orders/o-1", owner="a", ttl=60)
    old.release()
    new = store.acquire("orders/o-1", owner="b", ttl=60)
    decided: list[Any] = []
    out = orders.apply(orders.intent("o-1", "x"), decided.append, lease=old)
    assert isinstance(out, Fenced) and out.reason is FenceReason.NEWER_OWNER, out
    assert decided == []
    done = orders.apply(orders.intent("o-1", "y"), lambda r: {"n": 1}, lease=new)
    assert isinstance(done, Committed), done
    new.release()


def test_reconcile_is_given_every_effect_of_the_intent(store: Any) -> None:
    """Settling answers all of the intent's effects (SQLite: ``LIMIT -1``, no limit), in
    the order they were recorded; ``Reconcile``'s handler gets each one."""
    orders = store.collection("orders")
    orders.create("o-1", {"n": 0})
    intent = orders.intent("o-1", "ship")
    names = ["charge", "mail", "sms"]
    for name in names:
        orders.effect(intent, name)
    orders.commit(orders.intent("o-1", "other"), {"n": 1})
    seen: list[Any] = []
    out = orders.apply(
        intent,
        lambda r: {"n": 2},
        on_stale=Reconcile(lambda i, current, effects: seen.append(effects)),
    )
    assert isinstance(out, Stale), out
    (effects,) = seen
    assert sorted(e.name for e in effects) == names
    assert {e.outcome for e in effects} == {"stale"}


def test_stats_and_lease_state_answer_at_the_store_s_clock(store: Any) -> None:
    """``Backend.stats()`` says when it counted (``now``, the store's clock, the one a
    lease's expiry is on); ``lease_state`` reads a lease, it grants nothing."""
    lease = store.acquire("orders/o-1", owner="w", ttl=60)
    backend = _backend(store)
    answer = backend.lease_state("orders/o-1")
    assert answer.granted is False and answer.row.token == lease.token
    stats = backend.stats()
    assert stats.leases_held == 1
    assert answer.row.expires_at - 60 <= stats.now < answer.row.expires_at
    lease.release()


def _has_schema(backend_name: str) -> bool:
    return not backend_name.startswith("redis")  # Redis has no tables to look for


@pytest.mark.backends(only=_has_schema)
def test_a_table_that_does_not_exist_is_named(store: Any) -> None:
    with pytest.raises(SchemaError, match=r"^table 'nope' does not exist$"):
        store.table("nope").get(1)
