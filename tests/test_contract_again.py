"""The contract, for work done again: on every backend, sync and async.

A lease holder commits more than once under one token, and a broker redelivers a task
that already committed. Each test here was written for a mutant that the rest of the
suite let through (issue 23): the line it guards is named in its docstring.
"""

from __future__ import annotations

from typing import Any

import pytest

from fencing import Committed, Drop, Duplicate, Fenced, FenceReason, Stale


def test_a_lease_holder_commits_twice_under_one_token(store: Any) -> None:
    """The fenced UPDATE accepts the record's own fence (``fence <= token``, not ``<``):
    a holder's second commit to the record it already wrote is not stale."""
    orders = store.collection("orders")
    orders.create("o-1", {"n": 0})
    lease = store.acquire("orders/o-1", owner="w", ttl=30)
    first = orders.commit(orders.intent("o-1", "a"), {"n": 1}, lease=lease)
    assert isinstance(first, Committed) and first.record.fence == lease.token
    second = orders.commit(orders.intent("o-1", "b"), {"n": 2}, lease=lease)
    assert isinstance(second, Committed), second
    assert (second.record.version, second.record.fence) == (3, lease.token)
    third = orders.apply(orders.intent("o-1", "c"), lambda r: {"n": r.state["n"] + 1}, lease=lease)
    assert isinstance(third, Committed), third
    assert orders.get("o-1").state == {"n": 3}
    # and a batch under the same token, to the record it already wrote
    (fourth,) = orders.commit_many([(orders.intent("o-1", "d"), {"n": 4})], lease=lease)
    assert isinstance(fourth, Committed), fourth
    lease.release()
    # the released token writes no more: the fence check is not simply gone
    out = orders.commit(orders.intent("o-1", "e"), {"n": 5}, lease=lease)
    assert isinstance(out, Fenced) and out.reason is FenceReason.EXPIRED
    assert orders.get("o-1").state == {"n": 4}


def test_a_lease_holder_commits_twice_to_a_table_row(
    make_table: Any, store: Any, backend_name: str
) -> None:
    """The same on a user's table: the row's fence may equal the token that wrote it."""
    if backend_name == "redis-cluster":  # lease "t/1" is in another hash slot than the row
        pytest.skip("a table row and its lease share no hash slot here (test_fenced_table_commit)")
    table = make_table(rows=[{"id": 1, "status": "a"}])
    lease = store.acquire("t/1", owner="w", ttl=30)
    first = table.commit(table.intent(1, "x"), {"status": "b"}, lease=lease)
    assert first.committed and first.record.fence == lease.token
    second = table.commit(table.intent(1, "y"), {"status": "c"}, lease=lease)
    assert isinstance(second, Committed), second
    assert second.record.fence == lease.token and table.get(1).state["status"] == "c"
    lease.release()


def test_a_redelivered_apply_under_drop_is_duplicate_and_settles_nothing(store: Any) -> None:
    """Under the default ``Drop()``, a task delivered again after it committed answers
    ``Duplicate`` (the probe sees the intent applied), not ``Stale``; and the committed
    work's recorded effects are not marked stale (nothing to reconcile)."""
    orders = store.collection("orders")
    orders.create("o-1", {"status": "paid"})
    intent = orders.intent("o-1", "ship")
    fx = orders.effect(intent, "label")
    orders.effect_done(fx, detail={"label": "L-1"})
    first = orders.apply(intent, lambda r: {"status": "shipped"})
    assert isinstance(first, Committed)
    calls: list[int] = []
    for policy in (None, Drop()):  # the default, then said explicitly
        kwargs = {} if policy is None else {"on_stale": policy}
        again = orders.apply(intent, lambda r: calls.append(1) or {"status": "x"}, **kwargs)
        assert isinstance(again, Duplicate), again
        assert again.record.version == 2
    assert calls == []  # decide never ran again
    assert orders.get("o-1").state == {"status": "shipped"}
    (recorded,) = orders.effects(intent)
    assert recorded.outcome is None and not recorded.needs_reconcile
    assert store.effects_to_reconcile() == []
    # even after the record moved on, the redelivery is still a duplicate
    assert orders.commit(orders.intent("o-1", "deliver"), {"status": "delivered"}).committed
    assert isinstance(orders.apply(intent, lambda r: {"status": "x"}, on_stale=Drop()), Duplicate)
    assert store.effects_to_reconcile() == []


def test_a_guard_of_two_columns_is_judged_on_both(make_table: Any) -> None:
    """A table without a version column, guarded on two columns: a late intent whose
    guard no longer holds (one of its two values changed) is ``Stale``, and the reason is
    read back with both columns compared."""
    table = make_table(rows=[{"id": 7, "status": "packed", "total": 3}], version=None)
    guard = {"status": "packed", "total": 3}
    first = table.intent(7, "ship", guard=guard)
    late = table.intent(7, "ship", guard=guard)
    assert table.commit(first, {"status": "shipped"}).committed
    out = table.commit(late, {"status": "lost"})
    assert isinstance(out, Stale), out
    assert out.current.state["status"] == "shipped"
