"""``fencing inspect`` (a collection record or a guarded table's row, its lease and the
intents applied to it) and ``fencing stats`` (per collection and table), with the two
reads of the backend contract under them, ``applied`` and ``stats``, on every store."""

from __future__ import annotations

import inspect
import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest

import fencing
from fencing._cli import main
from fencing._outbox import OutboxMessage
from fencing._request import ScopeStats, Target, effect_counts, scope_stats

from ._backends import CASES, TABLE_COLUMNS


def _backend_call(store: Any, name: str, *args: Any) -> Any:
    """Call the store's backend (sync, or async through the test's loop)."""
    result = getattr(store.backend, name)(*args)
    if inspect.iscoroutine(result):
        result = store._loop.run(result)
    return result


def _history(store: Any) -> tuple[list[str], Any]:
    """orders/o-1 committed 4 times; an effect of a stale intent (needs reconciling) and
    one done. The ids committed, oldest first, and the lease still held on orders_t/7."""
    orders = store.collection("orders")
    record = orders.create("o-1", {"n": 0})
    committed = []
    for n in range(3):
        intent = record.intent(f"step{n}")
        record = orders.commit(intent, {"n": n + 1}).record
        committed.append(intent.id)
    late = orders.intent("o-1", "late")
    orders.effect(late, "charge")
    first = orders.intent("o-1", "first")
    assert orders.commit(first, {"n": 9}).committed
    committed.append(first.id)
    assert isinstance(orders.commit(late, {"n": 10}), fencing.Stale)
    mailed = orders.intent("o-1", "mail")
    orders.effect_done(orders.effect(mailed, "email"))
    return committed, late


def _row_lease(store: Any, table: Any) -> str:
    """The lease named after row 7 (on Redis, in the row's Cluster slot)."""
    layout = getattr(store.backend, "layout", None)
    return "orders_t/7" if layout is None else str(layout.tag(table.target, 7))


def _table_commit(store: Any) -> tuple[Any, Any, str]:
    table = store.table("orders_t", key="id", version="version")
    lease = store.acquire(_row_lease(store, table), owner="worker-1", ttl=300)
    intent = table.intent(7, "ship")
    assert table.commit(intent, {"status": "shipped"}, lease=lease).committed
    return table, lease, intent.id


def test_applied_and_stats_on_every_backend(store: Any, make_table: Any) -> None:
    committed, _ = _history(store)
    make_table("orders_t", [{"id": 7, "status": "new", "total": 1}])
    table, lease, table_id = _table_commit(store)

    newest = _backend_call(store, "applied", Target("collection", "orders"), "o-1", 2)
    assert [a.intent_id for a in newest] == committed[::-1][:2]
    assert newest[0].applied_at >= newest[1].applied_at
    every = _backend_call(store, "applied", Target("collection", "orders"), "o-1", 100)
    assert [a.intent_id for a in every] == committed[::-1]
    assert _backend_call(store, "applied", Target("collection", "orders"), "o-2", 5) == []
    rows = _backend_call(store, "applied", table.target, 7, 5)
    assert [a.intent_id for a in rows] == [table_id]

    found = _backend_call(store, "stats")
    by_scope = {s.scope: s for s in found.scopes}
    assert set(by_scope) == {"c:orders", "t:orders_t"}
    orders = by_scope["c:orders"]
    assert (orders.kind, orders.name, orders.records, orders.applied) == (
        "collection",
        "orders",
        1,
        4,
    )
    assert dict(orders.effects) == {"pending": 1, "done": 1, "failed": 0, "reconcile": 1}
    assert orders.leases_held == 0
    rows_t = by_scope["t:orders_t"]
    assert (rows_t.kind, rows_t.records, rows_t.applied, rows_t.leases_held) == (
        "table",
        1,
        1,
        1,
    )
    assert found.leases_held == 1
    lease.release()
    assert _backend_call(store, "stats").leases_held == 0


