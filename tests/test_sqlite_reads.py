"""SQLite's reads (issue 23): each runs in a deferred transaction, or none, never under
``BEGIN IMMEDIATE``: so a reader never waits for SQLite's write lock (another process's
long write, a caller's open transaction). With ``busy_timeout=0`` a read that took the
write lock would fail at once; here each one is made while another connection holds it.

And ``apply()``'s probe of a guarded table row is judged by SQLite, as the conditional
UPDATE compares (a column's affinity applies), not by Python's comparison.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fencing
from fencing import SKIP, Committed, Skipped, Stale

APPLIED: dict[str, str] = {}  # url -> the id of the intent its fixture committed
TABLE = "CREATE TABLE orders (id INTEGER PRIMARY KEY, version INTEGER NOT NULL, qty INTEGER)"


def guarded_orders(store: fencing.Store, path: Path) -> None:
    """Migrate the store, and make the guarded table ``orders`` with row 1 at version 1."""
    store.migrate()
    conn = sqlite3.connect(path)
    conn.execute(TABLE)
    conn.execute("INSERT INTO orders VALUES (1, 1, 5)")
    conn.commit()
    conn.close()
    store.guard_table("orders")


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    path = tmp_path / "reads.sqlite"
    url = f"sqlite:///{path}?busy_timeout=0"
    with fencing.open(url) as store:
        guarded_orders(store, path)
        orders = store.collection("orders")
        orders.create("o-1", {"n": 0})
        done = orders.commit(orders.intent("o-1", "one"), {"n": 1})
        assert isinstance(done, Committed) and done.intent is not None
        APPLIED[url] = done.intent.id
        orders.effect(orders.intent("o-1", "two"), "mail")
    yield url
    del APPLIED[url]


@contextlib.contextmanager
def another_writer(url: str) -> Iterator[None]:
    """Another connection holds SQLite's write lock meanwhile."""
    path = url.removeprefix("sqlite:///").split("?")[0]
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        conn.execute("ROLLBACK")
        conn.close()


def test_reads_never_wait_for_the_write_lock(url: str) -> None:
    with fencing.open(url) as store:
        lease = store.acquire("orders/o-1", owner="w", ttl=60)
        with another_writer(url):
            _read_everything(store, lease, APPLIED[url])


def test_a_store_opens_and_reads_while_another_connection_writes(url: str) -> None:
    """Opening checks the schema, and a table's first use reads its columns: neither
    takes the write lock."""
    with another_writer(url), fencing.open(url, migrate="check") as store:
        table: Any = store.table("orders")
        assert table.get(1).state == {"qty": 5}
        store.guard_table("orders")  # there already: nothing to write


def _read_everything(store: Any, lease: Any, applied_id: str) -> None:
    orders = store.collection("orders")
    assert orders.get("o-1").state == {"n": 1}
    applied = store.backend.applied(orders.target, "o-1", 5)
    assert [a.intent_id for a in applied] == [applied_id]
    answer = store.backend.lease_state("orders/o-1")
    assert answer.row.token == lease.token and answer.granted is False
    assert [e.name for e in store.pending_effects(older_than=0)] == ["mail"]
    assert store.effects_to_reconcile() == []
    assert store.backend.stats().leases_held == 1
    table = store.table("orders")
    assert table.get(1).state["qty"] == 5
    store.guard_table("orders")  # there already: nothing to write
    # apply()'s probe: unfenced, fenced, and of a guarded row; SKIP writes nothing
    for front, intent, held in (
        (orders, orders.intent("o-1", "a"), None),
        (orders, orders.intent("o-1", "b"), lease),
        (table, table.intent(1, "c", guard={"qty": 5}), None),
    ):
        assert isinstance(front.apply(intent, lambda r: SKIP, lease=held), Skipped)


def test_the_probe_compares_a_guard_as_sqlite_does(url: str) -> None:
    """``qty`` is an INTEGER column: SQLite takes the text ``'5'`` for 5 (its affinity),
    so the UPDATE applies; the probe must agree, or ``apply`` answers ``Stale`` for a
    commit that would apply. A guard the row does not hold is still ``Stale``."""
    with fencing.open(url) as store:
        table: Any = store.table("orders")
        applied = table.apply(table.intent(1, "a", guard={"qty": "5"}), lambda r: {"qty": 6})
        assert isinstance(applied, Committed), applied
        committed = table.commit(table.intent(1, "b", guard={"qty": "6"}), {"qty": 7})
        assert isinstance(committed, Committed), committed
        stale = table.apply(table.intent(1, "c", guard={"qty": "6"}), lambda r: {"qty": 8})
        assert isinstance(stale, Stale), stale
        assert table.get(1).state["qty"] == 7
