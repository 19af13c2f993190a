"""Superseded and debounced outbox rows, on every store that has an outbox, sync and
async: a superseding send settles the older waiting rows of its key and task in its own
transaction (never published, never claimed, no longer holding the key back), leaves a
row under a live claim to be published first, keeps per-key order with plain sends,
changes nothing when its transaction rolls back; a debounced row is claimed only once
its key has been quiet ``debounce`` seconds, or ``max_wait`` after its burst began, and
holds back only its own key. (The relay end to end: tests/contrib/test_relay_supersede.py.)"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import fencing
from fencing import InvalidInput, OutboxMessage

from ._backends import named_case_url
from .test_migrate_applied import _current, _runner

OUTBOX_STORES = {"memory", "sqlite-memory", "sqlite-file", "postgresql", "mysql"}
pytestmark = pytest.mark.backends(only=lambda name: name in OUTBOX_STORES)


class Spec:
    """A fenced task's outbox message (as ``fencing.contrib`` builds it), by task name."""

    def __init__(self, name: str) -> None:
        self.name = name

    def outbox_message(
        self, task: Any, what: Any, transition: Any, *, guard: Any, options: dict[str, Any]
    ) -> OutboxMessage:
        intent = what if isinstance(what, fencing.Intent) else what.intent(transition)
        key = f"{intent.kind}:{intent.collection}:{intent.key}"
        return OutboxMessage("celery", self.name, intent.to_json(), key, None, options)


class Task:
    def __init__(self, name: str) -> None:
        self.fencing = Spec(name)


SHIP, BILL = Task("shop.ship"), Task("shop.bill")


def _records(store: Any, *keys: str) -> list[Any]:
    orders = store.collection("orders")
    return [orders.create(k, {"n": 0}) for k in keys]


def _drain(store: Any, relay: str = "r") -> list[int]:
    """Claim and mark sent until nothing is claimable: the ids, in publish order."""
    published: list[int] = []
    while rows := store.outbox.claim(relay, "celery", limit=7, ttl=30).rows:
        claim_token = rows[0].claim_token
        published += [r.id for r in rows]
        assert store.outbox.done(claim_token, rows) == len(rows)
    return published


def test_a_burst_of_superseding_sends_leaves_one_row(store: Any) -> None:
    a, b = _records(store, "a", "b")
    other = store.outbox.send(SHIP, b, "ship", supersede=True)
    rows = [store.outbox.send(SHIP, a, "ship", supersede=True) for _ in range(100)]
    stats = store.outbox.stats()
    assert (stats.pending, stats.superseded) == (2, 99)
    assert [r.id for r in store.outbox.pending()] == [other.id, rows[-1].id]
    assert _drain(store) == [other.id, rows[-1].id]
    assert store.outbox.stats().superseded == 99
    assert store.outbox.prune(older_than=0) == 101  # superseded rows go like sent ones
    assert store.outbox.stats().superseded == 0


def test_only_the_same_key_and_task_is_superseded_and_order_holds(store: Any) -> None:
    a, b = _records(store, "a", "b")
    s1 = store.outbox.send(SHIP, a, "ship")  # plain: superseded by a later superseding send
    b1 = store.outbox.send(BILL, a, "bill")  # another task of the key: kept
    s2 = store.outbox.send(SHIP, b, "ship", supersede=True)  # another key: kept
    s3 = store.outbox.send(SHIP, a, "ship", supersede=True)
    s4 = store.outbox.send(SHIP, a, "ship")  # plain after: kept, after s3
    b2 = store.outbox.send(BILL, a, "bill", supersede=True)  # supersedes b1 only
    assert store.outbox.stats().superseded == 2
    assert [r.id for r in store.outbox.pending()] == [s2.id, s3.id, s4.id, b2.id]
    assert _drain(store) == [s2.id, s3.id, s4.id, b2.id]
    assert s1.id < b1.id  # (both settled without a publish)


def test_a_claimed_row_is_published_and_the_newer_one_follows(store: Any) -> None:
    (a,) = _records(store, "a")
    first = store.outbox.send(SHIP, a, "ship", supersede=True)
    claim = store.outbox.claim("r1", "celery", ttl=30)
    assert [r.id for r in claim.rows] == [first.id]
    newer = store.outbox.send(SHIP, a, "ship", supersede=True)  # first is on its way
    assert store.outbox.stats().superseded == 0
    assert store.outbox.claim("r2", "celery").rows == ()  # the key waits for r1
    assert store.outbox.done(claim, claim.rows) == 1
    newest = store.outbox.send(SHIP, a, "ship", supersede=True)  # supersedes newer
    assert _drain(store) == [newest.id]
    assert store.outbox.stats().superseded == 1 and newer.id < newest.id