def test_stats_lists_a_guarded_table_before_any_commit(
    store: Any, make_table: Any, backend_name: str
) -> None:
    """A table shows once it is guarded (SQL: its trigger; Redis and memory: declared),
    with its rows, before fencing wrote anything for it."""
    make_table("quiet_t", [{"id": 1}, {"id": 2}, {"id": 3}])
    if not backend_name.startswith(("redis", "memory")):
        store.guard_table("quiet_t")
    found = {s.scope: s for s in _backend_call(store, "stats").scopes}
    assert set(found) == {"t:quiet_t"}
    assert (found["t:quiet_t"].records, found["t:quiet_t"].applied) == (3, 0)


def test_stats_of_an_empty_store(store: Any) -> None:
    found = _backend_call(store, "stats")
    assert found.scopes == () and found.leases_held == 0


@pytest.mark.backends(only=lambda name: name.startswith(("memory", "sqlite", "postgres")))
def test_stats_of_a_collection_emptied_with_effects_settled_in_two_states(store: Any) -> None:
    """Its records deleted, a collection is still listed (0 records) while it has applied
    intents or effects; the effects needing reconciling are counted across states."""
    orders = store.collection("orders")
    orders.create("o-1", {"n": 0})
    charged, mailed = orders.intent("o-1", "charge"), orders.intent("o-1", "mail")
    orders.effect(charged, "charge")
    orders.effect_done(orders.effect(mailed, "email"))
    assert orders.commit(orders.intent("o-1", "move"), {"n": 1}).committed
    for late in (charged, mailed):
        assert isinstance(orders.commit(late, {"n": 2}), fencing.Stale)
    assert orders.delete("o-1")
    (found,) = _backend_call(store, "stats").scopes
    assert (found.scope, found.records, found.applied, found.leases_held) == ("c:orders", 0, 1, 0)
    assert dict(found.effects) == {"pending": 1, "done": 1, "failed": 0, "reconcile": 2}


def test_scope_stats_fills_in_what_a_store_did_not_count() -> None:
    """Every SQL store and Redis hand their counts to ``scope_stats``: a scope missing
    from a count is 0 of it (a table missing from ``records``: None, its rows unknown);
    leases held are counted by name (``<name>/``) or, where a store names them so, by
    scope."""
    found = scope_stats(
        {"t:gone": None, "c:kept": 4},
        {"c:empty": 2, "t:new": 1},
        {"c:fx": {"done": 1, "reconcile": 1}},
        {"t:new": 3, "fx": 1, "new": 7},
    )
    zero = {"pending": 0, "done": 0, "failed": 0, "reconcile": 0}
    assert found == (
        ScopeStats("c:empty", 0, 2, zero, 0),
        ScopeStats("c:fx", 0, 0, {**zero, "done": 1, "reconcile": 1}, 1),
        ScopeStats("c:kept", 4, 0, zero, 0),
        ScopeStats("t:gone", None, 0, zero, 0),
        ScopeStats("t:new", None, 1, zero, 3),
    )


def test_effect_counts_sum_by_scope_and_state() -> None:
    """SQL stores read ``(scope, status, count, needing reconciling)`` rows; a state this
    version does not know (a newer one wrote it) is counted under its own name."""
    rows = [
        ("c:a", "pending", 2, 1),
        ("c:a", "done", 1, 1),
        ("c:a", "done", 3, 0),
        ("t:b", "failed", 3, None),
        ("t:b", "cancelled", 2, 2),
    ]
    assert effect_counts(rows) == {
        "c:a": {"pending": 2, "done": 4, "failed": 0, "reconcile": 2},
        "t:b": {"pending": 0, "done": 0, "failed": 3, "reconcile": 2, "cancelled": 2},
    }


