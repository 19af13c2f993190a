"""Installing a guard that is already there as it would be (issue 18, item 7) changes
nothing and takes no lock: a deploy that runs ``fencing migrate --guard-table`` again must
not wait behind the table's open writers, nor block its other writers meanwhile. A guard
that differs (its function edited, its trigger disabled) is replaced in place.

Each test holds a writer's transaction open on the table (an uncommitted UPDATE), then
installs the guard again: it must return while that transaction is still open.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

import pytest

from .test_guard import TABLE, TRIGGER, raw
from .test_postgres import in_thread

ROWS = [{"id": 1, "status": "new"}, {"id": 2, "status": "new"}]
WAIT = 20.0  # seconds: the unfixed install waits for the writer, forever


@contextmanager
def open_writer(store: Any, backend_name: str, url: str) -> Iterator[None]:
    """Another session's transaction, open, holding an UPDATE of row 2 (not committed)."""
    if backend_name == "sqlite-file":
        writer = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        writer.execute("BEGIN IMMEDIATE")  # the database's write lock, held
        writer.execute(f"UPDATE {TABLE} SET status = 'writing' WHERE id = 2")
        try:
            yield
        finally:
            writer.rollback()
            writer.close()
        return
    if backend_name == "postgresql":
        from .backends_postgres import connect

        with connect(store) as pg:
            pg.execute("BEGIN")
            pg.execute(f"UPDATE {TABLE} SET status = 'writing' WHERE id = 2")
            try:
                yield
            finally:
                pg.execute("ROLLBACK")
        return
    from .backends_mysql import connect as my_connect

    my = my_connect(store)
    try:
        with my.cursor() as cur:
            cur.execute("BEGIN")
            cur.execute(f"UPDATE {TABLE} SET status = 'writing' WHERE id = 2")
        yield
    finally:
        my.rollback()
        my.close()


def installed(store: Any, backend_name: str) -> tuple[Any, ...]:
    """What identifies the installed guard: a new object (or a replaced one) differs."""
    with raw(store, backend_name) as run:
        if backend_name == "sqlite-file":
            return tuple(run("SELECT name, sql FROM sqlite_master WHERE type = 'trigger'"))
        if backend_name == "postgresql":
            return tuple(
                run(
                    "SELECT t.oid, t.xmin::text, t.tgenabled, p.oid, p.xmin::text, p.prosrc"
                    f" FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid"
                    f" WHERE t.tgname = '{TRIGGER}'"
                )[0]
            )
        return tuple(
            run(
                "SELECT CREATED, ACTION_STATEMENT FROM information_schema.TRIGGERS"
                f" WHERE TRIGGER_SCHEMA = DATABASE() AND TRIGGER_NAME = '{TRIGGER}'"
            )[0]
        )


def settled(future: Future[Any]) -> Any:
    """The install's result; a bounded wait, so the unfixed install fails, never hangs."""
    return future.result(timeout=WAIT)


shared = pytest.mark.backends(only=lambda name: name in ("postgresql", "mysql", "sqlite-file"))


@shared
@pytest.mark.apis(only=["sync"])
@pytest.mark.timeout(120)
def test_reinstalling_an_unchanged_guard_waits_on_no_writer(
    store: Any, store_url: str, backend_name: str, make_table: Callable[..., Any]
) -> None:
    make_table(TABLE, ROWS)
    store.guard_table(TABLE, version="version", key="id")
    before = installed(store, backend_name)
    with open_writer(store, backend_name, store_url):
        settled(in_thread(lambda: store.guard_table(TABLE, version="version", key="id")))
    assert installed(store, backend_name) == before  # nothing replaced
    with raw(store, backend_name) as run:
        run(f"UPDATE {TABLE} SET status = 'x' WHERE id = 1")  # still guarded
        assert int(run(f"SELECT version FROM {TABLE} WHERE id = 1")[0][0]) == 2


@pytest.mark.backends(only=lambda name: name == "postgresql")
@pytest.mark.apis(only=["sync"])
def test_a_changed_postgresql_guard_is_replaced_in_place(
    store: Any, backend_name: str, make_table: Callable[..., Any]
) -> None:
    make_table(TABLE, ROWS)
    store.guard_table(TABLE, version="version", key="id")
    trigger, _, _, function, _, body = installed(store, backend_name)
    with raw(store, backend_name) as run:
        # someone edited the function, and disabled the trigger
        run(
            f"CREATE OR REPLACE FUNCTION {TRIGGER}() RETURNS trigger LANGUAGE plpgsql"
            " AS $x$ BEGIN RETURN NEW; END $x$"
        )
        run(f"ALTER TABLE {TABLE} DISABLE TRIGGER {TRIGGER}")
        run(f"UPDATE {TABLE} SET status = 'x' WHERE id = 1")
        assert int(run(f"SELECT version FROM {TABLE} WHERE id = 1")[0][0]) == 1
    store.guard_table(TABLE, version="version", key="id")
    now = installed(store, backend_name)
    assert (now[0], now[2], now[3], now[5]) == (trigger, "O", function, body)  # same objects
    with raw(store, backend_name) as run:
        run(f"UPDATE {TABLE} SET status = 'y' WHERE id = 1")
        assert int(run(f"SELECT version FROM {TABLE} WHERE id = 1")[0][0]) == 2
