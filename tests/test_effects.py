"""Recorded effects: the contract every backend keeps, sync and async.

An effect is recorded before it is made, keyed by a stable idempotency key; an
intent that ends stale, fenced, contended or missing settles its effects, which
are then listed for reconciliation until marked reconciled.
"""

from __future__ import annotations

import re
import threading
from typing import Any

import pytest

import fencing
from fencing import Contended, Effect, Fenced, Missing, Recompute, Reconcile, Stale
from fencing._effects import effect_from_row, effect_key, new_effect_row


def _orders(store: Any) -> Any:
    orders = store.collection("orders")
    orders.create("o-1", {"status": "new", "total": 10})
    return orders


def test_record_is_idempotent_and_keyed_by_the_work(store: Any) -> None:
    orders = _orders(store)
    intent = orders.intent("o-1", "charge")
    fx = orders.effect(intent, "charge", detail={"amount": 10})
    assert isinstance(fx, Effect)
    assert fx.status == "pending" and fx.outcome is None and not fx.reconciled
    assert fx.idempotency_key == effect_key("c:orders", intent.root_id, "charge")
    assert (fx.collection, fx.kind, fx.key, fx.intent_id) == (
        "orders",
        "collection",
        "o-1",
        intent.id,
    )
    assert (fx.transition, fx.name, fx.detail) == ("charge", "charge", {"amount": 10})

    done = orders.effect_done(fx, detail={"charge_id": "ch_1"})
    assert done.status == "done" and done.detail == {"charge_id": "ch_1"}
    # a retry records again: it gets the stored effect, and sees it is done
    again = orders.effect(intent, "charge", detail={"amount": 99})
    assert again.idempotency_key == fx.idempotency_key
    assert again.status == "done" and again.detail == {"charge_id": "ch_1"}
    # every Recompute derivation of the same work shares the key
    derived = intent.derive(intent.expected_version, 2)
    assert orders.effect(derived, "charge").idempotency_key == fx.idempotency_key
    # another effect of the same work, and the same effect of other work, differ
    email = orders.effect(intent, "email")
    other = orders.effect(orders.intent("o-1", "charge"), "charge")
    keys = {fx.idempotency_key, email.idempotency_key, other.idempotency_key}
    assert len(keys) == 3
    listed = orders.effects(intent)
    assert {e.idempotency_key for e in listed} == {fx.idempotency_key, email.idempotency_key}
    assert store.get_effect(fx.idempotency_key) == again
    assert store.get_effect(effect_key("c:orders", "nobody", "x")) is None


def test_failed_then_done(store: Any) -> None:
    orders = _orders(store)
    fx = orders.effect(orders.intent("o-1", "charge"), "charge")
    failed = orders.effect_failed(fx, detail="card declined")
    assert failed.status == "failed" and failed.detail == "card declined"
    done = orders.effect_done(failed)
    assert done.status == "done" and done.detail == "card declined"
    assert done.updated_at >= done.recorded_at


def test_stale_commit_settles_and_lists_until_reconciled(store: Any) -> None:
    orders = _orders(store)
    late = orders.intent("o-1", "charge")
    fx = orders.effect(late, "charge")
    orders.effect_done(fx)
    assert store.effects_to_reconcile() == []  # recorded, not settled: nothing to do yet
    assert orders.commit(orders.intent("o-1", "cancel"), {"status": "cancelled"}).committed

    out = orders.commit(late, {"status": "charged"})
    assert isinstance(out, Stale)
    (settled,) = store.effects_to_reconcile()
    assert settled.idempotency_key == fx.idempotency_key
    assert settled.outcome == "stale" and settled.status == "done" and settled.needs_reconcile

    # a redelivery of the stale task settles nothing twice and changes nothing
    assert isinstance(orders.commit(late, {"status": "charged"}), Stale)
    assert store.effects_to_reconcile() == [settled]

    marked = store.mark_reconciled(settled)
    assert marked.reconciled and not marked.needs_reconcile and marked.outcome == "stale"
    assert store.effects_to_reconcile() == []
    again = store.mark_reconciled(settled.idempotency_key)  # idempotent, by key too
    assert again.reconciled and again.outcome == "stale"
    assert store.effects_to_reconcile() == []


