"""The contract every backend keeps, run on each backend through the sync and async API."""

from __future__ import annotations

import threading
from typing import Any

import pytest

import fencing
from fencing import (
    SKIP,
    Committed,
    Contended,
    Drop,
    Duplicate,
    Fenced,
    FenceReason,
    Missing,
    Recompute,
    Reconcile,
    Skipped,
    Stale,
)


def test_create_get_delete(store: Any) -> None:
    orders = store.collection("orders")
    rec = orders.create("o-1", {"status": "new", "items": [1, 2]})
    assert (rec.key, rec.version, rec.fence) == ("o-1", 1, 0)
    got = orders.get("o-1")
    assert got == rec
    assert dict(got.state) == {"status": "new", "items": [1, 2]}
    with pytest.raises(fencing.AlreadyExists):
        orders.create("o-1", {"status": "other"})
    assert orders.get("o-1").state["status"] == "new"
    assert orders.get("nope") is None
    assert orders.delete("o-1") is True
    assert orders.delete("o-1") is False
    assert orders.get("o-1") is None


def test_collections_are_separate(store: Any) -> None:
    store.collection("a").create("k", {"n": 1})
    store.collection("b").create("k", {"n": 2})
    assert store.collection("a").get("k").state["n"] == 1
    assert store.collection("b").get("k").state["n"] == 2


def test_commit_then_stale_then_duplicate(store: Any) -> None:
    orders = store.collection("orders")
    rec = orders.create("o-1", {"status": "new"})
    ship, cancel = rec.intent("ship"), rec.intent("cancel")

    first = orders.commit(ship, {"status": "shipped"})
    assert isinstance(first, Committed) and first.committed
    assert first.record.version == 2
    assert dict(first.record.state) == {"status": "shipped"}

    late = orders.commit(cancel, {"status": "cancelled"})
    assert isinstance(late, Stale) and not late.committed
    assert late.current.version == 2 and late.current.state["status"] == "shipped"

    again = orders.commit(ship, {"status": "shipped"})
    assert isinstance(again, Duplicate) and not again.committed
    assert again.record.version == 2
    assert orders.get("o-1").version == 2


def test_duplicate_recognised_after_later_commits(store: Any) -> None:
    orders = store.collection("orders")
    orders.create("o-1", {"n": 0})
    first = orders.intent("o-1", "inc")
    assert orders.commit(first, {"n": 1}).committed
    for n in range(2, 6):
        assert orders.commit(orders.intent("o-1", "inc"), {"n": n}).committed
    assert isinstance(orders.commit(first, {"n": 1}), Duplicate)
    assert orders.get("o-1").state["n"] == 5


def test_identical_state_still_counts_as_applied(store: Any) -> None:
    orders = store.collection("orders")
    rec = orders.create("o-1", {"status": "new"})
    out = orders.commit(rec.intent("noop"), {"status": "new"})
    assert isinstance(out, Committed) and out.record.version == 2


def test_missing(store: Any) -> None:
    orders = store.collection("orders")
    rec = orders.create("o-1", {"n": 0})
    orders.delete("o-1")
    assert isinstance(orders.commit(rec.intent("x"), {"n": 1}), Missing)
    with pytest.raises(fencing.RecordNotFound):
        orders.intent("o-1", "x")


def test_outcomes_match(store: Any) -> None:
    orders = store.collection("orders")
    rec = orders.create("o-1", {"n": 0})
    match orders.commit(rec.intent("x"), {"n": 1}):
        case Committed(record):
            assert record.version == 2
        case _:
            pytest.fail("expected Committed")
    match orders.commit(rec.intent("y"), {"n": 9}):
        case Stale(current):
            assert current.state["n"] == 1
        case _:
            pytest.fail("expected Stale")


def test_guard_on_collection(store: Any) -> None:
    orders = store.collection("orders")
    rec = orders.create("o-1", {"status": "packed"})
    ok = orders.commit(rec.intent("ship", guard={"status": "packed"}), {"status": "shipped"})
    assert ok.committed
    rec2 = orders.get("o-1")
    refused = orders.commit(rec2.intent("ship", guard={"status": "packed"}), {"status": "x"})
    assert isinstance(refused, Stale)
    assert orders.get("o-1").state["status"] == "shipped"