def test_a_row_whose_claim_lapsed_is_superseded_and_its_claim_marks_nothing(store: Any) -> None:
    (a,) = _records(store, "a")
    store.outbox.send(SHIP, a, "ship")
    claim = store.outbox.claim("r1", "celery", ttl=0.1)
    time.sleep(0.25)  # r1 pauses past its claim
    newer = store.outbox.send(SHIP, a, "ship", supersede=True)
    assert store.outbox.done(claim, claim.rows) == 0
    assert store.outbox.release(claim, claim.rows, "late") == 0
    assert _drain(store) == [newer.id]


def test_a_dead_row_is_not_superseded(store: Any) -> None:
    (a,) = _records(store, "a")
    store.outbox.send(SHIP, a, "ship")
    claim = store.outbox.claim("r1", "celery")
    assert store.outbox.bury(claim, claim.rows, "poison") == 1
    newer = store.outbox.send(SHIP, a, "ship", supersede=True)
    assert [r.id for r in store.outbox.dead()] == [claim.rows[0].id]
    assert store.outbox.stats().superseded == 0
    assert _drain(store) == [newer.id]


def test_settings_are_checked_before_anything_is_written(store: Any) -> None:
    (a,) = _records(store, "a")
    store.outbox.send(SHIP, a, "ship")
    for bad in (
        {"supersede": "yes"},
        {"supersede": False, "debounce": 1},
        {"max_wait": 5},
        {"debounce": -1},
        {"debounce": float("nan")},
        {"debounce": True},
        {"debounce": 5, "max_wait": 1},
        {"debounce": 1, "max_wait": 10**9},
    ):
        with pytest.raises(InvalidInput):
            store.outbox.send(SHIP, a, "ship", **bad)
    assert store.outbox.stats().pending == 1 and store.outbox.stats().superseded == 0


# -- schema 5 -> 6 (MySQL/MariaDB: 6 -> 7) ------------------------------------------------
# the outbox as the version before superseded rows made it, from the table this fencing
# made (MySQL/MariaDB: dropping due_at takes it out of fencing_outbox_key too)
_BEFORE_SUPERSEDED = {
    "sqlite-file": (
        "DROP INDEX fencing_outbox_superseded",
        "ALTER TABLE fencing_outbox DROP COLUMN superseded_at",
        "ALTER TABLE fencing_outbox DROP COLUMN due_at",
        "ALTER TABLE fencing_outbox DROP COLUMN burst_at",
    ),
    "postgresql": (
        "ALTER TABLE fencing_outbox DROP COLUMN superseded_at, DROP COLUMN due_at,"
        " DROP COLUMN burst_at",
    ),
    "mysql": (
        "ALTER TABLE fencing_outbox DROP KEY fencing_outbox_superseded,"
        " DROP COLUMN superseded_at, DROP COLUMN due_at, DROP COLUMN burst_at",
    ),
}
_PREVIOUS = {"sqlite-file": 5, "postgresql": 5, "mysql": 6}


@pytest.fixture(params=sorted(_PREVIOUS))
def old_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    yield from named_case_url(SimpleNamespace(param=request.param), tmp_path)


def test_an_outbox_before_superseded_rows_gains_them_on_migrate(old_url: tuple[str, str]) -> None:
    name, url = old_url
    with fencing.open(url) as old:
        a, b = _records(old, "a", "b")
        first = old.outbox.send(SHIP, a, "ship")  # rows the old schema will hold
        other = old.outbox.send(SHIP, b, "ship")
        run = _runner(name, old, url)
        for statement in _BEFORE_SUPERSEDED[name]:
            run(statement)
        run(f"UPDATE fencing_schema SET version = {_PREVIOUS[name]}")
    with pytest.raises(fencing.StoreNotMigrated):
        fencing.open(url, migrate="check").close()
    with fencing.open(url) as store:  # opening migrates
        store.migrate()  # and again: nothing more to do
        assert run("SELECT version FROM fencing_schema") == [(_current(name),)]
        assert _current(name) == _PREVIOUS[name] + 1
        kept = store.outbox.pending()[0]
        assert (kept.id, kept.superseded_at, kept.due_at, kept.burst_at) == (
            first.id,
            None,
            None,
            None,
        )
        newer = store.outbox.send(SHIP, a, "ship", supersede=True)
        assert store.outbox.stats().superseded == 1
        assert _drain(store) == [other.id, newer.id]
