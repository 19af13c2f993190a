"""Small I/O-free rules of effects and the outbox, at their edges: the predicates every
backend is held to, and the checks of what a caller names. Written for mutants that
``make mutate`` found surviving (mutation/REPORT.md): each case pins one edge.
"""

from __future__ import annotations

from typing import Any

import pytest

from fencing import InvalidInput
from fencing._effects import Effect, EffectQuery, check_effect_key, effect_key, pending, prunable
from fencing._errors import OutboxRowNotDead, UnknownOutboxRow
from fencing._outbox import MAX_CLAIM, OutboxRow, check_dead, check_ids, claimable

HEX40 = "0123456789abcdef" * 2 + "01234567"


def effect(**fields: Any) -> Effect:
    base: dict[str, Any] = {
        "idempotency_key": "fx_" + HEX40,
        "kind": "collection",
        "collection": "orders",
        "key": "o-1",
        "intent_id": "i-1",
        "transition": "ship",
        "name": "charge",
        "status": "done",
        "updated_at": 100.0,
    }
    return Effect(**{**base, **fields})


def test_an_effect_key_is_fx_and_40_lowercase_hex_digits() -> None:
    assert check_effect_key("fx_" + HEX40) == "fx_" + HEX40
    assert check_effect_key(effect_key("c:orders", "root", "charge")).startswith("fx_")
    for bad in (
        "fy_" + HEX40,  # the right length, the wrong prefix
        "fx_" + HEX40[:-1],  # one digit short
        "fx_" + HEX40 + "0",  # one too many
        "fx_g" + HEX40[1:],  # the first digit is not hex
        "fx_" + HEX40[:-1] + "g",  # the last one is not
        "fx_" + HEX40.upper(),  # upper case
        "fx_" + "X" * 40,
        None,
        43,
    ):
        with pytest.raises(InvalidInput, match="is not an effect's idempotency key"):
            check_effect_key(bad)


def test_pending_and_prunable_are_strictly_before_the_cutoff() -> None:
    untouched = effect(status="pending", updated_at=100.0)
    assert pending(untouched, 100.5, committed=False)
    assert not pending(untouched, 100.0, committed=False)  # at the cutoff: not yet
    assert not pending(untouched, 100.5, committed=True)  # its work committed
    assert not pending(effect(outcome="stale"), 100.5, committed=False)
    assert not pending(effect(reconciled=True), 100.5, committed=False)
    # prunable: committed work's effect, or a reconciled one, untouched before the cutoff
    assert prunable(untouched, 100.5, committed=True)
    assert not prunable(untouched, 100.0, committed=True)
    assert not prunable(untouched, 100.5, committed=False)
    reconciled = effect(outcome="stale", reconciled=True, updated_at=100.0)
    assert prunable(reconciled, 100.5, committed=False)
    assert not prunable(reconciled, 100.0, committed=False)
    assert not prunable(effect(outcome="stale"), 100.5, committed=True)  # to reconcile


def test_the_pending_query_takes_only_unsettled_effects() -> None:
    query = EffectQuery(pending_for=60.0)
    assert query.matches(effect(status="pending"))
    assert not query.matches(effect(outcome="stale"))  # settled, not reconciled
    assert not query.matches(effect(reconciled=True))  # reconciled, no outcome
    assert not query.matches(effect(outcome="stale", reconciled=True))


def row(id: int, key: str = "k", **fields: Any) -> OutboxRow:
    base: dict[str, Any] = {
        "id": id,
        "kind": "celery",
        "task": "ship",
        "queue": None,
        "payload": "{}",
        "options": {},
        "key": key,
        "created_at": 10.0,
        "attempts": 0,
        "last_error": None,
        "claim_token": None,
        "claimed_by": None,
        "claimed_until": None,
        "sent_at": None,
    }
    return OutboxRow(**{**base, **fields})