def test_committed_work_is_never_listed(store: Any) -> None:
    orders = _orders(store)
    intent = orders.intent("o-1", "charge")
    orders.effect_done(orders.effect(intent, "charge"))
    assert orders.commit(intent, {"status": "charged"}).committed
    assert isinstance(orders.commit(intent, {"status": "charged"}), fencing.Duplicate)
    assert store.effects_to_reconcile() == []
    (fx,) = orders.effects(intent)
    assert fx.outcome is None


def test_reconcile_handler_gets_the_settled_effects_once(store: Any) -> None:
    orders = _orders(store)
    late = orders.intent("o-1", "charge")
    fx = orders.effect(late, "charge")
    orders.effect_done(fx, detail={"charge_id": "ch_9"})
    orders.commit(orders.intent("o-1", "cancel"), {"status": "cancelled"})
    calls: list[tuple[str, int, tuple[Effect, ...]]] = []

    def refund(intent: Any, current: Any, effects: Any) -> None:
        calls.append((intent.id, current.version, tuple(effects)))

    out = orders.apply(late, lambda r: {"status": "charged"}, on_stale=Reconcile(refund))
    assert isinstance(out, Stale)
    assert len(calls) == 1
    intent_id, version, effects = calls[0]
    assert (intent_id, version) == (late.id, 2)
    assert [(e.idempotency_key, e.outcome, e.status, e.detail) for e in effects] == [
        (fx.idempotency_key, "stale", "done", {"charge_id": "ch_9"})
    ]
    assert [e.idempotency_key for e in store.effects_to_reconcile()] == [fx.idempotency_key]


def test_reconcile_handler_without_effects(store: Any) -> None:
    orders = _orders(store)
    late = orders.intent("o-1", "charge")
    orders.commit(orders.intent("o-1", "cancel"), {"status": "cancelled"})
    seen: list[Any] = []
    orders.apply(late, lambda r: {}, on_stale=Reconcile(lambda i, c, fx: seen.append(fx)))
    assert seen == [()]
    assert store.effects_to_reconcile() == []


def test_fenced_contended_and_missing_settle(store: Any) -> None:
    orders = _orders(store)
    orders.create("o-2", {"n": 0})
    orders.create("o-3", {"n": 0})

    # fenced: a newer lease holder took over and wrote
    old = store.acquire("orders/o-1", owner="a", ttl=0.2)
    fenced = orders.intent("o-1", "charge")
    orders.effect(fenced, "charge")
    import time

    time.sleep(0.3)
    new = store.acquire("orders/o-1", owner="b", ttl=30)
    assert orders.commit(orders.intent("o-1", "pack"), {"status": "packed"}, lease=new).committed
    assert isinstance(orders.commit(fenced, {"status": "x"}, lease=old), Stale | Fenced)
    new.release()

    # contended: Recompute runs out of attempts against a record that always moves
    busy = orders.intent("o-2", "bump")
    orders.effect(busy, "notify")

    def decide(record: Any) -> dict[str, Any]:
        orders.commit(orders.intent("o-2", "interfere"), {"n": record.state["n"] + 100})
        return {"n": record.state["n"] + 1}

    out = orders.apply(busy, decide, on_stale=Recompute(attempts=2, backoff=0))
    assert isinstance(out, Contended)

    # missing: the record was deleted after the decision
    gone = orders.intent("o-3", "ship")
    orders.effect(gone, "label")
    orders.delete("o-3")
    assert isinstance(orders.commit(gone, {"n": 1}), Missing)

    listed = {(e.key, e.name): e.outcome for e in store.effects_to_reconcile()}
    assert listed[("o-2", "notify")] == "contended"
    assert listed[("o-3", "label")] == "missing"
    assert listed[("o-1", "charge")] in ("stale", "fenced")  # stale: a newer write moved it


