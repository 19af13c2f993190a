"""A refused commit on SQLite writes nothing (issue 21): no claim written and deleted
again, no transaction that ends in a sync of the WAL, no second write transaction to
settle effects the intent never recorded. A refusal was 160x the hand-written one at
``synchronous=FULL`` (``fencing bench --only refused``) because it did all three.

Whether anything was written is seen from another connection: ``PRAGMA data_version``
changes there when any other connection commits a change to the database file."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import fencing
from fencing import Committed, Duplicate, Fenced, Outcome, Stale

from .test_sqlite_reads import guarded_orders


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "refusals.sqlite"


@pytest.fixture
def store(path: Path) -> Iterator[fencing.Store]:
    with fencing.open(f"sqlite:///{path}") as store:
        guarded_orders(store, path)
        store.collection("jobs").create("j-1", {"n": 0})
        yield store


class Watcher:
    """Another connection on the same file: has anyone committed a change since?"""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.seen = self.version()

    def version(self) -> int:
        return int(self.conn.execute("PRAGMA data_version").fetchone()[0])

    def written(self) -> bool:
        now = self.version()
        changed, self.seen = now != self.seen, now
        return changed


@pytest.fixture
def watcher(path: Path, store: fencing.Store) -> Iterator[Watcher]:
    watcher = Watcher(path)
    yield watcher
    watcher.conn.close()


def test_the_watcher_sees_a_commit(store: fencing.Store, watcher: Watcher) -> None:
    jobs = store.collection("jobs")
    assert not watcher.written()
    assert isinstance(jobs.commit(jobs.intent("j-1", "bump"), {"n": 1}), Committed)
    assert watcher.written()


Refuse = Callable[[], Outcome]


def _collection_stale(store: fencing.Store) -> Refuse:
    jobs = store.collection("jobs")
    old = jobs.intent("j-1", "bump")
    assert isinstance(jobs.commit(jobs.intent("j-1", "first"), {"n": 1}), Committed)
    return lambda: jobs.commit(old, {"n": 2})


def _collection_duplicate(store: fencing.Store) -> Refuse:
    jobs = store.collection("jobs")
    intent = jobs.intent("j-1", "bump")
    assert isinstance(jobs.commit(intent, {"n": 1}), Committed)
    return lambda: jobs.commit(intent, {"n": 1})


def _collection_guard(store: fencing.Store) -> Refuse:
    jobs = store.collection("jobs")
    return lambda: jobs.commit(jobs.intent("j-1", "bump", guard={"n": 4}), {"n": 1})


def _table_stale(store: fencing.Store) -> Refuse:
    orders = store.table("orders")
    old = orders.intent(1, "ship")
    assert isinstance(orders.commit(orders.intent(1, "first"), {"qty": 6}), Committed)
    return lambda: orders.commit(old, {"qty": 7})


def _table_duplicate(store: fencing.Store) -> Refuse:
    orders = store.table("orders")
    intent = orders.intent(1, "ship")
    assert isinstance(orders.commit(intent, {"qty": 6}), Committed)
    return lambda: orders.commit(intent, {"qty": 6})


def _table_guard(store: fencing.Store) -> Refuse:
    orders = store.table("orders")
    return lambda: orders.commit(orders.intent(1, "ship", guard={"qty": 4}), {"qty": 6})


def _fenced(store: fencing.Store) -> Refuse:
    jobs = store.collection("jobs")
    old = store.acquire("job", owner="old", ttl=0.05)
    intent = jobs.intent("j-1", "bump")
    store.acquire("job", owner="new", ttl=30, wait=5)  # once the old one ran out
    return lambda: jobs.commit(intent, {"n": 1}, lease=old)


def _fenced_table(store: fencing.Store) -> Refuse:
    orders = store.table("orders")
    old = store.acquire("job", owner="old", ttl=0.05)
    intent = orders.intent(1, "ship")
    store.acquire("job", owner="new", ttl=30, wait=5)
    return lambda: orders.commit(intent, {"qty": 6}, lease=old)


REFUSALS: dict[str, tuple[Callable[[fencing.Store], Refuse], type]] = {
    "collection stale": (_collection_stale, Stale),
    "collection duplicate": (_collection_duplicate, Duplicate),
    "collection guard": (_collection_guard, Stale),
    "table stale": (_table_stale, Stale),
    "table duplicate": (_table_duplicate, Duplicate),
    "table guard": (_table_guard, Stale),
    "fenced collection": (_fenced, Fenced),
    "fenced table": (_fenced_table, Fenced),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_refused_commit_writes_nothing(case: str, store: fencing.Store, watcher: Watcher) -> None:
    setup, expected = REFUSALS[case]
    refuse = setup(store)
    watcher.written()  # (what the setup wrote)
    for _ in range(2):  # the first refusal, and the same one again
        outcome = refuse()
        assert isinstance(outcome, expected), outcome
        assert not watcher.written(), f"{case}: a refusal wrote to the database"


@pytest.mark.parametrize("kind", ["collection", "table"])
def test_a_stale_refusal_writes_nothing(kind: str, store: fencing.Store, watcher: Watcher) -> None:
    front = store.collection("jobs") if kind == "collection" else store.table("orders")
    key = "j-1" if kind == "collection" else 1
    state = {"n": 5} if kind == "collection" else {"qty": 9}
    old = front.intent(key, "late")
    assert isinstance(front.commit(front.intent(key, "first"), state), Committed)
    watcher.written()
    refused = front.commit(old, state)
    assert isinstance(refused, Stale)
    assert refused.current is not None and refused.current.version == old.expected_version + 1
    assert not watcher.written(), "a stale refusal wrote to the database"
    many = front.commit_many([(old, state), (front.intent(key, "late-too"), state)])
    assert isinstance(many[0], Stale) and isinstance(many[1], Committed)
    assert watcher.written()  # (the batch's good item is written, its stale one refused)


def test_a_stale_refusal_still_settles_its_recorded_effects(
    store: fencing.Store, watcher: Watcher
) -> None:
    jobs = store.collection("jobs")
    old = jobs.intent("j-1", "late")
    jobs.effect(old, "mail")
    assert isinstance(jobs.commit(jobs.intent("j-1", "first"), {"n": 1}), Committed)
    watcher.written()
    assert isinstance(jobs.commit(old, {"n": 2}), Stale)
    assert watcher.written()  # the effect's outcome
    (effect,) = jobs.effects(old)
    assert effect.outcome == "stale"
    assert isinstance(jobs.commit(old, {"n": 2}), Stale)
    assert not watcher.written()  # settled already: nothing more to write
    assert jobs.effects(old) == [effect]


def test_settling_an_intent_without_effects_needs_no_write_lock(path: Path) -> None:
    """The settle after a refusal first reads, outside any transaction: another
    connection's write lock does not hold it up (a ``BEGIN IMMEDIATE`` to read would wait
    for the lock, here ``busy_timeout`` 0.2 s, and then fail)."""
    with fencing.open(f"sqlite:///{path}?busy_timeout=0.2") as store:
        jobs = store.collection("jobs")
        jobs.create("j-1", {"n": 0})
        intent = jobs.intent("j-1", "late")
        settled = store.collection("other")
        settled.create("o-1", {"n": 0})
        done = settled.intent("o-1", "mailed")
        settled.effect(done, "mail")
        settled.commit(settled.intent("o-1", "first"), {"n": 1})
        assert isinstance(settled.commit(done, {"n": 2}), Stale)  # its effect settled
        holder = sqlite3.connect(path, isolation_level=None)
        try:
            holder.execute("BEGIN IMMEDIATE")
            backend = store._live()  # the settle step alone
            assert backend.settle_effects(jobs.target.scope, intent.id, "stale") == []
            (effect,) = backend.settle_effects(settled.target.scope, done.id, "stale")
            assert effect.outcome == "stale"  # settled already: read, not written
        finally:
            holder.execute("ROLLBACK")
            holder.close()