def test_check_ids_takes_rows_or_positive_ids_sorted_once() -> None:
    assert check_ids(3) == (3,)
    assert check_ids(row(4)) == (4,)
    assert check_ids([5, row(2), 5, 1]) == (1, 2, 5)
    assert check_ids(range(1, MAX_CLAIM + 1))[-1] == MAX_CLAIM
    for bad in (0, -1, True, "1", b"1", [1, "2"], [1.0], object()):
        with pytest.raises(InvalidInput, match=r"OutboxRow values or their ids \(positive"):
            check_ids(bad)
    for count in (0, MAX_CLAIM + 1):
        with pytest.raises(InvalidInput, match=f"name 1 to {MAX_CLAIM} rows"):
            check_ids(range(1, count + 1))


def test_check_dead_names_the_unknown_rows_first_then_the_live_ones() -> None:
    check_dead((1, 2), {1: True, 2: True}, "retry")  # all dead: fine
    with pytest.raises(UnknownOutboxRow, match=r"cannot drop outbox row\(s\) \[3\]: no such") as e:
        check_dead((1, 2, 3), {1: True, 2: False}, "drop")
    assert (e.value.unknown, e.value.not_dead) == ((3,), (2,))
    with pytest.raises(
        OutboxRowNotDead, match=r"cannot retry outbox row\(s\) \[2\]: not dead"
    ) as d:
        check_dead((1, 2), {1: True, 2: False}, "retry")
    assert (d.value.unknown, d.value.not_dead) == ((), (2,))


def test_a_row_s_age_and_what_a_claim_takes() -> None:
    assert row(1, created_at=10.0).age(12.5) == 2.5
    assert row(1, created_at=10.0).age(9.0) == 0.0  # the store's clock went back: never < 0
    rows = [
        row(1, "a"),
        row(2, "b", claimed_until=20.0),  # claimed until 20: its key is held at 15
        row(3, "b"),
        row(4, "c", sent_at=5.0),  # sent
        row(5, "d", kind="rq"),  # another queue kind
        row(6, "e", claimed_until=15.0),  # lapsed exactly at 15: free
        row(7, "f"),
    ]
    assert [r.id for r in claimable(rows, "celery", 15.0, 10)] == [1, 6, 7]
    assert [r.id for r in claimable(rows, "celery", 15.0, 2)] == [1, 6]
    assert [r.id for r in claimable(rows, "celery", 25.0, 10)] == [1, 2, 3, 6, 7]


def test_what_an_old_snapshot_may_explain() -> None:
    """``snapshot_may_explain``: a refusal judged on a snapshot older than the latest
    commit may be an artefact (absent, older than the intent, refused by the lease row);
    a newer version, a duplicate, a newer fence hold whatever the snapshot's age."""
    from fencing._request import CommitRequest, CommitResult, Target, snapshot_may_explain
    from fencing._rules import LeaseRef, Status
    from fencing._values import Intent, Record

    target = Target("collection", "orders")

    def ask(status: Status, version: int | None, expected: int | None, **kw: Any) -> bool:
        guard = None if expected is not None else {"s": 1}
        intent = Intent("i", "orders", "o", expected, "t", guard=guard)
        fence, token = kw.get("fence", 0), kw.get("token")
        lease = None if token is None else LeaseRef("orders/o", token)
        record = None if version is None else Record("orders", "o", version, fence, {})
        request = CommitRequest(target, intent, {}, "{}", lease)
        return snapshot_may_explain(request, CommitResult(status, record))

    assert ask(Status.MISSING, None, 3)  # absent in the snapshot
    assert not ask(Status.APPLIED, None, 3)
    assert ask(Status.STALE, 2, 3)  # older than the intent: the snapshot is
    assert not ask(Status.STALE, 3, 3) and not ask(Status.STALE, 4, 3)  # moved on for real
    assert ask(Status.STALE, 4, None)  # a guard-only intent: no version to compare
    for fenced in (Status.FENCED_NEWER, Status.FENCED_EXPIRED):
        assert ask(fenced, 3, 3, fence=5, token=5)  # refused by the lease row
        assert ask(fenced, 3, 3, fence=4, token=5)
        assert not ask(fenced, 3, 3, fence=6, token=5)  # a newer fence on the record
        assert not ask(fenced, 3, 3, fence=0, token=None)
    assert not ask(Status.DUPLICATE, 3, 3)
    assert not ask(Status.APPLIED, 4, 3)