def test_an_expired_lease_leaves_the_effects_pending_and_a_newer_owner_settles_them(
    store: Any,
) -> None:
    """``Fenced(EXPIRED)`` is not final (the same intent can still commit): its effects
    stay pending, findable with ``pending_effects``; a newer owner's fence settles them."""
    orders = _orders(store)
    lease = store.acquire("orders/o-1", owner="a", ttl=0.2)
    intent = orders.intent("o-1", "charge")
    fx = orders.effect(intent, "charge")
    import time

    time.sleep(0.35)
    out = orders.commit(intent, {"status": "charged"}, lease=lease)
    assert isinstance(out, Fenced) and out.reason is fencing.FenceReason.EXPIRED
    assert store.effects_to_reconcile() == []
    (waiting,) = store.pending_effects(older_than=0)
    assert waiting.idempotency_key == fx.idempotency_key and waiting.outcome is None

    newer = store.acquire("orders/o-1", owner="b", ttl=30)
    out = orders.commit(intent, {"status": "charged"}, lease=lease)
    assert isinstance(out, Fenced) and out.reason is fencing.FenceReason.NEWER_OWNER
    (listed,) = store.effects_to_reconcile()
    assert listed.idempotency_key == fx.idempotency_key and listed.outcome == "fenced"
    newer.release()


def test_commit_many_settles_refused_items(store: Any) -> None:
    orders = _orders(store)
    orders.create("o-2", {"n": 0})
    late = orders.intent("o-1", "charge")
    fine = orders.intent("o-2", "bump")
    orders.effect(late, "charge")
    orders.effect(fine, "charge")
    orders.commit(orders.intent("o-1", "cancel"), {"status": "cancelled"})
    outs = orders.commit_many([(late, {"status": "x"}), (fine, {"n": 1})])
    assert [type(o) for o in outs] == [Stale, fencing.Committed]
    assert [(e.key, e.outcome) for e in store.effects_to_reconcile()] == [("o-1", "stale")]


def test_table_effects(store: Any, make_table: Any) -> None:
    accounts = make_table("accounts", rows=[{"id": 1, "total": 5}])
    late = accounts.intent(1, "debit")
    fx = accounts.effect(late, "payout")
    assert (fx.kind, fx.collection, fx.key) == ("table", "accounts", 1)
    assert fx.idempotency_key == effect_key("t:accounts", late.root_id, "payout")
    assert accounts.commit(accounts.intent(1, "credit"), {"total": 9}).committed
    assert isinstance(accounts.commit(late, {"total": 0}), Stale)
    (listed,) = store.effects_to_reconcile()
    assert (listed.kind, listed.key, listed.outcome) == ("table", 1, "stale")
    # an integer key and the same digits as a string key are different records
    assert (
        store.collection("accounts").effects(fencing.Intent.new("accounts", "1", 1, "debit")) == []
    )


def test_listing_is_oldest_first_and_limited(store: Any) -> None:
    orders = store.collection("orders")
    keys = []
    for n in range(5):
        orders.create(f"k{n}", {"n": 0})
        late = orders.intent(f"k{n}", "bump")
        keys.append(orders.effect(late, "fx").idempotency_key)
        orders.commit(orders.intent(f"k{n}", "move"), {"n": 1})
        orders.commit(late, {"n": 2})
    listed = store.effects_to_reconcile()
    assert [e.idempotency_key for e in listed] == keys
    assert [e.idempotency_key for e in store.effects_to_reconcile(limit=2)] == keys[:2]
    store.mark_reconciled(keys[0])
    assert [e.idempotency_key for e in store.effects_to_reconcile(limit=2)] == keys[1:3]


def test_concurrent_recording_makes_one_effect(store: Any, backend_name: str) -> None:
    orders = _orders(store)
    intent = orders.intent("o-1", "charge")
    results: list[Effect] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def record() -> None:
        try:
            barrier.wait()
            results.append(orders.effect(intent, "charge"))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=record) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len({(e.idempotency_key, e.recorded_at) for e in results}) == 1
    assert len(orders.effects(intent)) == 1


_NAME_RULE = (
    "is not allowed: use 1 to 128 letters, digits and '_ - . : /', starting with a letter or digit"
)
_KEY_RULE = "is not an effect's idempotency key (fx_ and 40 hex digits)"
_LIMIT_RULE = "limit must be an integer from 1 to 10000, not"


