"""Superseded and debounced outbox rows, on every store that has an outbox, sync and
async: a superseding send settles the older waiting rows of its key and task in its own
transaction (never published, never claimed, no longer holding the key back), leaves a
row under a live claim to be published first, keeps per-key order with plain sends,
changes nothing when its transaction rolls back; a debounced row is claimed only once
its key has been quiet ``debounce`` seconds, or ``max_wait`` after its burst began, and
holds back only its own key. (The relay end to end: tests/contrib/test_relay_supersede.py.)"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import fencing
from fencing import InvalidInput, OutboxMessage

from ._backends import named_case_url
from ._lenders import LENDERS
from .test_migrate_applied import _current, _runner

OUTBOX_STORES = {"memory", "sqlite-memory", "sqlite-file", "postgresql", "mysql"}
pytestmark = pytest.mark.backends(only=lambda name: name in OUTBOX_STORES)


class Spec:
    """A fenced task's outbox message (as ``fencing.contrib`` builds it), by task name."""

    def __init__(self, name: str, kind: str = "celery") -> None:
        self.name, self.kind = name, kind

    def outbox_message(
        self, task: Any, what: Any, transition: Any, *, guard: Any, options: dict[str, Any]
    ) -> OutboxMessage:
        intent = what if isinstance(what, fencing.Intent) else what.intent(transition)
        key = f"{intent.kind}:{intent.collection}:{intent.key}"
        return OutboxMessage(self.kind, self.name, intent.to_json(), key, None, options)


class Task:
    def __init__(self, name: str, kind: str = "celery") -> None:
        self.fencing = Spec(name, kind)


SHIP, BILL = Task("shop.ship"), Task("shop.bill")
MAIL = Task("shop.mail", "rq")  # another queue kind: another relay's rows


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


def test_an_older_row_of_another_queue_kind_holds_its_key_back(store: Any) -> None:
    """Per key, a claim takes a row only with every older unsettled row of its key: an
    older row of another queue kind (another relay's) holds the key's later rows back
    while it is pending or claimed, and no longer once it is sent or dead; other keys
    go on."""
    a, b = _records(store, "a", "b")
    mail = store.outbox.send(MAIL, a, "mail")
    ship = store.outbox.send(SHIP, a, "ship")
    other = store.outbox.send(SHIP, b, "ship")
    assert _drain(store) == [other.id]  # a's ship waits for a's older mail
    claim = store.outbox.claim("rq-relay", "rq", ttl=30)
    assert [r.id for r in claim.rows] == [mail.id]
    assert _drain(store) == []  # claimed, not settled: still held back
    assert store.outbox.done(claim, claim.rows) == 1
    assert _drain(store) == [ship.id]
    again = store.outbox.send(MAIL, a, "mail")
    later = store.outbox.send(SHIP, a, "ship")
    claim = store.outbox.claim("rq-relay", "rq", ttl=30)
    assert store.outbox.bury(claim, claim.rows, "poison") == 1  # dead: settled
    assert [r.id for r in store.outbox.dead()] == [again.id]
    assert _drain(store) == [later.id]


def test_a_row_under_a_lapsed_claim_goes_first_with_its_keys_later_rows(store: Any) -> None:
    """A live claim on a row of a key holds the key; once it lapses (its relay died, or
    paused), the next claim takes that row again first, then the key's later rows."""
    (a,) = _records(store, "a")
    first = store.outbox.send(SHIP, a, "ship")
    store.outbox.claim("r1", "celery", ttl=0.2)
    later = store.outbox.send(SHIP, a, "ship")
    assert store.outbox.claim("r2", "celery", ttl=30).rows == ()  # r1's claim is live
    deadline = time.monotonic() + 30
    while not (rows := store.outbox.claim("r2", "celery", ttl=30).rows):
        assert time.monotonic() < deadline, "the claim never lapsed"
        time.sleep(0.05)
    assert [r.id for r in rows] == [first.id, later.id]


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
        {"debounce": 1, "max_wait": 10**9},
    ):
        with pytest.raises(InvalidInput):
            store.outbox.send(SHIP, a, "ship", **bad)
    assert store.outbox.stats().pending == 1 and store.outbox.stats().superseded == 0


# -- in the caller's transaction ------------------------------------------------------------
@pytest.mark.backends(only=lambda name: name in LENDERS)
@pytest.mark.apis(only=["sync"])
def test_a_superseding_send_rolled_back_changes_nothing(
    store: Any, store_url: str, backend_name: str
) -> None:
    (a,) = _records(store, "a")
    older = [store.outbox.send(SHIP, a, "ship") for _ in range(2)]
    conn = LENDERS[backend_name].connect(store_url)
    try:
        view = store.using(conn)
        view.outbox.send(SHIP, a, "ship", supersede=True, debounce=30)
        conn.rollback()  # rolled back: the older rows are as they were
        assert [r.id for r in store.outbox.pending()] == [r.id for r in older]
        assert store.outbox.stats().superseded == 0
        newer = view.outbox.send(SHIP, a, "ship", supersede=True)
        assert store.outbox.stats().superseded == 0  # not committed yet
        conn.commit()
    finally:
        conn.close()
    assert store.outbox.stats().superseded == 2
    assert _drain(store) == [newer.id]