def test_an_outbox_row_from_a_stored_row() -> None:
    """``outbox_row``: each column converted as a store hands it back, NULLs kept."""
    from fencing._outbox import outbox_row

    stored = (
        "7", "celery", "ship", 5, 3, '{"a": 1}', 42, "10.5", "2", 9,
        "4", 8, "20", "30", "1", "40", "50", "60", "70", "an extra column",
    )  # fmt: skip
    assert outbox_row(stored) == OutboxRow(
        7, "celery", "ship", "5", "3", {"a": 1}, "42", 10.5, 2, "9",
        4, "8", 20.0, 30.0, 1, 40.0, 50.0, 60.0, 70.0,
    )  # fmt: skip
    nulls = (1, "rq", "t", None, "{}", None, "k", 1, 0, None, None, None, None, None, 0)
    nulls += (None,) * 4
    assert outbox_row(nulls) == OutboxRow(
        1, "rq", "t", None, "{}", {}, "k", 1.0, 0, None, None, None, None, None, 0,
        None, None, None, None,
    )  # fmt: skip
    as_dict = outbox_row(
        (1, "rq", "t", None, "{}", {"b": 2}, "k", 1, 0, None) + (None,) * 4 + (0,) + (None,) * 4
    )
    assert as_dict.options == {"b": 2}
    assert outbox_row(
        (1, "rq", "t", None, "{}", b'{"c": 3}', "k", 1, 0) + (None,) * 5 + (0,) + (None,) * 4
    ).options == {"c": 3}


def test_sqlite_quotes_identifiers_part_by_part_and_caches_per_shape() -> None:
    from fencing._request import Target
    from fencing.backends.sqlite import statements as sql

    assert sql.quote("orders") == '"orders"'
    assert sql.quote('we"ird') == '"we""ird"'
    assert sql.quote("main.orders") == '"main"."orders"'
    statements = sql.Statements()
    target = Target("table", "main.orders", "id")
    fence = sql.FENCE_OF_ROW
    row = f'SELECT t.*, {fence} FROM "main"."orders" AS t WHERE t."id" = ?'
    probe = (
        f'SELECT t.*, {fence}, EXISTS ({sql.IS_APPLIED}) FROM "main"."orders" AS t WHERE t."id" = ?'
    )
    for _ in range(2):  # built, then from the cache: one statement per shape
        assert statements.row(target, probe=False) == row
        assert statements.row(target, probe=True) == probe
    other = Target("table", "items", "sku")
    assert statements.row(other, probe=False) == row.replace('"main"."orders"', '"items"').replace(
        '"id"', '"sku"'
    )
    by_code = Target("table", "items", "code")  # the same table, another key column
    assert statements.row(by_code, probe=False).endswith('AS t WHERE t."code" = ?')


def test_a_frozen_state_and_an_intent_s_json_say_what_is_wrong() -> None:
    import fencing
    from fencing._values import FrozenState

    state = FrozenState({"a": 1})
    message = (
        "a record's state is read-only: change a copy, {**record.state, ...} or dict(record.state)"
    )
    for change in (
        lambda: state.__setitem__("a", 2),
        lambda: state.update(b=2),
        lambda: state.pop("a"),
    ):
        with pytest.raises(TypeError) as refused:
            change()
        assert str(refused.value) == message
    good = fencing.Intent("i", "orders", "o", 1, "ship").to_json()
    for constant in ("NaN", "Infinity", "-Infinity"):
        with pytest.raises(fencing.InvalidIntent) as bad:
            fencing.Intent.from_json(
                good.replace('"expected_version":1', f'"expected_version":{constant}')
            )
        assert str(bad.value).endswith(f"(invalid intent: {constant} is not allowed)")