def _nested(depth: int) -> list[Any]:
    detail: list[Any] = []
    for _ in range(depth):
        detail = [detail]
    return detail


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (
            lambda o, i, s: o.effect(i, "bad name!"),
            fencing.InvalidIdentifier,
            re.escape(f"effect name 'bad name!' {_NAME_RULE}"),
        ),
        (
            lambda o, i, s: o.effect(i, ""),
            fencing.InvalidIdentifier,
            re.escape(f"effect name '' {_NAME_RULE}"),
        ),
        (
            lambda o, i, s: o.effect(i, 7),
            fencing.InvalidIdentifier,
            re.escape(f"effect name 7 {_NAME_RULE}"),
        ),
        (
            lambda o, i, s: o.effect(i, "charge", detail={1, 2}),
            fencing.InvalidState,
            re.escape("effect detail must be JSON-serialisable: ") + ".*set.*",
        ),
        (
            lambda o, i, s: o.effect(i, "charge", detail=float("nan")),
            fencing.InvalidState,
            re.escape("effect detail must be JSON-serialisable: ") + ".*float.*",
        ),
        (
            lambda o, i, s: o.effect(i, "charge", detail=_nested(100_000)),
            fencing.InvalidState,
            re.escape("effect detail is nested too deeply"),
        ),
        (
            lambda o, i, s: o.effect(i, "charge", detail="x" * 20_000),
            fencing.InvalidState,
            re.escape("effect detail is larger than 16384 bytes of JSON"),
        ),
        (  # one byte over: the quotes and 16,383 characters
            lambda o, i, s: o.effect(i, "charge", detail="x" * 16_383),
            fencing.InvalidState,
            re.escape("effect detail is larger than 16384 bytes of JSON"),
        ),
        (
            lambda o, i, s: o.effect(i, "charge", detail="\ud800"),
            fencing.InvalidState,
            re.escape("effect detail holds a lone surrogate"),
        ),
        (
            lambda o, i, s: o.effect("not an intent", "charge"),
            fencing.InvalidIntent,
            re.escape("expected an Intent, got str"),
        ),
        (
            lambda o, i, s: s.collection("other").effect(i, "charge"),
            fencing.InvalidIntent,
            re.escape("intent for collection 'orders' cannot commit to collection 'other'"),
        ),
        (
            lambda o, i, s: o.effect_done("fx_0"),
            fencing.InvalidInput,
            re.escape("expected an Effect, got str"),
        ),
        (
            lambda o, i, s: s.mark_reconciled("nope"),
            fencing.InvalidInput,
            re.escape(f"'nope' {_KEY_RULE}"),
        ),
        (
            lambda o, i, s: s.mark_reconciled("fx_" + "0" * 40),
            fencing.RecordNotFound,
            re.escape(f"no effect fx_{'0' * 40} in this store"),
        ),
        (
            lambda o, i, s: s.get_effect(12),
            fencing.InvalidInput,
            re.escape(f"12 {_KEY_RULE}"),
        ),
        (
            lambda o, i, s: s.effects_to_reconcile(limit=0),
            fencing.InvalidInput,
            re.escape(f"{_LIMIT_RULE} 0"),
        ),
        (
            lambda o, i, s: s.effects_to_reconcile(limit=True),
            fencing.InvalidInput,
            re.escape(f"{_LIMIT_RULE} True"),
        ),
        (
            lambda o, i, s: s.effects_to_reconcile(limit=10_001),
            fencing.InvalidInput,
            re.escape(f"{_LIMIT_RULE} 10001"),
        ),
        (
            lambda o, i, s: s.pending_effects(limit=10_001),
            fencing.InvalidInput,
            re.escape(f"{_LIMIT_RULE} 10001"),
        ),
    ],
    ids=[
        "name with a space",
        "empty name",
        "name not a string",
        "detail a set",
        "detail NaN",
        "detail too deep",
        "detail too large",
        "detail one byte over",
        "detail lone surrogate",
        "not an intent",
        "another collection",
        "mark not an effect",
        "key not an effect key",
        "no such effect",
        "get not a key",
        "limit 0",
        "limit True",
        "limit 10001",
        "pending limit 10001",
    ],
)
def test_bad_input_writes_nothing(
    store: Any, call: Any, error: type[Exception], message: str
) -> None:
    orders = _orders(store)
    intent = orders.intent("o-1", "charge")
    with pytest.raises(error) as raised:
        call(orders, intent, store)
    assert re.fullmatch(message, str(raised.value)), str(raised.value)
    assert orders.effects(intent) == []
    assert store.effects_to_reconcile() == []


