"""Schema 2 -> 3: an applied intent is keyed by (scope, intent id, key).

A store written by the previous release keyed applied intents by (scope, intent id) only,
so an id used for a second key reported ``Duplicate`` although that key was never written.
Migrating keeps every applied intent (its redelivery is still ``Duplicate``) and lets the
same id commit to another key once.
"""

from __future__ import annotations

import importlib
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import fencing

from ._backends import named_case_url

# what the previous release made, per SQL dialect
_OLD_APPLIED = {
    "sqlite-file": (
        "CREATE TABLE fencing_applied_v2 (scope TEXT NOT NULL, intent_id TEXT NOT NULL,"
        " key NOT NULL, applied_at REAL NOT NULL, PRIMARY KEY (scope, intent_id)) WITHOUT ROWID",
        "INSERT INTO fencing_applied_v2 SELECT * FROM fencing_applied",
        "DROP TABLE fencing_applied",
        "ALTER TABLE fencing_applied_v2 RENAME TO fencing_applied",
        "CREATE INDEX fencing_applied_at ON fencing_applied (applied_at)",
        "UPDATE fencing_schema SET version = 2",
    ),
    "postgresql": (
        "ALTER TABLE fencing_applied DROP CONSTRAINT fencing_applied_pkey,"
        " ADD CONSTRAINT fencing_applied_pkey PRIMARY KEY (scope, intent_id)",
        "UPDATE fencing_schema SET version = 2",
    ),
    "mysql": (
        "ALTER TABLE fencing_applied DROP PRIMARY KEY, ADD PRIMARY KEY (scope, intent_id)",
        "UPDATE fencing_schema SET version = 2",
    ),
}


def _runner(name: str, store: Any, url: str) -> Callable[[str], list[tuple[Any, ...]]]:
    if name == "sqlite-file":
        path = url.removeprefix("sqlite:///")

        def run_sqlite(statement: str) -> list[tuple[Any, ...]]:
            conn = sqlite3.connect(path)
            try:
                with conn:
                    return conn.execute(statement).fetchall()
            finally:
                conn.close()

        return run_sqlite
    if name == "postgresql":
        from .backends_postgres import connect

        def run_pg(statement: str) -> list[tuple[Any, ...]]:
            with connect(store) as conn:
                cur = conn.execute(statement)
                return cur.fetchall() if cur.description else []

        return run_pg
    from .backends_mysql import connect as mysql_connect

    def run_mysql(statement: str) -> list[tuple[Any, ...]]:
        conn = mysql_connect(store)
        try:
            with conn.cursor() as cur:
                cur.execute(statement)
                return list(cur.fetchall())
        finally:
            conn.close()

    return run_mysql


@pytest.fixture(params=sorted(_OLD_APPLIED))
def sql_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    yield from named_case_url(request, tmp_path)


def _current(name: str) -> int:
    """The schema version this fencing writes on the case's store (3 or later)."""
    package = "sqlite" if name.startswith("sqlite") else {"postgresql": "postgres"}.get(name, name)
    return int(importlib.import_module(f"fencing.backends.{package}").SCHEMA_VERSION)


def _intent(key: str) -> fencing.Intent:
    return fencing.Intent(
        id="task-1", collection="orders", key=key, expected_version=1, transition="ship"
    )


def test_a_schema_2_store_keys_applied_intents_by_key_after_migrate(
    sql_url: tuple[str, str],
) -> None:
    name, url = sql_url
    with fencing.open(url) as old:
        orders = old.collection("orders")
        orders.create("a", {"n": 0})
        orders.create("b", {"n": 0})
        assert orders.commit(_intent("a"), {"n": 1}).committed
        run = _runner(name, old, url)
        for statement in _OLD_APPLIED[name]:  # the applied row as the old schema holds it
            run(statement)

    with fencing.open(url) as store:  # opening migrates
        store.migrate()  # and again: nothing more to do
        assert run("SELECT version FROM fencing_schema") == [(_current(name),)]
        orders = store.collection("orders")
        assert isinstance(orders.commit(_intent("a"), {"n": 1}), fencing.Duplicate)  # kept
        assert orders.commit(_intent("b"), {"n": 1}).committed  # now b's own work
        assert isinstance(orders.commit(_intent("b"), {"n": 1}), fencing.Duplicate)
        assert [orders.get(k).version for k in ("a", "b")] == [2, 2]
