"""SQLite's statements of a guarded table (``backends/sqlite/statements.py``, issue 23):
built once per shape of request and kept, so a commit does not rebuild its SQL text; at
most ``_CACHED`` shapes are kept (a program that makes ever new shapes does not grow the
store's memory without bound); each shape has its own statement."""

from __future__ import annotations

import sqlite3

from fencing import Intent
from fencing._request import CommitRequest, Target
from fencing._rules import LeaseRef
from fencing.backends.sqlite.statements import _CACHED, UNAPPLIED, Statements, update_params

ORDERS = Target("table", "orders", "id", "version")


def request(state: dict[str, object], lease: LeaseRef | None = None) -> CommitRequest:
    intent = Intent.new("orders", 1, 3, "ship", kind="table")
    return CommitRequest(ORDERS, intent, state, None, lease)


def test_a_shape_s_statement_is_built_once() -> None:
    statements = Statements()
    for probe in (False, True):
        first = statements.row(ORDERS, probe)
        assert statements.row(ORDERS, probe) is first  # the same text, not built again
    assert statements.row(ORDERS, True) != statements.row(ORDERS, False)
    plain, fenced = request({"status": "x"}), request({"status": "x"}, LeaseRef("l", 1))
    for one in (plain, fenced):
        first = statements.update(one)
        assert statements.update(request({"status": "x"}, one.lease)) is first
    assert statements.update(plain) != statements.update(fenced)
    assert statements.update(request({"note": "x"})) != statements.update(plain)
    assert len(statements._cache) == 5


def test_at_most_cached_shapes_are_kept() -> None:
    statements = Statements()
    for n in range(_CACHED + 10):
        statements.update(request({f"c{n}": 1}))
    assert len(statements._cache) == _CACHED
    kept = statements.update(request({"c0": 1}))
    assert statements.update(request({"c0": 1})) is kept
    # a shape beyond the bound is built each time, the same text
    late = statements.update(request({"late": 1}))
    again = statements.update(request({"late": 1}))
    assert again == late and again is not late
    assert late == (
        'UPDATE "orders" SET "late" = ?, "version" = "version" + 1 WHERE "id" = ? AND "version" = ?'
        + UNAPPLIED
    )


def test_a_column_the_database_computes_is_set_by_its_sql() -> None:
    """``sql_values`` (a mapped column's SQL ``onupdate``) are set after the state's
    columns, each by its own SQL, in the same UPDATE."""
    intent = Intent.new("orders", 1, 3, "ship", kind="table")
    computed = (("updated_at", "'at ' || 7"),)
    req = CommitRequest(ORDERS, intent, {"status": "x"}, None, None, computed)
    sql = Statements().update(req)
    assert sql == (
        'UPDATE "orders" SET "status" = ?, "updated_at" = \'at \' || 7,'
        ' "version" = "version" + 1 WHERE "id" = ? AND "version" = ?' + UNAPPLIED
    )
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, version INTEGER, status, updated_at)")
    db.execute("CREATE TABLE fencing_applied (scope, intent_id, key, applied_at)")
    db.execute("INSERT INTO orders VALUES (1, 3, 'new', NULL)")
    db.execute(sql, update_params(req, 0.0))
    assert db.execute("SELECT * FROM orders").fetchall() == [(1, 4, "x", "at 7")]
    db.close()
