"""The guard trigger (issue 12, item 5): blind writers cannot slip under an intent.

On every SQL backend, sync and async: a raw UPDATE that leaves the version alone moves
it on (an intent decided before is Stale), one that sets it lower is refused by the
database (the row unchanged; ``GuardRefused`` once translated), one that sets the same
version explicitly is bumped, fencing's own commit still applies exactly +1; a stale
SQLAlchemy ORM object saves as ``StaleDataError`` with ``version_id_col`` and moves the
version on without it; installing twice, removing, the CLI. Memory and Redis refuse.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import fencing
from fencing._cli import main

SQL = ("sqlite-memory", "sqlite-file", "postgresql", "mysql")
TABLE = "orders_t"
TRIGGER = "fencing_guard_orders_t"

on_sql = pytest.mark.backends(only=lambda name: name in SQL)
# the CLI and the ORM open their own connections: a private memory database is not shared
on_shared_sql = pytest.mark.backends(only=lambda name: name in SQL and name != "sqlite-memory")


def _sql_only(backend_name: str) -> None:
    # the tests that use ``guarded`` are marked on_sql; memory and Redis refuse (tested apart)
    assert backend_name in SQL, f"{backend_name} has no guard trigger: mark the test on_sql"


def _sync_backend(store: Any) -> Any:
    backend = store.backend
    return getattr(backend, "sync", backend)


@contextmanager
def raw(store: Any, backend_name: str) -> Iterator[Callable[[str], list[Any]]]:
    """``run(sql) -> rows``: a writer outside fencing, autocommit, on the store's database."""
    if backend_name.startswith("sqlite"):
        backend = _sync_backend(store)
        with backend._lock:
            conn = backend.conn
            yield lambda text: conn.execute(text).fetchall()
        return
    if backend_name == "postgresql":
        from .backends_postgres import connect

        with connect(store) as pg:
            yield lambda text: (lambda cur: cur.fetchall() if cur.description else [])(
                pg.execute(text)
            )
        return
    from .backends_mysql import connect as my_connect

    my = my_connect(store)
    try:

        def run(text: str) -> list[Any]:
            with my.cursor() as cur:
                cur.execute(text)
                return list(cur.fetchall())

        yield run
    finally:
        my.close()


def _version(run: Callable[[str], list[Any]]) -> int:
    return int(run(f"SELECT version FROM {TABLE} WHERE id = 1")[0][0])


def _row(run: Callable[[str], list[Any]]) -> tuple[Any, ...]:
    return tuple(run(f"SELECT id, version, status FROM {TABLE} WHERE id = 1")[0])


@pytest.fixture
def guarded(store: Any, backend_name: str, make_table: Any) -> Any:
    _sql_only(backend_name)
    table = make_table(TABLE, [{"id": 1, "status": "new"}, {"id": 2, "status": "new"}])
    store.guard_table(TABLE, version="version", key="id")
    return table


@on_sql
def test_a_blind_update_moves_the_version_on(store: Any, backend_name: str, guarded: Any) -> None:
    intent = guarded.intent(1, "ship")
    with raw(store, backend_name) as run:
        run(f"UPDATE {TABLE} SET status = 'x' WHERE id = 1")
        assert _row(run) == (1, 2, "x")
    outcome = guarded.commit(intent, {"status": "shipped"})
    assert isinstance(outcome, fencing.Stale)
    assert outcome.current.version == 2 and outcome.current.state["status"] == "x"


@on_sql
def test_the_same_version_set_explicitly_is_bumped(
    store: Any, backend_name: str, guarded: Any
) -> None:
    intent = guarded.intent(1, "ship")
    with raw(store, backend_name) as run:
        run(f"UPDATE {TABLE} SET status = 'y', version = 1 WHERE id = 1")
        assert _row(run) == (1, 2, "y")
        run(f"UPDATE {TABLE} SET version = version WHERE id = 1")
        assert _version(run) == 3
    assert isinstance(guarded.commit(intent, {"status": "shipped"}), fencing.Stale)