@pytest.fixture
def filled(shared_backend_name: str, store_url: str) -> tuple[str, list[str], str]:
    """A store other processes can open, with the history of ``_history`` and a table;
    its URL, the ids committed to orders/o-1 and the name of row 7's lease."""
    with fencing.open(store_url) as store:
        committed, _ = _history(store)
        create = CASES[shared_backend_name].create_table
        assert create is not None
        create(store, "orders_t", "id", "version", TABLE_COLUMNS, [{"id": 7, "status": "new"}])
        table, _, _ = _table_commit(store)  # its lease stays held (300 s)
        lease = _row_lease(store, table)
    return store_url, committed, lease


def _json(capsys: pytest.CaptureFixture[str]) -> Any:
    return json.loads(capsys.readouterr().out)


def test_inspect_cli_on_every_shared_store(
    filled: tuple[str, list[str], str], capsys: pytest.CaptureFixture[str]
) -> None:
    url, committed, lease_name = filled
    assert main(["inspect", url, "orders", "o-1", "--applied", "2"]) == 0
    shown = _json(capsys)
    assert (shown["kind"], shown["collection"], shown["key"]) == ("collection", "orders", "o-1")
    assert shown["version"] == 5 and shown["state"] == {"n": 9} and shown["fence"] == 0
    assert shown["lease"] is None
    assert [a["intent_id"] for a in shown["applied"]] == committed[::-1][:2]

    # no collection record orders_t/7: the table's row, and it says so
    assert main(["inspect", url, "orders_t", "7"]) == 0
    out, err = capsys.readouterr()
    shown = json.loads(out)
    assert "found in table 'orders_t'" in err
    assert (shown["kind"], shown["key"], shown["version"]) == ("table", 7, 2)
    assert shown["state"]["status"] == "shipped" and shown["fence"] == 1
    lease = shown["lease"]
    assert lease["name"] == lease_name and lease["owner"] == "worker-1"
    assert lease["held"] is True and lease["token"] == 1 and 0 < lease["expires_in"] <= 300
    assert len(shown["applied"]) == 1

    assert main(["inspect", url, "orders_t", "7", "--table", "--applied", "0", "--json"]) == 0
    assert _json(capsys)["applied"] == []
    assert main(["inspect", url, "orders_t", "7", "--lease", "elsewhere"]) == 0
    assert _json(capsys)["lease"] is None

    # missing: exit 1, saying where it looked
    assert main(["inspect", url, "orders", "o-2"]) == 1
    err = capsys.readouterr().err
    assert "no record 'o-2' in collection 'orders'" in err and "table" in err
    assert main(["inspect", url, "orders_t", "8", "--table"]) == 1
    assert "no row 8 in table 'orders_t'" in capsys.readouterr().err

    # bad input: exit 2, typed
    assert main(["inspect", url, "no_such_table", "1", "--table"]) == 2
    assert "SchemaError" in capsys.readouterr().err
    assert main(["inspect", url, "orders_t", "x7", "--table", "--key-type", "int"]) == 2
    assert "InvalidInput" in capsys.readouterr().err
    assert main(["inspect", url, "orders", "o-1", "--applied", "-1"]) == 2
    assert "InvalidInput" in capsys.readouterr().err
    assert main(["inspect", url, "orders", "o-1", "--applied", "10001"]) == 2
    assert "InvalidInput" in capsys.readouterr().err
    assert main(["inspect", url, "bad name!", "1"]) == 2
    assert "InvalidIdentifier" in capsys.readouterr().err
    assert main(["inspect", url, "orders", "o-1", "--lease", "bad lease!"]) == 2
    assert "InvalidIdentifier" in capsys.readouterr().err