def test_apply_commits_decision(store: Any) -> None:
    orders = store.collection("orders")
    orders.create("o-1", {"n": 1})
    seen: list[int] = []

    def decide(rec: fencing.Record) -> dict[str, Any]:
        seen.append(rec.version)
        return {"n": rec.state["n"] * 10}

    out = orders.apply(orders.intent("o-1", "x10"), decide)
    assert isinstance(out, Committed) and out.record.state["n"] == 10
    assert seen == [1]


def test_apply_skip(store: Any) -> None:
    orders = store.collection("orders")
    orders.create("o-1", {"n": 1})
    out = orders.apply(orders.intent("o-1", "x"), lambda rec: SKIP)
    assert isinstance(out, Skipped)
    assert orders.get("o-1").version == 1


def test_apply_drop_does_not_decide_on_stale(store: Any) -> None:
    orders = store.collection("orders")
    rec = orders.create("o-1", {"n": 1})
    old = rec.intent("x")
    orders.commit(rec.intent("y"), {"n": 2})
    calls: list[int] = []
    out = orders.apply(old, lambda r: calls.append(1) or {"n": 3}, on_stale=Drop())
    assert isinstance(out, Stale) and calls == []


def test_apply_recompute_decides_against_current(store: Any) -> None:
    orders = store.collection("orders")
    rec = orders.create("o-1", {"n": 1})
    old = rec.intent("double")
    orders.commit(rec.intent("other"), {"n": 5})
    out = orders.apply(old, lambda r: {"n": r.state["n"] * 2}, on_stale=Recompute(attempts=2))
    assert isinstance(out, Committed) and out.record.state["n"] == 10
    assert out.intent is not None and out.intent.root_id == old.id


