"""The outbox's contract on every store that has one, sync and async: rows written in
order, claimed in order without splitting a key between live claims, tokens that only
grow, marks and give-backs only under the claim that holds a row, expired claims taken
over (the paused claimer then marks nothing), stats, listing, pruning, bad input refused
before anything is written, and a send through ``store.using`` that is the caller's to
commit or roll back. (The relay and the queue integrations: tests/contrib.)"""

from __future__ import annotations

import re
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
        intent = what if isinstance(what, fencing.Intent) else what.intent(transition, guard=guard)
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


class Verbatim:
    """A fenced task whose message is the one given, as it is (to try bad ones)."""

    def __init__(self, message: object) -> None:
        self.fencing = self
        self.message = message

    def outbox_message(self, *args: Any, **kwargs: Any) -> object:
        return self.message


def _message(**fields: Any) -> OutboxMessage:
    given = {"kind": "celery", "task": "shop.ship", "payload": "p", "key": "k"} | fields
    return OutboxMessage(**given)


_NAME_RULE = (
    "is not allowed: use 1 to 128 letters, digits and '_ - . : /', starting with a letter or digit"
)
_UNICODE = re.escape("outbox text is not valid unicode: 'utf-8' codec can't encode character")
_TASK = re.escape("outbox task must be 1 to 512 characters")
_KEY = re.escape("outbox key must be 1 to 512 characters")
_PAYLOAD = re.escape("an outbox payload is a non-empty string (the intent's JSON or token)")
_MAPPING = re.escape("outbox send options are keyword arguments (a mapping of names)")
_OPTIONS_SIZE = re.escape("outbox send options are at most 16384 bytes of JSON")


@pytest.mark.parametrize(
    ("message", "error"),
    [
        ("nope", re.escape("an outbox message is an OutboxMessage, not str")),
        (
            _message(kind="kafka"),
            re.escape(
                "outbox queue kind must be one of ('celery', 'rq', 'dramatiq', 'arq'), not 'kafka'"
            ),
        ),
        (_message(task=""), _TASK),
        (_message(task="t" * 513), _TASK),
        (_message(task="a\x00b"), _TASK),
        (_message(task=5), _TASK),
        (_message(task="\ud800"), _UNICODE + ".*"),
        (_message(key=""), _KEY),
        (_message(key="k" * 513), _KEY),
        (_message(key="a\x00b"), _KEY),
        (_message(key=None), _KEY),
        (_message(key="\udfff"), _UNICODE + ".*"),
        (_message(queue="no spaces"), re.escape(f"queue name 'no spaces' {_NAME_RULE}")),
        (_message(payload=""), _PAYLOAD),
        (_message(payload=5), _PAYLOAD),
        (_message(payload="\ud800"), _UNICODE + ".*"),
        (
            _message(payload="p" * (256 * 1024 + 1)),
            re.escape("an outbox payload is at most 262144 bytes"),
        ),
        (
            _message(payload="é" * (128 * 1024 + 1)),
            re.escape("an outbox payload is at most 262144 bytes"),
        ),
        (_message(options=[("a", 1)]), _MAPPING),
        (_message(options={1: 2}), _MAPPING),
        (
            _message(options={"a": object()}),
            re.escape("outbox send options must be JSON values: ") + ".*object.*",
        ),
        # {"a":"..."}: 8 bytes and the string's; one over
        (_message(options={"a": "x" * 16_377}), _OPTIONS_SIZE),
        (_message(options={"a": "é" * 8_189}), _OPTIONS_SIZE),
    ],
    ids=[
        "not a message",
        "kind",
        "task empty",
        "task 513",
        "task NUL",
        "task not text",
        "task surrogate",
        "key empty",
        "key 513",
        "key NUL",
        "key None",
        "key surrogate",
        "queue",
        "payload empty",
        "payload not text",
        "payload surrogate",
        "payload one byte over",
        "payload two bytes over",
        "options not a mapping",
        "options key not a name",
        "options not JSON",
        "options one byte over",
        "options two bytes over",
    ],
)
def test_a_bad_message_is_refused_with_what_is_wrong(
    store: Any, message: object, error: str
) -> None:
    (a,) = _records(store, "a")
    with pytest.raises(InvalidInput) as raised:
        store.outbox.send(Verbatim(message), a, "ship")
    assert re.fullmatch(error, str(raised.value)), str(raised.value)
    assert store.outbox.stats().pending == 0