def test_the_largest_limit_and_detail_are_taken(store: Any) -> None:
    orders = _orders(store)
    intent = orders.intent("o-1", "charge")
    assert store.effects_to_reconcile(limit=10_000) == []
    assert store.pending_effects(older_than=0, limit=10_000) == []
    # 16,384 bytes of JSON exactly: the quotes and 16,382 characters
    largest = orders.effect(intent, "charge", detail="x" * 16_382)
    assert len(largest.detail) == 16_382
    # compact JSON (no spaces after "," and ":"): 12,007 bytes, 18,007 with them
    listed = orders.effect(intent, "list", detail={"n": [1] * 6_000})
    assert listed.detail == {"n": [1] * 6_000}


def test_a_detail_is_stored_as_canonical_json(store: Any) -> None:
    """Keys sorted at every depth, whatever order they were given in: read back, the
    detail's keys come in that order."""
    orders = _orders(store)
    intent = orders.intent("o-1", "charge")
    fx = orders.effect(intent, "charge", detail={"b": 1, "a": {"d": 2, "c": 3}})
    (stored,) = orders.effects(intent)
    for read in (fx, stored, store.get_effect(fx.idempotency_key)):
        assert read.detail == {"a": {"c": 3, "d": 2}, "b": 1}
        assert list(read.detail) == ["a", "b"] and list(read.detail["a"]) == ["c", "d"]


def test_an_effect_as_a_dict(store: Any) -> None:
    orders = _orders(store)
    intent = orders.intent("o-1", "charge")
    fx = orders.effect(intent, "payment", detail={"amount": 10})
    assert fx.to_dict() == {
        "idempotency_key": effect_key("c:orders", intent.root_id, "payment"),
        "kind": "collection",
        "collection": "orders",
        "key": "o-1",
        "intent_id": intent.id,
        "transition": "charge",
        "name": "payment",
        "status": "pending",
        "detail": {"amount": 10},
        "outcome": None,
        "reconciled": False,
        "recorded_at": fx.recorded_at,
        "updated_at": fx.updated_at,
    }


def test_a_new_effect_row() -> None:
    """What every backend inserts: keyed by the work's root id; the name checked here too
    (a backend may be handed a row without the store's checks)."""
    intent = fencing.Intent("i-1~2", "orders_t", 7, 3, "ship", kind="table")
    assert new_effect_row("t:orders_t", intent, "label", '{"a":1}') == (
        effect_key("t:orders_t", "i-1", "label"),
        "t:orders_t",
        "7",
        "i-1",
        "ship",
        "label",
        "pending",
        '{"a":1}',
    )
    with pytest.raises(fencing.InvalidIdentifier) as raised:
        new_effect_row("t:orders_t", intent, "bad name!", None)
    assert str(raised.value) == f"effect name 'bad name!' {_NAME_RULE}"


def test_an_effect_from_a_stored_row() -> None:
    """Every backend reads its row through ``effect_from_row``: each column to its field."""
    row = (
        "fx_" + "a" * 40,
        "t:orders_t",
        "7",
        "i-1",
        "ship",
        "label",
        "failed",
        '{"why":"down"}',
        "stale",
        12.5,
        10.25,
        11.75,
    )
    assert effect_from_row(row) == Effect(
        idempotency_key="fx_" + "a" * 40,
        kind="table",
        collection="orders_t",
        key=7,
        intent_id="i-1",
        transition="ship",
        name="label",
        status="failed",
        detail={"why": "down"},
        outcome="stale",
        reconciled=True,
        recorded_at=10.25,
        updated_at=11.75,
    )


def test_marking_an_effect_of_another_collection_is_refused(store: Any) -> None:
    orders = _orders(store)
    fx = orders.effect(orders.intent("o-1", "charge"), "charge")
    with pytest.raises(fencing.InvalidInput):
        store.collection("other").effect_done(fx)
    assert orders.effects(orders.intent("o-1", "x")) == []
    assert store.get_effect(fx.idempotency_key).status == "pending"


