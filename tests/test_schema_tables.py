"""Schema-qualified table names: ``store.table("shop.orders")`` on PostgreSQL (a schema),
MySQL / MariaDB (a database) and SQLite (``main.orders``). Two schemas' tables of the
same name are two targets: their own rows, their own applied intents and fences."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import fencing
from fencing import Committed, Duplicate, InvalidIdentifier
from fencing._request import Target

from ._backends import CASES

_SQL = ("sqlite-file", "postgresql", "mysql")


def _schemas(backend_name: str) -> Iterator[tuple[list[str], Callable[[str], None]]]:
    """Two fresh schemas (databases on MySQL) holding ``orders`` (row 1, version 1),
    and a function running SQL on the server."""
    names = [f"sa_{c}_{uuid.uuid4().hex[:10]}" for c in "ab"]
    if backend_name == "postgresql":
        from . import backends_postgres as pg

        def run(text: str) -> None:
            with pg.admin() as conn:
                conn.execute(text)

        ddl = "CREATE SCHEMA {s}; CREATE TABLE {s}.orders (id INTEGER PRIMARY KEY,"
        ddl += " version INTEGER NOT NULL DEFAULT 1, status TEXT);"
        ddl += " INSERT INTO {s}.orders (id, status) VALUES (1, 'new')"
        drop = "DROP SCHEMA IF EXISTS {s} CASCADE"
    else:
        from . import backends_mysql as my

        def run(text: str) -> None:
            with my._admin() as conn, conn.cursor() as cur:
                for part in text.split(";"):
                    cur.execute(part)

        ddl = "CREATE DATABASE {s}; CREATE TABLE {s}.orders (id INTEGER PRIMARY KEY,"
        ddl += " version INTEGER NOT NULL DEFAULT 1, status VARCHAR(20)) ENGINE=InnoDB;"
        ddl += " INSERT INTO {s}.orders (id, status) VALUES (1, 'new')"
        drop = "DROP DATABASE IF EXISTS {s}"
    try:
        for s in names:
            run(ddl.format(s=s))
        yield names, run
    finally:
        for s in names:
            run(drop.format(s=s))


@pytest.mark.backends(only=lambda name: name in ("postgresql", "mysql"))
def test_same_named_tables_in_two_schemas_are_two_targets(
    store_url: str, backend_name: str
) -> None:
    for (a, b), _run in _schemas(backend_name):
        with fencing.open(store_url) as store:
            ta, tb = store.table(f"{a}.orders"), store.table(f"{b}.orders")
            assert Target("table", f"{a}.orders").scope != Target("table", f"{b}.orders").scope
            first = ta.intent(1, "pay")
            out = ta.commit(first, {"status": "paid"})
            assert isinstance(out, Committed) and out.record.collection == f"{a}.orders"
            assert isinstance(ta.commit(first, {"status": "paid"}), Duplicate)
            # b's row 1 is untouched, still at version 1, and takes its own intent
            assert tb.get(1).version == 1 and tb.get(1).state["status"] == "new"
            out = tb.commit(tb.intent(1, "ship"), {"status": "shipped"})
            assert isinstance(out, Committed) and out.record.version == 2
            assert ta.get(1).state["status"] == "paid" and ta.get(1).version == 2
            assert tb.get(1).state["status"] == "shipped"


@pytest.mark.backends(only=lambda name: name in ("postgresql", "mysql"))
def test_qualified_table_async(store_url: str, backend_name: str, loop: Any) -> None:
    for (a, _b), _run in _schemas(backend_name):

        async def go(a: str = a) -> None:
            store = await fencing.open_async(store_url)
            try:
                orders = store.table(f"{a}.orders")
                out = await orders.commit(await orders.intent(1, "pay"), {"status": "paid"})
                assert isinstance(out, Committed) and out.record.version == 2
            finally:
                await store.close()

        loop.run(go())


@pytest.mark.backends(only=lambda name: name in _SQL)
def test_missing_schema_is_a_schema_error(store_url: str, backend_name: str) -> None:
    with fencing.open(store_url) as store:
        orders = store.table("no_such_schema_x.orders")
        with pytest.raises(fencing.SchemaError):
            orders.get(1)


@pytest.mark.backends(only=lambda name: name.startswith("sqlite"))
def test_sqlite_main_orders(store_url: str, backend_name: str) -> None:
    with fencing.open(store_url) as store:
        create = CASES[backend_name].create_table
        assert create is not None
        create(store, "orders", "id", "version", {"status": "TEXT"}, [{"id": 1}])
        orders = store.table("main.orders")
        out = orders.commit(orders.intent(1, "pay"), {"status": "paid"})
        assert isinstance(out, Committed) and out.record.version == 2
        assert store.table("orders").get(1).state["status"] == "paid"


@pytest.mark.parametrize(
    "name",
    ["a.b.c", ".orders", "shop.", "shop..orders", "shop.fencing_records", "1x.orders", "a b.c"],
)
def test_bad_qualified_names_refused(name: str) -> None:
    with fencing.open("memory://") as store, pytest.raises(InvalidIdentifier):
        store.table(name)