@pytest.mark.backends(only=lambda name: name in LENDERS and LENDERS[name].aconnect is not None)
@pytest.mark.apis(only=["sync"])
def test_an_async_superseding_send_in_the_callers_transaction(
    store_url: str, backend_name: str
) -> None:
    lender = LENDERS[backend_name]
    assert lender.aconnect is not None

    async def main() -> None:
        store = await fencing.open_async(store_url)
        a = await store.collection("orders").create("a", {"n": 0})
        old = await store.outbox.send(SHIP, a, "ship")
        conn = await lender.aconnect(store_url)
        try:
            await store.using(conn).outbox.send(SHIP, a, "ship", supersede=True)
            await conn.rollback()
            assert [r.id for r in await store.outbox.pending()] == [old.id]
            newer = await store.using(conn).outbox.send(SHIP, a, "ship", supersede=True)
            await conn.commit()
            assert [r.id for r in await store.outbox.pending()] == [newer.id]
            assert (await store.outbox.stats()).superseded == 1
        finally:
            closing = conn.close()  # aiomysql's close() is not a coroutine
            if closing is not None:
                await closing
            await store.close()

    asyncio.run(main())


# -- debounce ---------------------------------------------------------------------------------
class Clock:
    """The memory store's clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.backends(only=lambda name: name == "memory")
@pytest.mark.apis(only=["sync"])
def test_a_debounced_key_is_published_once_quiet_or_at_max_wait() -> None:
    clock = Clock()
    store = fencing.open("memory://", clock=clock)
    try:
        a, b = _records(store, "a", "b")
        first = store.outbox.send(SHIP, a, "ship", debounce=5, max_wait=20)
        assert (first.due_at, first.burst_at) == (1005.0, 1000.0)
        plain = store.outbox.send(SHIP, b, "ship")  # another key: not held back
        clock.now = 1004.9
        assert _drain(store) == [plain.id]
        clock.now = 1005.0  # quiet for 5 s: due
        assert _drain(store) == [first.id]
        # a burst, a send every 3 s: each pushes the key's row 5 s on, up to 20 s
        # after the burst's first send
        sent = []
        for t in range(0, 19, 3):  # 2000, 2003, ..., 2018
            clock.now = 2000.0 + t
            sent.append(store.outbox.send(SHIP, a, "ship", debounce=5, max_wait=20))
            assert _drain(store) == []
        assert (sent[-1].due_at, sent[-1].burst_at) == (2020.0, 2000.0)
        assert [r.id for r in store.outbox.pending()] == [sent[-1].id]
        clock.now = 2019.99
        assert _drain(store) == []
        clock.now = 2020.0  # max_wait: published though the key never went quiet
        assert _drain(store) == [sent[-1].id]
        assert store.outbox.stats().superseded == len(sent) - 1
    finally:
        store.close()


@pytest.mark.backends(only=lambda name: name == "memory")
@pytest.mark.apis(only=["sync"])
def test_a_row_not_yet_due_holds_back_its_keys_later_rows_only() -> None:
    clock = Clock()
    store = fencing.open("memory://", clock=clock)
    try:
        a, b = _records(store, "a", "b")
        before = store.outbox.send(BILL, a, "bill")  # earlier than the debounced row: goes
        waiting = store.outbox.send(SHIP, a, "ship", debounce=10)
        after = store.outbox.send(BILL, a, "bill")  # later: waits behind it, in order
        other = store.outbox.send(SHIP, b, "ship")
        assert _drain(store) == [before.id, other.id]
        clock.now += 10
        assert _drain(store) == [waiting.id, after.id]
        assert waiting.due_at == waiting.created_at + 10 and after.due_at is None
    finally:
        store.close()


@pytest.mark.backends(only=lambda name: name in OUTBOX_STORES - {"memory"})
def test_debounce_by_the_stores_clock(store: Any) -> None:
    """On the SQL stores, by their own clock: a row is due ``debounce`` after it was
    written, capped at ``max_wait`` after the burst's first send; not claimed before, and
    claimed once due (waited for by claiming, not by sleeping a fixed time)."""
    a, b = _records(store, "a", "b")
    before = store.outbox.send(BILL, a, "bill")  # earlier in the key: not held back
    first = store.outbox.send(SHIP, a, "ship", debounce=3600, max_wait=7200)
    assert first.due_at == pytest.approx(first.created_at + 3600)
    assert first.burst_at == first.created_at
    after = store.outbox.send(BILL, a, "bill")  # later in the key: waits behind first
    other = store.outbox.send(SHIP, b, "ship")
    assert _drain(store) == [before.id, other.id]  # b does not wait for a
    assert _drain(store) == []
    second = store.outbox.send(SHIP, a, "ship", debounce=3600, max_wait=0.5)
    assert second.burst_at == first.created_at  # the burst began with the first send
    assert second.due_at == pytest.approx(max(second.created_at, first.created_at + 0.5))
    deadline = time.monotonic() + 30
    published: list[int] = []
    while second.id not in published:  # first superseded: after goes, second once due
        assert time.monotonic() < deadline, "the capped row never became due"
        published += _drain(store)
    assert published == [after.id, second.id]
    assert store.outbox.stats().superseded == 1
    assert store.outbox.stats().pending == 0


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