def test_the_largest_message_is_taken_as_it_was_sent(store: Any) -> None:
    """Each bound is inclusive; options are stored as compact JSON, keys sorted."""
    (a,) = _records(store, "a")
    largest = _message(
        task="t" * 512, key="k" * 512, payload="é" * (128 * 1024), options={"a": "x" * 16_376}
    )
    row = store.outbox.send(Verbatim(largest), a, "ship")
    assert (row.task, row.key, row.payload) == (largest.task, largest.key, largest.payload)
    assert row.options == {"a": "x" * 16_376}
    smallest = store.outbox.send(Verbatim(_message(task="t", key="k", queue="q")), a, "ship")
    assert (smallest.task, smallest.key, smallest.queue) == ("t", "k", "q")
    ordered = store.outbox.send(Verbatim(_message(options={"b": 1, "a": {"d": 2, "c": 3}})), a, "x")
    for row in (ordered, store.outbox.pending()[-1]):
        assert list(row.options) == ["a", "b"] and list(row.options["a"]) == ["c", "d"]
    assert store.outbox.stats().pending == 3


def test_send_hands_the_guard_to_the_fenced_task(store: Any) -> None:
    (a,) = _records(store, "a")
    row = store.outbox.send(TASK, a, "ship", guard={"n": 0})
    assert fencing.Intent.from_json(row.payload).guard == {"n": 0}
    with pytest.raises(InvalidInput) as raised:
        store.outbox.send(object(), a, "ship")
    assert str(raised.value) == (
        "outbox.send() takes a fenced task (fenced_task, fenced_job, fenced_actor or"
        " fenced_function of fencing.contrib), not object"
    )


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ({"relay": "bad name!"}, re.escape(f"relay name 'bad name!' {_NAME_RULE}")),
        (
            {"kind": "kafka"},
            re.escape("queue kind must be one of ('celery', 'rq', 'dramatiq', 'arq'), not 'kafka'"),
        ),
        ({"limit": 0}, re.escape("a claim takes 1 to 10000 rows")),
        ({"limit": 10_001}, re.escape("a claim takes 1 to 10000 rows")),
        ({"limit": True}, re.escape("a claim takes 1 to 10000 rows")),
        ({"limit": 5.0}, re.escape("a claim takes 1 to 10000 rows")),
        ({"ttl": True}, re.escape("a claim's ttl is a number of seconds")),
        ({"ttl": "30"}, re.escape("a claim's ttl is a number of seconds")),
        ({"ttl": float("nan")}, re.escape("a claim's ttl is a number of seconds")),
        ({"ttl": float("inf")}, re.escape("a claim's ttl is a number of seconds")),
        ({"ttl": 0.09}, re.escape("a claim's ttl is from 0.1 second to one day")),
        ({"ttl": 86_400.5}, re.escape("a claim's ttl is from 0.1 second to one day")),
    ],
    ids=[
        "relay",
        "kind",
        "limit 0",
        "limit 10001",
        "limit True",
        "limit 5.0",
        "ttl True",
        "ttl text",
        "ttl NaN",
        "ttl inf",
        "ttl 0.09",
        "ttl 86400.5",
    ],
)
def test_a_bad_claim_is_refused_with_what_is_wrong(
    store: Any, args: dict[str, Any], error: str
) -> None:
    (a,) = _records(store, "a")
    row = store.outbox.send(TASK, a, "ship")
    claim = {"relay": "r", "kind": "celery", "limit": 100, "ttl": 30.0} | args
    relay, kind = claim.pop("relay"), claim.pop("kind")
    with pytest.raises(InvalidInput) as raised:
        store.outbox.claim(relay, kind, **claim)
    assert re.fullmatch(error, str(raised.value)), str(raised.value)
    # nothing was claimed: the row is still there to claim
    assert [r.id for r in store.outbox.claim("r", "celery").rows] == [row.id]


def test_the_claim_bounds_are_inclusive(store: Any) -> None:
    (a,) = _records(store, "a")
    row = store.outbox.send(TASK, a, "ship")
    widest = store.outbox.claim("r", "celery", limit=10_000, ttl=86_400)
    assert [r.id for r in widest.rows] == [row.id]
    assert widest.until - widest.now == pytest.approx(86_400)
    store.outbox.release(widest, widest.rows)
    narrowest = store.outbox.claim("r", "celery", limit=1, ttl=0.1)
    assert [r.id for r in narrowest.rows] == [row.id]
    assert narrowest.until - narrowest.now == pytest.approx(0.1)


def test_retry_and_drop_say_which_rows_they_cannot_take(store: Any) -> None:
    (a,) = _records(store, "a")
    row = store.outbox.send(TASK, a, "ship")
    for bad in (5.5, [0], [row.id, -1], [True]):
        with pytest.raises(InvalidInput) as raised:
            store.outbox.retry(bad)
        assert str(raised.value) == "rows are OutboxRow values or their ids (positive integers)"
    for verb in ("retry", "drop"):
        with pytest.raises(fencing.OutboxRowNotDead) as not_dead:
            getattr(store.outbox, verb)(row)
        assert str(not_dead.value) == (
            f"cannot {verb} outbox row(s) [{row.id}]: not dead (only a dead row is put back"
            " or dropped; nothing changed)"
        )
    assert [r.id for r in store.outbox.pending()] == [row.id]
