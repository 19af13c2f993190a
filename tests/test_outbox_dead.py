"""Dead outbox rows on every store that has an outbox, sync and async: a row given up as
dead (``outbox.bury``) keeps its payload, attempts, strikes, last error and ``dead_at``,
is never claimed again, holds no key back, is counted in ``stats().dead``, never pruned;
``retry`` puts it back to pending, ``drop`` deletes it, every id or none, with typed
errors for unknown ids and rows not dead. Then schema 4 -> 5 on SQLite, PostgreSQL and
MariaDB: a store of the previous release gains the columns and keeps its rows. (The
relay's ``dead_after``: tests/contrib/test_relay_dead.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import fencing
from fencing import InvalidInput, OutboxRowNotDead, UnknownOutboxRow

from ._backends import named_case_url
from .test_migrate_applied import _current, _runner
from .test_outbox import OUTBOX_STORES, TASK, _records
from .test_outbox_supersede import _BEFORE_SUPERSEDED

pytestmark = pytest.mark.backends(only=lambda name: name in OUTBOX_STORES)


def _three(store: Any) -> tuple[list[Any], Any]:
    """a1, a2 (key a) and b1 sent and claimed by one relay, a2 given back (held)."""
    a, b = _records(store, "a", "b")
    rows = [
        store.outbox.send(TASK, a, "ship", countdown=3),
        store.outbox.send(TASK, a, "bill"),
        store.outbox.send(TASK, b, "ship"),
    ]
    claim = store.outbox.claim("r1", "celery", limit=10, ttl=30)
    assert [r.id for r in claim.rows] == [r.id for r in rows]
    assert store.outbox.release(claim, [rows[1]], "held back") == 1
    return rows, claim


def test_a_dead_row_keeps_its_fields_and_no_longer_holds_its_key_back(store: Any) -> None:
    (a1, a2, b1), claim = _three(store)
    assert store.outbox.release(claim, [b1], "try later", strike=True) == 1
    assert store.outbox.bury(claim, [a1], "NotRegistered: shop.ship") == 1
    assert store.outbox.bury(claim, [a1], "again") == 0  # no longer the claim's
    (dead,) = store.outbox.dead()
    assert dead.id == a1.id and dead.state == "dead" and dead.dead
    assert (dead.payload, dead.options, dead.task) == (a1.payload, {"countdown": 3}, a1.task)
    assert (dead.attempts, dead.strikes, dead.last_error) == (1, 1, "NotRegistered: shop.ship")
    assert dead.claim_token is None and dead.sent_at is None
    assert dead.dead_at is not None and dead.dead_at >= a1.created_at
    assert store.outbox.dead(kind="rq") == []
    (b_back,) = [r for r in store.outbox.pending() if r.id == b1.id]
    assert (b_back.attempts, b_back.strikes, b_back.state) == (1, 1, "pending")

    stats = store.outbox.stats()
    assert (stats.pending, stats.dead) == (2, 1)  # a2 and b1 pending; a1 dead, not pending
    assert store.outbox.stats(kind="celery").dead == 1 and store.outbox.stats(kind="rq").dead == 0
    assert [r.id for r in store.outbox.pending()] == [a2.id, b1.id]
    # a's next row goes on without its dead one; the dead row is never claimed again
    again = store.outbox.claim("r2", "celery", limit=10, ttl=30)
    assert [r.id for r in again.rows] == [a2.id, b1.id]
    assert store.outbox.done(again, again.rows) == 2
    assert store.outbox.claim("r3", "celery").rows == ()
    assert store.outbox.prune(older_than=0) == 2  # the sent ones, never the dead one
    assert [r.id for r in store.outbox.dead()] == [a1.id]


def test_retry_puts_dead_rows_back_and_drop_deletes_them(store: Any) -> None:
    (a1, a2, b1), claim = _three(store)
    assert store.outbox.bury(claim, [a1, b1], "poison") == 2
    assert store.outbox.retry([a1]) == 1
    (back,) = [r for r in store.outbox.pending() if r.id == a1.id]
    assert (back.attempts, back.strikes, back.dead_at, back.state) == (0, 0, None, "pending")
    assert back.last_error == "poison"  # the history stays readable
    # back in its place: a1 goes before a2 again
    claim = store.outbox.claim("r2", "celery", limit=10, ttl=30)
    assert [r.id for r in claim.rows] == [a1.id, a2.id]
    assert store.outbox.drop(store.outbox.dead()) == 1  # OutboxRow values are taken too
    assert store.outbox.dead() == [] and store.outbox.stats().dead == 0
    assert [r.id for r in store.outbox.pending()] == [a1.id, a2.id]


def test_retry_and_drop_take_every_row_or_none(store: Any) -> None:
    (a1, a2, _), claim = _three(store)
    store.outbox.bury(claim, [a1], "poison")
    with pytest.raises(UnknownOutboxRow) as unknown:
        store.outbox.retry([a1.id, 999_999])
    assert unknown.value.unknown == (999_999,)
    with pytest.raises(OutboxRowNotDead) as not_dead:
        store.outbox.drop([a1.id, a2.id])
    assert not_dead.value.not_dead == (a2.id,)
    with pytest.raises(OutboxRowNotDead):
        store.outbox.retry(a2.id)
    # nothing changed, not even for the dead row named beside them
    assert [r.id for r in store.outbox.dead()] == [a1.id]
    assert store.outbox.stats().pending == 2
    assert isinstance(unknown.value, LookupError) and isinstance(not_dead.value, InvalidInput)
    for bad in ([], [0], [True], ["1"], None):
        with pytest.raises(InvalidInput):
            store.outbox.retry(bad)
    with pytest.raises(InvalidInput):
        store.outbox.dead(limit=0)
    with pytest.raises(InvalidInput):
        store.outbox.dead(kind="kafka")
    assert store.outbox.drop([a1.id, a1.id]) == 1  # an id named twice is one row


# -- schema 4 -> 5 (MySQL: 4 or 5 -> 6) ---------------------------------------------------
# the outbox as schema version 4 made it, from the table this fencing made (first as
# the version before superseded rows had it)
_V4 = {
    "sqlite-file": (
        *_BEFORE_SUPERSEDED["sqlite-file"],
        "ALTER TABLE fencing_outbox DROP COLUMN strikes",
        "ALTER TABLE fencing_outbox DROP COLUMN dead_at",
    ),
    "postgresql": (
        *_BEFORE_SUPERSEDED["postgresql"],
        "ALTER TABLE fencing_outbox DROP COLUMN strikes, DROP COLUMN dead_at",
    ),
    "mysql": (
        *_BEFORE_SUPERSEDED["mysql"],
        "ALTER TABLE fencing_outbox DROP KEY fencing_outbox_dead,"
        " MODIFY unsent_kind VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin"
        " GENERATED ALWAYS AS (IF(sent_at IS NULL, kind, NULL)) STORED,"
        " MODIFY unsent_key VARCHAR(512) GENERATED ALWAYS AS (IF(sent_at IS NULL, okey, NULL))"
        " STORED, DROP COLUMN strikes, DROP COLUMN dead_at",
    ),
}


# the store and the version it had before the dead rows (MySQL/MariaDB: its version 5,
# covering indexes, came before the dead rows' version 6)
_OLD = [("sqlite-file", 4), ("postgresql", 4), ("mysql", 4), ("mysql", 5)]


@pytest.fixture(params=_OLD, ids=[f"{n}-from-{v}" for n, v in _OLD])
def sql_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str, int]]:
    name, old = request.param
    for found in named_case_url(SimpleNamespace(param=name), tmp_path):
        yield (*found, old)


def test_an_outbox_before_dead_rows_gains_them_on_migrate(
    sql_url: tuple[str, str, int],
) -> None:
    name, url, version = sql_url
    with fencing.open(url) as old:
        (a,) = _records(old, "a")
        first = old.outbox.send(TASK, a, "ship")  # rows the old schema will hold
        second = old.outbox.send(TASK, a, "bill")
        run = _runner(name, old, url)
        for statement in _V4[name]:
            run(statement)
        run(f"UPDATE fencing_schema SET version = {version}")
    columns = {
        "sqlite-file": "SELECT COUNT(*) FROM pragma_table_info('fencing_outbox')",
        "postgresql": "SELECT COUNT(*) FROM information_schema.columns"
        " WHERE table_name = 'fencing_outbox' AND table_schema = current_schema()",
        "mysql": "SELECT COUNT(*) FROM information_schema.COLUMNS"
        " WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'fencing_outbox'",
    }[name]
    before = run(columns)[0][0]

    with fencing.open(url) as store:  # opening migrates
        store.migrate()  # and again: nothing more to do
        assert run("SELECT version FROM fencing_schema") == [(_current(name),)]
        assert _current(name) == (7 if name == "mysql" else 6)
        assert run(columns)[0][0] == before + 2 + 3  # and the superseded rows' three
        (kept, later) = store.outbox.pending()
        assert (kept.id, kept.strikes, kept.dead_at, kept.payload) == (
            first.id,
            0,
            None,
            first.payload,
        )
        claim = store.outbox.claim("r", "celery")
        assert store.outbox.bury(claim, [kept], "poison") == 1
        assert store.outbox.release(claim, [later], "held back") == 1
        assert store.outbox.stats().dead == 1
        # the dead row no longer holds its key back, on the upgraded table too
        claim = store.outbox.claim("r", "celery")
        assert later.id == second.id and [r.id for r in claim.rows] == [second.id]


@pytest.mark.backends(only=lambda name: name.startswith("redis"))
def test_a_store_without_an_outbox_table_has_no_dead_rows_either(store: Any) -> None:
    for call in (
        lambda: store.outbox.dead(),
        lambda: store.outbox.retry([1]),
        lambda: store.outbox.drop([1]),
        lambda: store.outbox.bury(1, [1], "poison"),
    ):
        with pytest.raises(fencing.ConfigurationError, match="SQL stores"):
            call()


@pytest.mark.backends(only=lambda name: name == "postgresql")
@pytest.mark.apis(only=["sync"])
def test_a_row_put_back_wakes_the_listening_relays(store: Any) -> None:
    (a1, _, _), claim = _three(store)
    store.outbox.bury(claim, [a1], "poison")
    waker = store.backend.outbox_waiter(kind="celery")
    try:
        waker.listen()
        assert waker.wait(0.05) is False
        store.outbox.retry([a1])
        assert waker.wait(30) is True  # a relay waiting on LISTEN claims it at once
        with pytest.raises(OutboxRowNotDead):
            store.outbox.retry([a1])
        assert waker.wait(0.2) is False  # a refused retry notifies nothing
    finally:
        waker.close()