@on_sql
def test_a_lower_version_is_refused_and_the_row_unchanged(
    store: Any, backend_name: str, guarded: Any
) -> None:
    with raw(store, backend_name) as run:
        run(f"UPDATE {TABLE} SET status = 'a', version = 5 WHERE id = 1")
        assert _row(run) == (1, 5, "a")
        with pytest.raises(Exception, match="never moves backwards") as caught:
            run(f"UPDATE {TABLE} SET status = 'b', version = 4 WHERE id = 1")
        assert TRIGGER in str(caught.value)
        assert _row(run) == (1, 5, "a")
        with pytest.raises(Exception, match="never moves backwards"):
            run(f"UPDATE {TABLE} SET version = NULL WHERE id = 1")
        # a multi-row UPDATE with one row going back: the whole statement is undone
        with pytest.raises(Exception, match="never moves backwards"):
            run(f"UPDATE {TABLE} SET status = 'c', version = 3")
        assert _row(run) == (1, 5, "a")
        assert tuple(run(f"SELECT version, status FROM {TABLE} WHERE id = 2")[0]) == (1, "new")
    # the database's error, as fencing translates it wherever it meets one
    assert isinstance(_translate(backend_name, caught.value), fencing.GuardRefused)


def _translate(backend_name: str, exc: BaseException) -> fencing.FencingError:
    if backend_name.startswith("sqlite"):
        from fencing.backends.sqlite.errors import translate as sqlite_translate

        assert isinstance(exc, sqlite3.Error)
        return sqlite_translate(exc)
    if backend_name == "postgresql":
        from fencing.backends.postgres.errors import translate as pg_translate

        return pg_translate(exc)  # type: ignore[arg-type]
    from fencing.backends.mysql.errors import translate as my_translate

    return my_translate(exc)


@on_sql
def test_fencings_own_commit_applies_exactly_one(
    store: Any, backend_name: str, guarded: Any
) -> None:
    for expected in (2, 3, 4):
        outcome = guarded.commit(guarded.intent(1, "ship"), {"status": f"s{expected}"})
        assert isinstance(outcome, fencing.Committed)
        assert outcome.record.version == expected
        assert guarded.get(1).version == expected
    results = guarded.commit_many(
        [(guarded.intent(k, "ship"), {"status": "batch"}) for k in (1, 2)]
    )
    assert [r.record.version for r in results] == [5, 2]
    with raw(store, backend_name) as run:
        assert _version(run) == 5


@on_sql
def test_installing_twice_and_removing(store: Any, backend_name: str, guarded: Any) -> None:
    store.guard_table(TABLE)  # again: same trigger, same behaviour
    with raw(store, backend_name) as run:
        run(f"UPDATE {TABLE} SET status = 'x' WHERE id = 1")
        assert _version(run) == 2
    store.unguard_table(TABLE)
    store.unguard_table(TABLE)  # removing an absent guard is fine
    with raw(store, backend_name) as run:
        run(f"UPDATE {TABLE} SET status = 'y' WHERE id = 1")
        assert _version(run) == 2  # no trigger: a blind write slips under again
        run(f"UPDATE {TABLE} SET version = 1 WHERE id = 1")
        assert _version(run) == 1


@on_sql
def test_bad_names_and_missing_columns_are_refused(
    store: Any, backend_name: str, guarded: Any
) -> None:
    with pytest.raises(fencing.InvalidIdentifier):
        store.guard_table("orders; DROP TABLE x")
    with pytest.raises(fencing.InvalidIdentifier):
        store.guard_table("fencing_records")
    with pytest.raises(fencing.InvalidIdentifier, match="too long"):
        store.guard_table("t" * 60)
    with pytest.raises(fencing.InvalidIdentifier):
        store.guard_table(TABLE, version="version`")
    with pytest.raises(fencing.SchemaError):
        store.guard_table(TABLE, version="nope")
    with pytest.raises(fencing.SchemaError):
        store.guard_table("no_such_table")


@pytest.mark.backends(only=lambda name: name not in SQL)
def test_refused_without_sql(store: Any, backend_name: str) -> None:
    with pytest.raises(fencing.ConfigurationError, match="guard trigger is for SQL tables"):
        store.guard_table(TABLE)
    with pytest.raises(fencing.ConfigurationError, match="guard trigger is for SQL tables"):
        store.unguard_table(TABLE)


# -- the CLI ---------------------------------------------------------------------------------
@on_shared_sql
@pytest.mark.apis(only=["sync"])  # the CLI is sync: one run is enough
def test_the_cli_installs_and_removes(
    store: Any, store_url: str, backend_name: str, api: str, make_table: Any
) -> None:
    make_table(TABLE, [{"id": 1, "status": "new"}])
    args = ["migrate", store_url, "--guard-table", TABLE, "--version-column", "version"]
    assert main(args) == 0
    assert main(args) == 0
    with raw(store, backend_name) as run:
        run(f"UPDATE {TABLE} SET status = 'x' WHERE id = 1")
        assert _version(run) == 2
    assert main(["migrate", store_url, "--unguard-table", TABLE]) == 0
    with raw(store, backend_name) as run:
        run(f"UPDATE {TABLE} SET status = 'y' WHERE id = 1")
        assert _version(run) == 2
    assert main(["migrate", store_url, "--guard-table", "no_such_table"]) == 2