def test_stats_cli_on_every_shared_store(
    filled: tuple[str, list[str], str],
    shared_backend_name: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, _, _ = filled
    assert main(["stats", url]) == 0  # not a terminal: JSON
    shown = _json(capsys)
    rows = {(r["kind"], r["name"]): r for r in shown["collections"]}
    orders = rows[("collection", "orders")]
    assert orders["records"] == 1 and orders["applied"] == 4 and orders["leases_held"] == 0
    assert orders["effects"] == {"pending": 1, "done": 1, "failed": 0, "reconcile": 1}
    table = rows[("table", "orders_t")]
    assert table["records"] == 1 and table["applied"] == 1 and table["leases_held"] == 1
    assert shown["leases_held"] == 1
    if shared_backend_name.startswith("redis"):
        assert shown["outbox"] is None  # Redis has no outbox table
    else:
        assert shown["outbox"] == {
            "pending": 0,
            "oldest_age": 0.0,
            "dead": 0,
            "superseded": 0,
        }
    assert main(["stats", url, "--json"]) == 0
    assert _json(capsys) == shown | {"collections": shown["collections"]}


def test_stats_counts_the_outbox(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'outbox.db'}"
    with fencing.open(url) as store:
        intent = store.collection("orders").create("o-1", {}).intent("ship")
        message = OutboxMessage("celery", "app.ship", intent.to_json(), "collection:orders:o-1")
        store.backend.outbox_add(message)
    assert main(["stats", url, "--json"]) == 0
    shown = _json(capsys)
    assert shown["outbox"]["pending"] == 1 and shown["outbox"]["oldest_age"] >= 0
    assert shown["outbox"]["dead"] == 0
    assert [(r["name"], r["records"], r["applied"]) for r in shown["collections"]] == [
        ("orders", 1, 0)
    ]


def test_stats_of_a_table_since_dropped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'gone.db'}"
    with sqlite3.connect(tmp_path / "gone.db") as conn:
        conn.execute("CREATE TABLE gone_t (id INTEGER PRIMARY KEY, version INTEGER, note TEXT)")
        conn.execute("INSERT INTO gone_t (id, version) VALUES (1, 1)")
    with fencing.open(url) as store:
        table = store.table("gone_t")
        assert table.commit(table.intent(1, "note"), {"note": "x"}).committed
    with sqlite3.connect(tmp_path / "gone.db") as conn:
        conn.execute("DROP TABLE gone_t")
    assert main(["stats", url]) == 0
    (row,) = _json(capsys)["collections"]
    assert (row["kind"], row["name"], row["records"], row["applied"]) == (
        "table",
        "gone_t",
        None,
        1,
    )


def test_inspect_a_table_without_a_version_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'plain.db'}"
    with sqlite3.connect(tmp_path / "plain.db") as conn:
        conn.execute("CREATE TABLE plain_t (id INTEGER PRIMARY KEY, status TEXT)")
        conn.execute("INSERT INTO plain_t VALUES (3, 'new')")
    fencing.open(url).close()  # fencing's own tables
    assert main(["inspect", url, "plain_t", "3", "--table"]) == 2  # no column "version"
    assert "SchemaError" in capsys.readouterr().err
    assert main(["inspect", url, "plain_t", "3", "--table", "--no-version-column"]) == 0
    shown = _json(capsys)
    assert (shown["version"], shown["state"]) == (0, {"status": "new"})


def test_stats_and_inspect_refuse_an_unmigrated_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    assert main(["stats", url]) == 2
    assert "StoreNotMigrated: no fencing store at" in capsys.readouterr().err
    assert main(["inspect", url, "orders", "o-1"]) == 2
    assert "StoreNotMigrated: no fencing store at" in capsys.readouterr().err
    assert not (tmp_path / "empty.db").exists()  # and not made (issue 18, item 9)


def test_a_terminal_gets_a_panel_and_a_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("rich", reason="the cli extra (rich) draws the panel")
    url = f"sqlite:///{tmp_path / 'tty.db'}"
    with fencing.open(url) as store:
        committed, _ = _history(store)
    capsys.readouterr()
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert main(["inspect", url, "orders", "o-1"]) == 0
    out = capsys.readouterr().out
    assert "collection 'orders', key 'o-1'" in out and "version" in out
    assert committed[-1] in out and "fence" in out and "lease" in out
    assert main(["inspect", url, "orders", "o-1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["version"] == 5  # --json stays parseable
    assert main(["stats", url]) == 0
    out = capsys.readouterr().out
    assert "fencing stats (sqlite)" in out and "orders" in out and "leases held: 0" in out
