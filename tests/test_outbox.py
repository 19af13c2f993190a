"""The outbox's contract on every store that has one, sync and async: rows written in
order, claimed in order without splitting a key between live claims, tokens that only
grow, marks and give-backs only under the claim that holds a row, expired claims taken
over (the paused claimer then marks nothing), stats, listing, pruning, bad input refused
before anything is written, and a send through ``store.using`` that is the caller's to
commit or roll back. (The relay and the queue integrations: tests/contrib.)"""

from __future__ import annotations

import time
from typing import Any

import pytest

import fencing
from fencing import ConfigurationError, InvalidInput, OutboxMessage

OUTBOX_STORES = {"memory", "sqlite-memory", "sqlite-file", "postgresql", "mysql"}
pytestmark = pytest.mark.backends(only=lambda name: name in OUTBOX_STORES)


class Spec:
    """What a fenced task of ``fencing.contrib`` gives ``outbox.send``: its message."""

    def outbox_message(
        self, task: Any, what: Any, transition: Any, *, guard: Any, options: dict[str, Any]
    ) -> OutboxMessage:
        intent = what if isinstance(what, fencing.Intent) else what.intent(transition)
        queue = options.pop("queue", None)
        key = f"{intent.kind}:{intent.collection}:{intent.key}"
        return OutboxMessage("celery", "shop.ship", intent.to_json(), key, queue, options)


class Task:
    fencing = Spec()


TASK = Task()


def _records(store: Any, *keys: str) -> list[Any]:
    orders = store.collection("orders")
    return [orders.create(k, {"n": 0}) for k in keys]


def test_sent_rows_are_claimed_in_order_a_key_never_split_between_live_claims(store: Any) -> None:
    a, b = _records(store, "a", "b")
    sent = [
        store.outbox.send(TASK, a, "ship", countdown=5),
        store.outbox.send(TASK, a, "bill"),
        store.outbox.send(TASK, b, "ship", queue="fast"),
    ]
    assert [r.id for r in sent] == sorted(r.id for r in sent)
    assert sent[0].options == {"countdown": 5} and sent[2].queue == "fast"
    assert store.outbox.stats().pending == 3
    first = store.outbox.claim("r1", "celery", limit=1, ttl=30)
    assert [r.id for r in first.rows] == [sent[0].id]
    second = store.outbox.claim("r2", "celery", limit=10, ttl=30)
    # a's next row waits for r1's claim on a's first: only b's row
    assert [r.id for r in second.rows] == [sent[2].id]
    assert second.token > first.token
    assert store.outbox.done(first, first.rows) == 1
    third = store.outbox.claim("r2", "celery", limit=10, ttl=30)
    assert [r.id for r in third.rows] == [sent[1].id]
    assert store.outbox.claim("r3", "celery").rows == ()
    assert store.outbox.claim("r3", "rq").rows == ()


def test_marks_and_give_backs_only_under_the_claim_that_holds_a_row(store: Any) -> None:
    (a,) = _records(store, "a")
    row = store.outbox.send(TASK, a, "ship")
    claim = store.outbox.claim("r1", "celery", ttl=0.1)
    time.sleep(0.25)  # r1 pauses past its claim
    newer = store.outbox.claim("r2", "celery", ttl=30)
    assert [r.id for r in newer.rows] == [row.id]
    assert store.outbox.done(claim, [row]) == 0  # r1's claim was taken over: nothing
    assert store.outbox.release(claim, [row], "late") == 0
    assert store.outbox.release(newer, [row], "broker down") == 1
    (pending,) = store.outbox.pending()
    assert (pending.attempts, pending.last_error, pending.claim_token) == (1, "broker down", None)
    again = store.outbox.claim("r2", "celery")
    assert again.token > newer.token and store.outbox.done(again, again.rows) == 1
    assert store.outbox.done(again, again.rows) == 0  # already sent
    assert store.outbox.pending() == [] and store.outbox.stats().pending == 0


def test_stats_listing_and_pruning(store: Any) -> None:
    (a,) = _records(store, "a")
    rows = [store.outbox.send(TASK, a, f"t{i}") for i in range(3)]
    stats = store.outbox.stats(kind="celery")
    assert stats.pending == 3 and stats.oldest_age >= 0
    assert store.outbox.stats(kind="arq").pending == 0
    assert [r.id for r in store.outbox.pending(limit=2)] == [r.id for r in rows[:2]]
    claim = store.outbox.claim("r", "celery")
    store.outbox.done(claim, claim.rows[:2])
    assert store.outbox.prune(older_than=3600) == 0  # sent just now: kept
    assert store.outbox.prune(older_than=0) == 2  # never an unsent row
    assert [r.id for r in store.outbox.pending()] == [rows[2].id]


def test_bad_input_is_refused_before_anything_is_written(store: Any) -> None:
    (a,) = _records(store, "a")
    with pytest.raises(InvalidInput, match="fenced task"):
        store.outbox.send(object(), a, "ship")
    with pytest.raises(InvalidInput, match="JSON"):
        store.outbox.send(TASK, a, "ship", when=object())
    for bad in (float("nan"), float("inf"), -float("inf")):  # not JSON: a poison row
        with pytest.raises(InvalidInput, match="JSON"):
            store.outbox.send(TASK, a, "ship", countdown=bad)
        with pytest.raises(InvalidInput, match="JSON"):
            store.outbox.send(TASK, a, "ship", headers={"retry": [1, bad]})
    with pytest.raises(InvalidInput):
        store.outbox.send(TASK, a, "ship", queue="no spaces allowed")
    with pytest.raises(InvalidInput, match="kind"):
        store.outbox.claim("r", "kafka")
    with pytest.raises(InvalidInput, match="rows"):
        store.outbox.claim("r", "celery", limit=0)
    with pytest.raises(InvalidInput, match="ttl"):
        store.outbox.claim("r", "celery", ttl=float("nan"))
    with pytest.raises(InvalidInput):
        store.outbox.done(0, [1])
    with pytest.raises(InvalidInput):
        store.outbox.done(1, [True])
    assert store.outbox.stats().pending == 0


@pytest.mark.backends(only=lambda name: name == "sqlite-file")
@pytest.mark.apis(only=["sync"])
def test_a_send_through_using_is_the_callers_to_commit(store: Any, store_url: str) -> None:
    import sqlite3

    (a,) = _records(store, "a")
    conn = sqlite3.connect(store_url.removeprefix("sqlite:///").split("?")[0])
    try:
        view = store.using(conn)
        view.outbox.send(TASK, a, "ship")
        assert store.outbox.stats().pending == 0  # not committed yet
        conn.rollback()
        assert store.outbox.stats().pending == 0  # rolled back: no row, nothing to send
        view.outbox.send(TASK, a, "ship")
        conn.commit()
        assert store.outbox.stats().pending == 1
    finally:
        conn.close()


@pytest.mark.backends(only=lambda name: name.startswith("redis"))
def test_a_store_without_an_outbox_table_refuses(store: Any) -> None:
    (a,) = _records(store, "a")
    with pytest.raises(ConfigurationError, match="SQL stores"):
        store.outbox.send(TASK, a, "ship")
    with pytest.raises(ConfigurationError, match="SQL stores"):
        store.outbox.claim("r", "celery")