# -- SQLAlchemy ORM: a stale object saved after a fenced commit -----------------------------
@pytest.fixture
def engine(store: Any, backend_name: str, api: str) -> Iterator[Any]:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    if backend_name == "sqlite-file":
        path = Path(_sync_backend(store).path)
        made = sqlalchemy.create_engine(f"sqlite:///{path}")
    elif backend_name == "postgresql":
        import psycopg

        backend = store.backend
        options = f"-csearch_path={backend.schema}"
        made = sqlalchemy.create_engine(
            "postgresql+psycopg://",
            creator=lambda: psycopg.connect(backend.conninfo, options=options),
        )
    else:
        import pymysql

        kwargs = {**_sync_backend(store).settings.driver_kwargs(), "autocommit": False}
        made = sqlalchemy.create_engine(
            "mysql+pymysql://", creator=lambda: pymysql.connect(**kwargs)
        )
    yield made
    made.dispose()


def _model(versioned: bool) -> Any:
    from sqlalchemy import Integer, String
    from sqlalchemy.orm import DeclarativeBase, mapped_column

    class Base(DeclarativeBase):
        pass

    class Order(Base):
        __tablename__ = TABLE
        id = mapped_column(Integer, primary_key=True)
        version = mapped_column(Integer, nullable=False)
        status = mapped_column(String(40))
        if versioned:
            __mapper_args__ = {"version_id_col": version}

    return Order


@on_shared_sql
@pytest.mark.apis(only=["sync"])  # the ORM writes through its own sync engine
def test_a_stale_orm_object_with_version_id_col_raises_stale_data(
    engine: Any, guarded: Any
) -> None:
    from sqlalchemy.orm import Session
    from sqlalchemy.orm.exc import StaleDataError

    Order = _model(versioned=True)
    with Session(engine) as session:
        order = session.get(Order, 1)
        assert order is not None and order.version == 1
        outcome = guarded.commit(guarded.intent(1, "ship"), {"status": "shipped"})
        assert isinstance(outcome, fencing.Committed) and outcome.record.version == 2
        order.status = "packed"  # decided against version 1
        with pytest.raises(StaleDataError):
            session.flush()
        session.rollback()
    assert guarded.get(1).version == 2 and guarded.get(1).state["status"] == "shipped"
    # a fresh object saves through the trigger unchanged: SQLAlchemy's own +1
    with Session(engine) as session:
        order = session.get(Order, 1)
        order.status = "packed"
        session.commit()
        assert order.version == 3
    assert guarded.get(1).version == 3


@on_shared_sql
@pytest.mark.apis(only=["sync"])  # the ORM writes through its own sync engine
def test_a_blind_orm_save_moves_the_version_on(engine: Any, guarded: Any) -> None:
    from sqlalchemy.orm import Session

    Order = _model(versioned=False)
    with Session(engine) as session:
        order = session.get(Order, 1)
        assert order is not None
        intent = guarded.intent(1, "ship")  # outstanding, at version 1
        order.status = "packed"  # a blind save: the version is not touched
        session.commit()
    assert guarded.get(1).version == 2
    outcome = guarded.commit(intent, {"status": "shipped"})
    assert isinstance(outcome, fencing.Stale) and outcome.current.state["status"] == "packed"
    # and a full-row save of a stale object (every column, Django-style) cannot go back
    with Session(engine) as session:
        order = session.get(Order, 1)
        order.status, order.version = "stale", 1
        with pytest.raises(Exception, match="never moves backwards"):
            session.commit()
    assert guarded.get(1).version == 2 and guarded.get(1).state["status"] == "packed"


# -- a custom version column; a schema-qualified table (issue 18, item 13) -------------------
def _rev_table(run: Callable[[str], list[Any]], name: str) -> None:
    run(f"DROP TABLE IF EXISTS {name}")
    run(
        f"CREATE TABLE {name} (id INTEGER NOT NULL PRIMARY KEY,"
        " rev INTEGER NOT NULL DEFAULT 1, status VARCHAR(40))"
    )
    run(f"INSERT INTO {name} (id, status) VALUES (1, 'new')")


def _rev(run: Callable[[str], list[Any]], name: str) -> int:
    return int(run(f"SELECT rev FROM {name} WHERE id = 1")[0][0])