def test_apply_recompute_decides_from_the_refusal_without_reading_again(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit refused as stale carries the current record, and ``Recompute`` decides
    again from it: one probe, then one commit per decide, and no other read of the
    store (its backend's calls counted; the rival's commit inside ``decide`` aside)."""
    backend = store.backend
    calls: list[str] = []
    counting = True
    for name in ("read", "probe", "commit", "commit_many"):
        original = getattr(type(backend), name)

        def counted(self: Any, *args: Any, _name: str = name, _of: Any = original) -> Any:
            if counting:
                calls.append(_name)
            return _of(self, *args)

        monkeypatch.setattr(type(backend), name, counted)
    orders = store.collection("orders")
    orders.create("o-1", {"n": 1})
    seen: list[tuple[int, int]] = []

    def decide(rec: fencing.Record) -> dict[str, Any]:
        nonlocal counting
        seen.append((rec.version, rec.state["n"]))
        if len(seen) == 1:  # a rival commits between this decide and its commit
            counting = False
            assert orders.commit(orders.intent("o-1", "rival"), {"n": 10}).committed
            counting = True
        return {"n": rec.state["n"] + 1}

    intent = orders.intent("o-1", "inc")
    calls.clear()
    out = orders.apply(intent, decide, on_stale=Recompute(backoff=0))
    assert isinstance(out, Committed) and out.record.state["n"] == 11
    assert seen == [(1, 1), (2, 10)]  # the second decide: the refusal's record
    assert calls == ["probe", "commit", "commit"]


def test_apply_recompute_ends_contended_and_bounds_decides(store: Any) -> None:
    orders = store.collection("orders")
    orders.create("o-1", {"n": 0})
    calls = 0

    def decide(rec: fencing.Record) -> dict[str, Any]:
        nonlocal calls
        calls += 1
        # someone else always gets in first
        assert orders.commit(orders.intent("o-1", "rival"), {"n": rec.state["n"] + 1}).committed
        return {"n": -1}

    out = orders.apply(orders.intent("o-1", "x"), decide, on_stale=Recompute(attempts=3, backoff=0))
    assert isinstance(out, Contended)
    assert calls == 3 and out.attempts == 3
    assert orders.get("o-1").state["n"] == 3


def test_apply_reconcile_calls_handler_once(store: Any) -> None:
    orders = store.collection("orders")
    rec = orders.create("o-1", {"n": 1})
    old = rec.intent("charge")
    orders.commit(rec.intent("cancel"), {"n": 0})
    calls: list[tuple[str, int]] = []
    out = orders.apply(
        old,
        lambda r: {"n": 99},
        on_stale=Reconcile(
            lambda intent, current, effects: calls.append((intent.id, current.version))
        ),
    )
    assert isinstance(out, Stale)
    assert calls == [(old.id, 2)]


def test_apply_redelivered_after_recompute_is_duplicate(store: Any) -> None:
    orders = store.collection("orders")
    rec = orders.create("o-1", {"n": 1})
    old = rec.intent("inc")
    orders.commit(rec.intent("other"), {"n": 5})
    policy = Recompute(attempts=3, backoff=0)
    first = orders.apply(old, lambda r: {"n": r.state["n"] + 1}, on_stale=policy)
    assert first.committed
    orders.commit(orders.intent("o-1", "later"), {"n": 100})
    again = orders.apply(old, lambda r: {"n": r.state["n"] + 1}, on_stale=policy)
    assert isinstance(again, Duplicate)
    assert orders.get("o-1").state["n"] == 100


def test_commit_many_in_order(store: Any) -> None:
    orders = store.collection("orders")
    a = orders.create("a", {"n": 0})
    b = orders.create("b", {"n": 0})
    stale_b = b.intent("old")
    orders.commit(b.intent("new"), {"n": 1})
    ia = a.intent("x")
    ia2 = a.intent("y").derive(2, 1)  # a fresh root, committed at version 2
    outs = orders.commit_many([(ia, {"n": 1}), (stale_b, {"n": 9}), (ia2, {"n": 2})])
    assert [o.kind for o in outs] == ["committed", "stale", "committed"]
    assert orders.get("a").state["n"] == 2
    assert orders.commit_many([]) == []
    with pytest.raises(fencing.InvalidIntent):
        orders.commit_many([(ia, {"n": 1}), (ia, {"n": 1})])


def test_threads_hammer_one_key(store: Any) -> None:
    orders = store.collection("orders")
    orders.create("hot", {"n": 0})
    outcomes: list[fencing.Outcome] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(15):
            out = orders.apply(
                orders.intent("hot", "inc"),
                lambda r: {"n": r.state["n"] + 1},
                on_stale=Recompute(attempts=50, backoff=0.001, max_backoff=0.01),
            )
            with lock:
                outcomes.append(out)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    committed = sum(1 for o in outcomes if o.committed)
    final = orders.get("hot")
    assert final.version == 1 + committed
    assert final.state["n"] == committed
    assert committed + sum(1 for o in outcomes if isinstance(o, Contended)) == len(outcomes)


# -- guarded tables --------------------------------------------------------------------
def test_table_commit(make_table: Any) -> None:
    table = make_table(rows=[{"id": 42, "status": "packed", "total": 10, "note": "keep"}])
    rec = table.get(42)
    assert rec.kind == "table" and rec.version == 1
    assert rec.state["status"] == "packed" and rec.state["note"] == "keep"
    intent = table.intent(42, "ship")
    out = table.commit(intent, {"status": "shipped"})
    assert isinstance(out, Committed)
    assert out.record.version == 2
    assert out.record.state["status"] == "shipped"
    assert out.record.state["note"] == "keep"  # only the given columns are written
    assert isinstance(table.commit(intent, {"status": "shipped"}), Duplicate)
    late = fencing.Intent.new("orders_t", 42, 1, "late", kind="table")  # decided at v1
    assert isinstance(table.commit(late, {"status": "x"}), Stale)
    assert isinstance(table.commit(intent.derive(2, 7), {"total": 1}), Duplicate)
    assert table.get(42).state["status"] == "shipped"


def test_table_missing_row(make_table: Any) -> None:
    table = make_table(rows=[{"id": 1, "status": "a"}])
    with pytest.raises(fencing.RecordNotFound):
        table.intent(2, "x")
    assert table.get(2) is None


def test_table_without_version_column_uses_guard(make_table: Any) -> None:
    table = make_table(rows=[{"id": 7, "status": "packed"}], version=None)
    with pytest.raises(fencing.InvalidIntent):
        table.intent(7, "ship")
    intent = table.intent(7, "ship", guard={"status": "packed"})
    assert intent.expected_version is None
    assert table.commit(intent, {"status": "shipped"}).committed
    assert isinstance(table.commit(intent, {"status": "shipped"}), Duplicate)
    late = table.intent(7, "ship", guard={"status": "packed"})
    assert isinstance(table.commit(late, {"status": "shipped"}), Stale)


def test_table_bad_columns_refused(make_table: Any) -> None:
    table = make_table(rows=[{"id": 1, "status": "a"}])
    intent = table.intent(1, "x")
    with pytest.raises(fencing.SchemaError):
        table.commit(intent, {"nope": 1})
    with pytest.raises(fencing.InvalidState):
        table.commit(intent, {"version": 5})
    with pytest.raises(fencing.InvalidState):
        table.commit(intent, {"status": {"nested": 1}})
    with pytest.raises(fencing.InvalidState):
        table.commit(intent, {})
    assert table.get(1).version == 1


def test_table_columns_limit_what_commits_may_set(store: Any, make_table: Any) -> None:
    make_table(rows=[{"id": 1, "status": "a", "total": 5, "note": "n"}])
    narrow = store.table("orders_t", columns=["status"])
    same = store.table("orders_t", columns=("status",))
    assert getattr(same, "unwrapped", same) is getattr(narrow, "unwrapped", narrow)
    intent = narrow.intent(1, "x")
    with pytest.raises(fencing.SchemaError, match="opened with"):
        narrow.commit(intent, {"status": "b", "total": 6})
    assert narrow.get(1).version == 1  # refused before anything was written
    out = narrow.commit(intent, {"status": "b"})
    assert out.committed and out.record.state["status"] == "b"
    assert str(out.record.state["total"]) == "5"  # the whole row comes back
    wide = store.table("orders_t")  # the same table without the limit
    assert getattr(wide, "unwrapped", wide) is not getattr(narrow, "unwrapped", narrow)
    assert wide.commit(wide.intent(1, "y"), {"total": 6}).committed
    assert str(narrow.get(1).state["total"]) == "6"


def test_table_columns_the_table_lacks(store: Any, make_table: Any, backend_name: str) -> None:
    make_table(rows=[{"id": 1, "status": "a"}])
    table = store.table("orders_t", columns=["status", "colour"])
    if not backend_name.startswith("redis"):
        # a store with a schema: the table must have every column given
        with pytest.raises(fencing.SchemaError, match="colour"):
            table.get(1)
        return
    # Redis has no schema: columns= declares them, adding to the declaration
    out = table.commit(table.intent(1, "paint"), {"colour": "red"})
    assert out.committed and out.record.state["colour"] == "red"
    assert out.record.state["status"] == "a"
    again = store.table("orders_t", columns=["note"])
    assert again.commit(again.intent(1, "n"), {"note": "kept"}).committed
    assert store.table("orders_t").get(1).state["colour"] == "red"


@pytest.mark.parametrize(
    ("columns", "error"),
    [
        ("status", fencing.InvalidInput),
        (b"status", fencing.InvalidInput),
        (42, fencing.InvalidInput),
        ([], fencing.InvalidInput),
        (["version"], fencing.InvalidInput),
        (["status", "id"], fencing.InvalidInput),
        ([1], fencing.InvalidIdentifier),
        (["bad name"], fencing.InvalidIdentifier),
        (['x"; DROP TABLE orders_t; --'], fencing.InvalidIdentifier),
    ],
)
def test_table_bad_columns_argument(
    store: Any, make_table: Any, columns: object, error: type[Exception]
) -> None:
    table = make_table(rows=[{"id": 1, "status": "a"}])
    with pytest.raises(error):
        store.table("orders_t", columns=columns)
    assert table.get(1).version == 1 and table.get(1).state["status"] == "a"


def test_missing_table_is_schema_error(store: Any) -> None:
    with pytest.raises(fencing.SchemaError):
        store.table("no_such_table").get(1)


def test_intent_for_other_target_refused(store: Any, make_table: Any) -> None:
    table = make_table(rows=[{"id": 1, "status": "a"}])
    orders = store.collection("orders")
    rec = orders.create("o-1", {"n": 1})
    with pytest.raises(fencing.InvalidIntent):
        store.collection("other").commit(rec.intent("x"), {"n": 2})
    with pytest.raises(fencing.InvalidIntent):
        table.commit(rec.intent("x"), {"status": "b"})


# -- leases and fenced commits -------------------------------------------------------
def test_lease_tokens_increase(store: Any) -> None:
    tokens = []
    for _ in range(3):
        with store.lease("orders/o-1", owner="w", ttl=5) as lease:
            tokens.append(lease.token)
    assert tokens == sorted(set(tokens)) and tokens[0] >= 1


def test_lease_held(store: Any) -> None:
    lease = store.acquire("jobs/x", owner="a", ttl=5)
    with pytest.raises(fencing.LeaseHeld):
        store.acquire("jobs/x", owner="b", ttl=5)
    assert store.try_acquire("jobs/x", owner="b", ttl=5) is None
    lease.release()
    other = store.try_acquire("jobs/x", owner="b", ttl=5)
    assert other is not None and other.token > lease.token
    with pytest.raises(fencing.LeaseLost):
        lease.renew()
    other.release()


def test_fenced_commit_newer_owner(store: Any) -> None:
    import time

    orders = store.collection("orders")
    orders.create("o-1", {"by": None})
    old = store.acquire("orders/o-1", owner="a", ttl=0.2)
    intent_a = orders.intent("o-1", "a")
    time.sleep(0.3)
    new = store.acquire("orders/o-1", owner="b", ttl=5)
    assert new.token > old.token
    out = orders.commit(intent_a, {"by": "a"}, lease=old)
    assert isinstance(out, Fenced) and out.reason is FenceReason.NEWER_OWNER
    assert old.lost
    ok = orders.commit(orders.intent("o-1", "b"), {"by": "b"}, lease=new)
    assert ok.committed and ok.record.fence == new.token
    new.release()


def test_fenced_commit_expired(store: Any) -> None:
    import time

    orders = store.collection("orders")
    orders.create("o-1", {"by": None})
    lease = store.acquire("orders/o-1", owner="a", ttl=0.2)
    intent = orders.intent("o-1", "a")
    time.sleep(0.3)
    out = orders.commit(intent, {"by": "a"}, lease=lease)
    assert isinstance(out, Fenced) and out.reason is FenceReason.EXPIRED
    assert orders.get("o-1").state["by"] is None


# A lease that apply takes again must last long enough for the commit that follows on a
# loaded machine (a stall past it is a retake more, at most MAX_RETAKES); the tests that
# only need a lease to lapse keep 0.2 s.
LEASE_TTL = 0.6


def _outlive(lease: Any) -> None:
    """Pause past the lease's TTL (a GC pause, a frozen VM), by the store's clock too."""
    import time

    time.sleep(lease.ttl + 0.15)


def test_apply_takes_an_expired_lease_again_and_commits(store: Any) -> None:
    """Paused past the lease with nobody taking over: not an obsolete decision. apply
    takes the lease again (a new token) and commits the same intent."""
    orders = store.collection("orders")
    orders.create("o-1", {"status": "paid"})
    intent = orders.intent("o-1", "ship")
    with store.lease("orders/o-1", owner="w", ttl=LEASE_TTL) as lease:
        first = lease.token

        def decide(r: fencing.Record) -> dict[str, Any]:
            _outlive(lease)
            return {"status": "shipped"}

        out = orders.apply(intent, decide, lease=lease)
        assert out.committed, out
        assert lease.token > first and not lease.lost
        assert out.record.fence == lease.token and out.record.version == 2
    assert orders.get("o-1").state["status"] == "shipped"
    assert store.try_acquire("orders/o-1", owner="x", ttl=5) is not None  # released


def test_apply_retakes_a_lease_that_ran_out_before_it_started(store: Any) -> None:
    orders = store.collection("orders")
    orders.create("o-1", {"status": "paid"})
    intent = orders.intent("o-1", "ship")
    lease = store.acquire("orders/o-1", owner="w", ttl=LEASE_TTL)
    _outlive(lease)
    decided: list[int] = []

    def decide(r: fencing.Record) -> dict[str, Any]:
        decided.append(r.version)
        return {"status": "shipped"}

    out = orders.apply(intent, decide, lease=lease)
    assert out.committed and out.record.fence == lease.token and decided == [1]
    lease.release()


def test_apply_under_an_expired_lease_another_owner_took_is_fenced_newer(store: Any) -> None:
    orders = store.collection("orders")
    orders.create("o-1", {"status": "paid"})
    intent = orders.intent("o-1", "ship")
    lease = store.acquire("orders/o-1", owner="w", ttl=0.2)
    taken: list[Any] = []

    def decide(r: fencing.Record) -> dict[str, Any]:
        _outlive(lease)
        taken.append(store.acquire("orders/o-1", owner="other", ttl=30))
        return {"status": "shipped"}

    out = orders.apply(intent, decide, lease=lease)
    assert isinstance(out, Fenced) and out.reason is FenceReason.NEWER_OWNER, out
    assert lease.lost and lease.lost_reason == "newer_owner"
    assert orders.get("o-1").state["status"] == "paid" and orders.get("o-1").version == 1
    taken[0].release()


def test_apply_under_an_expired_lease_on_a_record_that_moved_is_stale(store: Any) -> None:
    """Taken again, the lease does not make an old decision fresh: the store still
    judges the version, and the stale policy goes on from there."""
    orders = store.collection("orders")
    orders.create("o-1", {"n": 0})
    for policy, want in ((fencing.Drop(), Stale), (Recompute(attempts=3, backoff=0), None)):
        intent = orders.intent("o-1", "bump")
        lease = store.acquire("orders/o-1", owner="w", ttl=LEASE_TTL)
        moved = iter([True])

        def decide(r: fencing.Record, moved: Any = moved, lease: Any = lease) -> dict[str, Any]:
            if next(moved, False):
                _outlive(lease)
                assert orders.commit(orders.intent("o-1", "rival"), {"n": r.state["n"] + 10})
            return {"n": r.state["n"] + 1}

        before = orders.get("o-1").state["n"]
        out = orders.apply(intent, decide, on_stale=policy, lease=lease)
        if want is Stale:
            assert isinstance(out, Stale) and orders.get("o-1").state["n"] == before + 10
        else:
            assert out.committed and out.record.state["n"] == before + 11
        lease.release()


def test_a_released_lease_is_not_taken_again(store: Any) -> None:
    orders = store.collection("orders")
    orders.create("o-1", {"status": "paid"})
    lease = store.acquire("orders/o-1", owner="w", ttl=5)
    lease.release()
    out = orders.apply(orders.intent("o-1", "ship"), lambda r: {"status": "x"}, lease=lease)
    assert isinstance(out, Fenced) and orders.get("o-1").version == 1


def test_fenced_table_commit(make_table: Any, store: Any, backend_name: str) -> None:
    table = make_table(rows=[{"id": 1, "status": "a"}])
    lease = store.acquire("t/1", owner="a", ttl=5)
    if backend_name == "redis-cluster":  # lease "t/1" is in another hash slot than the row
        with pytest.raises(fencing.InvalidInput, match="share a hash slot"):
            table.commit(table.intent(1, "x"), {"status": "b"}, lease=lease)
        assert table.get(1).state["status"] == "a" and table.get(1).version == 1
        return
    out = table.commit(table.intent(1, "x"), {"status": "b"}, lease=lease)
    assert out.committed and out.record.fence == lease.token
    lease.release()
    out = table.commit(table.intent(1, "y"), {"status": "c"}, lease=lease)
    assert isinstance(out, Fenced) and out.reason is FenceReason.EXPIRED
    assert table.get(1).state["status"] == "b"


def test_recomputed_intent_redelivered_is_never_applied_twice(store: Any) -> None:
    """A first delivery goes stale mid-way and commits a derivation; the redelivery must
    not commit another derivation of the same root (found by the demo's checker)."""
    accounts = store.collection("accounts")
    rec = accounts.create("a", {"balance": 100})
    credit = rec.intent("credit")
    policy = Recompute(attempts=5, backoff=0)
    rivals = iter([True])

    def decide_with_rival(r: fencing.Record) -> dict[str, Any]:
        if next(rivals, False):  # a rival write lands between the probe and the commit
            assert accounts.commit(accounts.intent("a", "fee"), {"balance": 99}).committed
        return {"balance": r.state["balance"] + 1}

    first = accounts.apply(credit, decide_with_rival, on_stale=policy)
    assert first.committed and first.record.state["balance"] == 100
    again = accounts.apply(credit, lambda r: {"balance": r.state["balance"] + 1}, on_stale=policy)
    assert isinstance(again, Duplicate)
    assert accounts.get("a").state["balance"] == 100
    # and the derivation itself, replayed directly, is a duplicate of its root
    assert isinstance(accounts.commit(credit.derive(3, 1), {"balance": 0}), Duplicate)


def test_one_intent_id_on_two_keys_commits_each_once(store: Any) -> None:
    """A caller-chosen id (a task id, say) names work on one key: used for key ``a`` and
    then for key ``b``, each commits once; ``Duplicate`` only for the key it was applied to."""
    orders = store.collection("orders")
    c, d = (orders.create(k, {"n": 0}) for k in ("c", "d"))
    orders.create("a", {"n": 0})
    orders.create("b", {"n": 0})
    on_a = fencing.Intent(
        id="task-42", collection="orders", key="a", expected_version=1, transition="ship"
    )
    on_b = fencing.Intent(
        id="task-42", collection="orders", key="b", expected_version=1, transition="ship"
    )
    assert isinstance(orders.commit(on_a, {"n": 1}), Committed)
    out_b = orders.commit(on_b, {"n": 1})
    assert isinstance(out_b, Committed), f"key b was never written, yet: {out_b!r}"
    assert isinstance(orders.commit(on_a, {"n": 1}), Duplicate)
    assert isinstance(orders.commit(on_b, {"n": 1}), Duplicate)
    assert (orders.get("a").version, orders.get("b").version) == (2, 2)
    # probes say the same
    assert orders.get("b").state["n"] == 1
    # one batch may carry the same id for two keys
    same = [
        (
            fencing.Intent(
                id="task-43",
                collection="orders",
                key=rec.key,
                expected_version=1,
                transition="ship",
            ),
            {"n": 5},
        )
        for rec in (c, d)
    ]
    assert [o.kind for o in orders.commit_many(same)] == ["committed", "committed"]
    assert [o.kind for o in orders.commit_many(same)] == ["duplicate", "duplicate"]


def test_one_intent_id_on_two_table_rows(make_table: Any) -> None:
    table = make_table(rows=[{"id": 1, "status": "new"}, {"id": 2, "status": "new"}])
    one = fencing.Intent(
        id="job-7",
        collection=table.name,
        key=1,
        expected_version=1,
        transition="pack",
        kind="table",
    )
    two = fencing.Intent(
        id="job-7",
        collection=table.name,
        key=2,
        expected_version=1,
        transition="pack",
        kind="table",
    )
    assert isinstance(table.commit(one, {"status": "packed"}), Committed)
    assert isinstance(table.commit(two, {"status": "packed"}), Committed)
    assert isinstance(table.commit(two, {"status": "packed"}), Duplicate)
    assert table.get(2).version == 2
