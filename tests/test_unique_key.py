"""A table's ``key=`` column must be unique on its own (issue 18, item 11).

On every SQL store, sync and async, through the store and through ``store.using(conn)``:
a key column with no unique index, or one that a unique index merely includes with other
columns (or only for some rows), is refused with the same ``SchemaError`` before
anything is written (a commit by a shared key would rewrite every row that has it); a
primary key, or a unique index on that column alone, is accepted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import fencing

from ._lenders import LENDERS
from .test_guard import SQL, raw

on_sql = pytest.mark.backends(only=lambda name: name in SQL)
TABLE = "keys_t"
MESSAGE = (
    f"key column 'code' of table '{TABLE}' must be unique"
    " (a primary key or a unique index on that column alone)"
)

# (the indexes made after the table, whether the key column is then unique on its own)
SHAPES: dict[str, tuple[list[str], bool]] = {
    "no index": ([], False),
    "a plain index": ([f"CREATE INDEX keys_t_plain ON {TABLE} (code)"], False),
    "a composite unique index": (
        [f"CREATE UNIQUE INDEX keys_t_pair ON {TABLE} (code, status)"],
        False,
    ),
    "a one-column unique index": ([f"CREATE UNIQUE INDEX keys_t_one ON {TABLE} (code)"], True),
    "a composite one beside a one-column one": (
        [
            f"CREATE UNIQUE INDEX keys_t_pair ON {TABLE} (code, status)",
            f"CREATE UNIQUE INDEX keys_t_one ON {TABLE} (code)",
        ],
        True,
    ),
}


def _make(run: Callable[[str], list[Any]], indexes: list[str], duplicate: bool) -> None:
    run(f"DROP TABLE IF EXISTS {TABLE}")
    run(
        f"CREATE TABLE {TABLE} (rid INTEGER NOT NULL PRIMARY KEY, code INTEGER NOT NULL,"
        " version INTEGER NOT NULL DEFAULT 1, status VARCHAR(40))"
    )
    for text in indexes:
        run(text)
    run(f"INSERT INTO {TABLE} (rid, code, status) VALUES (1, 7, 'a')")
    if duplicate:  # a second row with the same key
        run(f"INSERT INTO {TABLE} (rid, code, status) VALUES (2, 7, 'b')")


def _rows(store: Any, backend_name: str) -> list[tuple[Any, ...]]:
    with raw(store, backend_name) as run:
        rows = run(f"SELECT rid, code, version, status FROM {TABLE} ORDER BY rid")
    return [tuple(r) for r in rows]


def _check(store: Any, backend_name: str, table: Any, unique: bool) -> None:
    # (never inside ``raw``: on SQLite it holds the store's connection)
    if not unique:
        with pytest.raises(fencing.SchemaError) as caught:
            table.intent(7, "ship")
        assert str(caught.value) == MESSAGE
        forged = fencing.Intent.new(TABLE, 7, 1, "ship", kind="table")
        with pytest.raises(fencing.SchemaError, match="must be unique"):
            table.commit(forged, {"status": "shipped"})
        assert _rows(store, backend_name) == [(1, 7, 1, "a"), (2, 7, 1, "b")]  # nothing written
        return
    out = table.commit(table.intent(7, "ship"), {"status": "shipped"})
    assert isinstance(out, fencing.Committed) and out.record.version == 2
    assert _rows(store, backend_name) == [(1, 7, 2, "shipped")]


@on_sql
@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_key_column_must_be_unique(store: Any, backend_name: str, shape: str) -> None:
    indexes, unique = SHAPES[shape]
    with raw(store, backend_name) as run:
        _make(run, indexes, duplicate=not unique)
    _check(store, backend_name, store.table(TABLE, key="code", version="version"), unique)
    # the primary key is unique: the same table by it is accepted
    by_rid = store.table(TABLE, key="rid", version="version")
    assert by_rid.get(1) is not None


@on_sql
def test_a_partial_unique_index_is_not_enough(store: Any, backend_name: str) -> None:
    if backend_name == "mysql":
        pytest.skip("MySQL and MariaDB have no partial index")
    index = f"CREATE UNIQUE INDEX keys_t_part ON {TABLE} (code) WHERE status = 'a'"
    with raw(store, backend_name) as run:
        _make(run, [index], duplicate=True)
    _check(store, backend_name, store.table(TABLE, key="code"), False)


@pytest.mark.backends(only=lambda name: name in ("sqlite-memory", "sqlite-file"))
@pytest.mark.parametrize(
    ("ddl", "unique"),
    [
        ("(code INTEGER PRIMARY KEY, version INTEGER)", True),  # the rowid itself
        ("(code TEXT PRIMARY KEY, version INTEGER)", True),  # an automatic index
        ("(code INTEGER PRIMARY KEY DESC, version INTEGER)", True),  # not the rowid
        ("(code INTEGER NOT NULL UNIQUE, version INTEGER)", True),
        ("(code INTEGER, version INTEGER, PRIMARY KEY (code))", True),
        ("(code INTEGER, version INTEGER, PRIMARY KEY (code)) WITHOUT ROWID", True),
        ("(code INTEGER, version INTEGER, other INTEGER, PRIMARY KEY (code, other))", False),
        ("(code INTEGER, version INTEGER, UNIQUE (code, version))", False),
        ("(code INTEGER, version INTEGER, UNIQUE (code, version)) WITHOUT ROWID", False),
    ],
)
def test_sqlite_keys(store: Any, backend_name: str, ddl: str, unique: bool) -> None:
    if "WITHOUT ROWID" in ddl and not unique:
        ddl = ddl.replace("UNIQUE (code, version))", "PRIMARY KEY (code, version))")
    with raw(store, backend_name) as run:
        run(f"CREATE TABLE {TABLE} {ddl}")
        run(f"INSERT INTO {TABLE} (code, version) VALUES (7, 1)")
    table = store.table(TABLE, key="code")
    if unique:
        assert table.intent(7, "x").expected_version == 1
        return
    with pytest.raises(fencing.SchemaError, match="must be unique"):
        table.get(7)


@pytest.mark.backends(only=lambda name: name in LENDERS)
@pytest.mark.apis(only=["sync"])  # the connection lent is a sync driver's
def test_refused_through_the_callers_connection(
    store: Any, store_url: str, backend_name: str, api: str
) -> None:
    with raw(store, backend_name) as run:
        _make(run, SHAPES["a composite unique index"][0], duplicate=True)
    conn = LENDERS[backend_name].connect(store_url)
    try:
        view = store.using(conn).table(TABLE, key="code")
        with pytest.raises(fencing.SchemaError) as caught:
            view.intent(7, "ship")
        assert str(caught.value) == MESSAGE
        conn.rollback()
    finally:
        conn.close()
    with raw(store, backend_name) as run:
        run(f"CREATE UNIQUE INDEX keys_t_one ON {TABLE} (rid, code, version)")
        run(f"DELETE FROM {TABLE} WHERE rid = 2")
        run(f"CREATE UNIQUE INDEX keys_t_code ON {TABLE} (code)")
    conn = LENDERS[backend_name].connect(store_url)
    try:
        view = store.using(conn).table(TABLE, key="code")
        assert view.commit(view.intent(7, "ship"), {"status": "shipped"}).committed
        conn.commit()
    finally:
        conn.close()
    assert store.table(TABLE, key="code").get(7).state["status"] == "shipped"