def _guarded_and_removed(store: Any, backend_name: str, name: str) -> None:
    """Guard ``name`` (a ``rev`` column), see it work, remove it, see it gone."""
    store.guard_table(name, version="rev", key="id")
    store.guard_table(name, version="rev", key="id")  # again: the same
    with raw(store, backend_name) as run:
        run(f"UPDATE {name} SET status = 'x' WHERE id = 1")
        assert _rev(run, name) == 2
        with pytest.raises(Exception, match="never moves backwards") as caught:
            run(f"UPDATE {name} SET rev = 1 WHERE id = 1")
        assert "fencing_guard_" + name.rpartition(".")[2] in str(caught.value)
        assert isinstance(_translate(backend_name, caught.value), fencing.GuardRefused)
    store.unguard_table(name)  # finds it without being told the column
    store.unguard_table(name)
    with raw(store, backend_name) as run:
        run(f"UPDATE {name} SET status = 'y' WHERE id = 1")
        assert _rev(run, name) == 2  # no trigger
        run(f"UPDATE {name} SET rev = 1 WHERE id = 1")
        assert _rev(run, name) == 1


@on_sql
def test_a_custom_version_column_is_guarded_and_removed(store: Any, backend_name: str) -> None:
    with raw(store, backend_name) as run:
        _rev_table(run, "revs_t")
    _guarded_and_removed(store, backend_name, "revs_t")


@contextmanager
def _other_schema(store: Any, backend_name: str) -> Iterator[str]:
    """A schema (PostgreSQL), database (MySQL) or attached database (SQLite) apart from
    the store's own, dropped after."""
    import uuid

    if backend_name.startswith("sqlite"):
        yield "main"  # SQLite's own database by its name; attached ones are per connection
        return
    name = "fencing_t_" + uuid.uuid4().hex[:16]
    what = "SCHEMA" if backend_name == "postgresql" else "DATABASE"
    with raw(store, backend_name) as run:
        run(f"CREATE {what} {name}")
    try:
        yield name
    finally:
        with raw(store, backend_name) as run:
            run(f"DROP {what} {name}" + (" CASCADE" if what == "SCHEMA" else ""))


@on_sql
def test_a_schema_qualified_table_is_guarded_and_removed(store: Any, backend_name: str) -> None:
    with _other_schema(store, backend_name) as schema:
        name = f"{schema}.revs_t"
        with raw(store, backend_name) as run:
            _rev_table(run, name)
        _guarded_and_removed(store, backend_name, name)
        # and fencing's commits on it move the version exactly once
        store.guard_table(name, version="rev")
        table = store.table(name, key="id", version="rev")
        out = table.commit(table.intent(1, "ship"), {"status": "shipped"})
        assert isinstance(out, fencing.Committed) and out.record.version == 2


@pytest.mark.backends(only=lambda name: name.startswith("sqlite"))
def test_the_sqlite_guard_needs_a_unique_key(store: Any, backend_name: str) -> None:
    # SQLite's bump finds its row by the key: a shared key would bump every row that has it
    with raw(store, backend_name) as run:
        run("CREATE TABLE shared_k (rid INTEGER PRIMARY KEY, id INTEGER, version INTEGER)")
        run("INSERT INTO shared_k (rid, id, version) VALUES (1, 7, 1), (2, 7, 1)")
    with pytest.raises(fencing.SchemaError, match="must be unique"):
        store.guard_table("shared_k", key="id")
    with raw(store, backend_name) as run:
        assert run("SELECT name FROM sqlite_master WHERE type = 'trigger'") == []
    store.guard_table("shared_k", key="rid")


@on_shared_sql
@pytest.mark.apis(only=["sync"])  # the CLI is sync: one run is enough
def test_the_cli_removes_a_custom_column_guard_on_a_qualified_table(
    store: Any, store_url: str, backend_name: str, api: str
) -> None:
    with _other_schema(store, backend_name) as schema:
        name = f"{schema}.revs_t"
        with raw(store, backend_name) as run:
            _rev_table(run, name)
        args = ["migrate", store_url, "--guard-table", name, "--version-column", "rev"]
        assert main(args) == 0
        with raw(store, backend_name) as run:
            run(f"UPDATE {name} SET status = 'x' WHERE id = 1")
            assert _rev(run, name) == 2
        assert main(["migrate", store_url, "--unguard-table", name]) == 0
        with raw(store, backend_name) as run:
            run(f"UPDATE {name} SET status = 'y' WHERE id = 1")
            assert _rev(run, name) == 2