def test_prune_forgets_finished_effects_and_keeps_open_ones(store: Any) -> None:
    import time

    orders = store.collection("orders")
    for key in ("a", "b", "c", "d"):
        orders.create(key, {"n": 0})
    waiting = orders.effect(orders.intent("d", "charge"), "charge")  # its work never ended
    done = orders.intent("a", "charge")  # its work commits: nothing to reconcile, ever
    fx_done = orders.effect_done(orders.effect(done, "charge"))
    assert orders.commit(done, {"n": 1}).committed
    open_, closed = orders.intent("b", "charge"), orders.intent("c", "charge")
    fx_open = orders.effect(open_, "charge")
    fx_closed = orders.effect(closed, "charge")
    for key, late in (("b", open_), ("c", closed)):
        orders.commit(orders.intent(key, "move"), {"n": 5})
        assert isinstance(orders.commit(late, {"n": 1}), Stale)
    store.mark_reconciled(fx_closed)

    store.prune(3600)  # nothing is an hour old
    assert store.get_effect(fx_done.idempotency_key) is not None
    assert store.get_effect(fx_closed.idempotency_key) is not None
    time.sleep(0.3)
    store.prune(0.1)
    assert store.get_effect(fx_done.idempotency_key) is None
    assert store.get_effect(fx_closed.idempotency_key) is None
    # its work may still end stale: kept, however old
    assert store.get_effect(waiting.idempotency_key) is not None
    kept = store.get_effect(fx_open.idempotency_key)  # needs reconciling: kept, however old
    assert kept is not None and kept.needs_reconcile
    assert [e.idempotency_key for e in store.effects_to_reconcile()] == [fx_open.idempotency_key]


def test_abandon_settles_what_is_not_settled(store: Any) -> None:
    orders = _orders(store)
    given_up = orders.intent("o-1", "charge")
    fx = orders.effect(given_up, "charge")
    (abandoned,) = orders.abandon(given_up)
    assert (abandoned.idempotency_key, abandoned.outcome) == (fx.idempotency_key, "abandoned")
    assert orders.abandon(given_up) == [abandoned]  # idempotent: settled once
    assert [e.outcome for e in store.effects_to_reconcile()] == ["abandoned"]
    late = orders.intent("o-1", "late")
    orders.effect(late, "email")
    orders.commit(orders.intent("o-1", "move"), {"status": "moved"})
    orders.commit(late, {"status": "late"})  # stale: settled as such, not abandoned later
    assert [e.outcome for e in orders.abandon(late)] == ["stale"]
    with pytest.raises(fencing.InvalidIntent):
        store.collection("other").abandon(given_up)


def test_pending_effects_are_those_of_work_that_never_ended(store: Any) -> None:
    import time

    orders = store.collection("orders")
    for key in ("a", "b", "c", "d"):
        orders.create(key, {"n": 0})
    vanished = orders.intent("a", "charge")  # charged, then the task was never seen again
    fx_vanished = orders.effect_done(orders.effect(vanished, "charge"))
    committed = orders.intent("b", "charge")
    orders.effect(committed, "charge")
    assert orders.commit(committed, {"n": 1}).committed
    settled = orders.intent("c", "charge")
    orders.effect(settled, "charge")
    orders.commit(orders.intent("c", "move"), {"n": 5})
    orders.commit(settled, {"n": 1})  # stale: listed by effects_to_reconcile instead
    marked = orders.intent("d", "charge")
    store.mark_reconciled(orders.effect(marked, "charge"))  # someone dealt with it

    assert store.pending_effects(older_than=3600) == []  # nothing is an hour old
    time.sleep(0.3)
    (stuck,) = store.pending_effects(older_than=0.1)
    assert stuck.idempotency_key == fx_vanished.idempotency_key and stuck.status == "done"
    assert store.pending_effects(older_than=0.1, limit=1) == [stuck]
    store.mark_reconciled(stuck)
    assert store.pending_effects(older_than=0.1) == []
    with pytest.raises(fencing.InvalidInput):
        store.pending_effects(older_than=-1)
    with pytest.raises(fencing.InvalidInput):
        store.pending_effects(older_than=float("nan"))
