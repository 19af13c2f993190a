"""The strict guard and the blind-writer audit (issue 22, item 2).

Strict mode (``store.guard_table(name, mode="strict")``): on every SQL backend, sync and
async, an UPDATE that leaves the version unchanged is refused by the database (an error
naming the trigger, so the table; ``GuardRefused`` once translated), the row unchanged;
one that moves it on passes (fencing's commit, ``version = version + 1``, SQLAlchemy's
``version_id_col`` flush); one that sets it lower is refused as in bump mode. Switching
modes replaces the trigger. The blind writers of the SQLAlchemy trial (a plain ORM save,
a bulk Core ``UPDATE``, a full-row save of a stale object) are each refused, and each
reported by ``fencing.testing.WriteAudit``, which says nothing of a fenced commit or a
versioned flush. The Django trial is tests/django/test_audit.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fencing
from fencing._cli import main
from fencing.testing import BlindWriteError, WriteAudit

from .test_guard import (
    SQL,
    TABLE,
    TRIGGER,
    _model,
    _row,
    _sql_only,
    _sync_backend,
    _translate,
    _version,
    engine,  # noqa: F401 (a fixture)
    on_shared_sql,
    on_sql,
    raw,
)

STRICT = re.escape("refused by fencing (strict): the version must move")


@pytest.fixture
def strict(store: Any, backend_name: str, make_table: Any) -> Any:
    _sql_only(backend_name)
    table = make_table(TABLE, [{"id": 1, "status": "new"}, {"id": 2, "status": "new"}])
    store.guard_table(TABLE, version="version", key="id", mode="strict")
    return table


@on_sql
def test_strict_refuses_an_update_that_leaves_the_version(
    store: Any, backend_name: str, strict: Any
) -> None:
    with raw(store, backend_name) as run:
        for blind in (
            f"UPDATE {TABLE} SET status = 'x' WHERE id = 1",  # the version left out
            f"UPDATE {TABLE} SET status = 'x', version = 1 WHERE id = 1",  # set as it was
            f"UPDATE {TABLE} SET status = 'x'",  # every row: the whole statement undone
        ):
            with pytest.raises(Exception, match=r"strict\): the version must move") as caught:
                run(blind)
            assert TRIGGER in str(caught.value)
            assert isinstance(_translate(backend_name, caught.value), fencing.GuardRefused)
            assert _row(run) == (1, 1, "new")
        assert tuple(run(f"SELECT version, status FROM {TABLE} WHERE id = 2")[0]) == (1, "new")
        with pytest.raises(Exception, match="never moves backwards"):  # lower: as ever
            run(f"UPDATE {TABLE} SET status = 'x', version = 0 WHERE id = 1")
        run(f"UPDATE {TABLE} SET status = 'moved', version = version + 1 WHERE id = 1")
        assert _row(run) == (1, 2, "moved")


@on_sql
def test_strict_lets_fencings_commits_through(store: Any, backend_name: str, strict: Any) -> None:
    intent = strict.intent(1, "ship")
    for expected in (2, 3):
        outcome = strict.commit(strict.intent(1, "ship"), {"status": f"s{expected}"})
        assert isinstance(outcome, fencing.Committed) and outcome.record.version == expected
    results = strict.commit_many([(strict.intent(k, "ship"), {"status": "b"}) for k in (1, 2)])
    assert [r.record.version for r in results] == [4, 2]
    assert isinstance(strict.commit(intent, {"status": "late"}), fencing.Stale)
    with raw(store, backend_name) as run:
        assert _version(run) == 4


# servers only: the SQLite raw writer holds the store's own connection (and its lock)
@pytest.mark.backends(only=lambda name: name in ("postgresql", "mysql"))
@pytest.mark.apis(only=["sync"])
@pytest.mark.timeout(120)
def test_blind_writers_racing_fenced_commits_are_all_refused(
    store: Any, backend_name: str, strict: Any
) -> None:
    """Threads: fenced commits (read, decide, commit), raw writers that move the version
    themselves, and blind writers, all on row 1 at once. Every blind write is refused;
    the version ends at 1 + the commits that applied + the moving writes: none lost,
    none counted twice."""
    import threading

    rounds, committed, moved, refused, errors = 15, [], [], [], []
    start = threading.Barrier(6)

    def fenced(worker: int) -> None:
        start.wait()
        for n in range(rounds):
            outcome = strict.commit(strict.intent(1, "ship"), {"status": f"f{worker}.{n}"})
            if isinstance(outcome, fencing.Committed):
                committed.append(outcome.record.version)

    def raw_writer(blind: bool) -> None:
        with raw(store, backend_name) as run:
            start.wait()
            for n in range(rounds):
                if blind:
                    try:
                        run(f"UPDATE {TABLE} SET status = 'blind{n}' WHERE id = 1")
                    except Exception as exc:  # the database's refusal, per driver
                        (refused if "strict" in str(exc) else errors).append(exc)
                    else:
                        errors.append(AssertionError("a blind write landed"))
                else:
                    run(f"UPDATE {TABLE} SET version = version + 1 WHERE id = 1")
                    moved.append(n)

    threads = [threading.Thread(target=fenced, args=(w,)) for w in range(2)]
    threads += [threading.Thread(target=raw_writer, args=(b,)) for b in (True, True, False, False)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert len(refused) == 2 * rounds
    assert len(set(committed)) == len(committed)  # each commit its own version
    with raw(store, backend_name) as run:
        assert _version(run) == 1 + len(committed) + len(moved)


@on_sql
def test_switching_modes_replaces_the_trigger(store: Any, backend_name: str, strict: Any) -> None:
    store.guard_table(TABLE, mode="strict")  # again: the same
    store.guard_table(TABLE)  # bump mode again: the blind write is bumped, not refused
    with raw(store, backend_name) as run:
        run(f"UPDATE {TABLE} SET status = 'x' WHERE id = 1")
        assert _row(run) == (1, 2, "x")
    store.guard_table(TABLE, mode="strict")
    with raw(store, backend_name) as run:
        with pytest.raises(Exception, match=STRICT):
            run(f"UPDATE {TABLE} SET status = 'y' WHERE id = 1")
        assert _row(run) == (1, 2, "x")
    store.unguard_table(TABLE)
    with raw(store, backend_name) as run:
        run(f"UPDATE {TABLE} SET status = 'z' WHERE id = 1")
        assert _row(run) == (1, 2, "z")


@on_sql
def test_a_bad_mode_is_refused_before_anything_is_written(
    store: Any, backend_name: str, make_table: Any
) -> None:
    _sql_only(backend_name)
    make_table(TABLE, [{"id": 1, "status": "new"}])
    for bad in ("STRICT", "refuse", None, 1):
        with pytest.raises(fencing.InvalidInput, match="guard mode"):
            store.guard_table(TABLE, mode=bad)
    with raw(store, backend_name) as run:
        run(f"UPDATE {TABLE} SET status = 'x' WHERE id = 1")
        assert _row(run) == (1, 1, "x")  # no trigger was made


@pytest.mark.backends(only=lambda name: name not in SQL)
def test_strict_is_refused_without_sql(store: Any, backend_name: str) -> None:
    with pytest.raises(fencing.ConfigurationError, match="guard trigger is for SQL tables"):
        store.guard_table(TABLE, mode="strict")


@on_shared_sql
@pytest.mark.apis(only=["sync"])  # the CLI is sync: one run is enough
def test_the_cli_installs_a_strict_guard(
    store: Any, store_url: str, backend_name: str, api: str, make_table: Any
) -> None:
    make_table(TABLE, [{"id": 1, "status": "new"}])
    assert main(["migrate", store_url, "--guard-table", TABLE, "--guard-mode", "strict"]) == 0
    with raw(store, backend_name) as run, pytest.raises(Exception, match=STRICT):
        run(f"UPDATE {TABLE} SET status = 'x' WHERE id = 1")
    assert main(["migrate", store_url, "--guard-table", TABLE]) == 0  # back to bump
    with raw(store, backend_name) as run:
        run(f"UPDATE {TABLE} SET status = 'x' WHERE id = 1")
        assert _version(run) == 2


# -- the SQLAlchemy trial: its blind writers, refused and reported ---------------------------
def _blind_writers() -> Iterator[tuple[str, Any]]:
    """(name, write) of each blind writer the SQLAlchemy trial found: ``write(session)``."""
    from sqlalchemy import text, update

    Plain = _model(versioned=False)

    def orm_save(session: Any) -> None:  # a plain mapped class: only status in its SET
        order = session.get(Plain, 1)
        order.status = "packed"
        session.flush()

    def bulk_core_update(session: Any) -> None:
        session.execute(update(Plain.__table__).values(status="bulk"))

    def full_row_save(session: Any) -> None:  # every column, the version as it was read
        session.execute(
            text(f"UPDATE {TABLE} SET status = :s, version = :v WHERE id = :id"),
            {"s": "full", "v": 1, "id": 1},
        )

    yield from (
        ("orm save", orm_save),
        ("bulk core update", bulk_core_update),
        ("full-row save", full_row_save),
    )


@on_shared_sql
@pytest.mark.apis(only=["sync"])  # the ORM writes through its own sync engine
def test_each_sqlalchemy_blind_writer_is_refused_and_reported(
    engine: Any,  # noqa: F811 (the fixture)
    strict: Any,
) -> None:
    from sqlalchemy.exc import DBAPIError
    from sqlalchemy.orm import Session

    for name, write in _blind_writers():
        audit = WriteAudit([TABLE])
        with audit.sqlalchemy(engine), Session(engine) as session:
            with pytest.raises(DBAPIError, match=STRICT):
                write(session)
            session.rollback()
        assert [f.table for f in audit.findings] == [TABLE], name
        assert "UPDATE" in audit.findings[0].statement and TABLE in str(audit.findings[0])
        assert strict.get(1).version == 1 and strict.get(1).state["status"] == "new", name


@on_shared_sql
@pytest.mark.apis(only=["sync"])
def test_the_audit_reports_blind_writers_where_no_guard_is(
    engine: Any,  # noqa: F811 (the fixture)
    store: Any,
    make_table: Any,
) -> None:
    from sqlalchemy.orm import Session

    make_table(TABLE, [{"id": 1, "status": "new"}, {"id": 2, "status": "new"}])
    for name, write in _blind_writers():
        audit = WriteAudit({TABLE: "version"}, test="the trial")
        with audit.sqlalchemy(engine), Session(engine) as session:
            write(session)
            session.commit()
        with pytest.raises(BlindWriteError, match=TABLE) as caught:
            audit.assert_clean()
        assert "the trial: UPDATE of table" in str(caught.value), name
        assert "without moving its version column 'version' (sqlalchemy)" in str(caught.value)


@on_shared_sql
@pytest.mark.apis(only=["sync"])
def test_no_report_and_no_refusal_on_a_fenced_commit_or_a_versioned_flush(
    engine: Any,  # noqa: F811 (the fixture)
    store: Any,
    strict: Any,
) -> None:
    from sqlalchemy.orm import Session

    Versioned = _model(versioned=True)
    audit = WriteAudit([TABLE])
    with audit.sqlalchemy(engine):
        with Session(engine) as session:
            order = session.get(Versioned, 1)
            order.status = "flushed"
            session.commit()
            assert order.version == 2
        with Session(engine) as session:  # a fenced commit in the session's transaction
            orders = store.using(session).table(TABLE, key="id", version="version")
            out = orders.commit(orders.intent(1, "ship"), {"status": "shipped"})
            assert isinstance(out, fencing.Committed) and out.record.version == 3
            session.commit()
        with Session(engine) as session:  # a hand-written UPDATE that moves it on
            from sqlalchemy import text

            session.execute(text(f"UPDATE {TABLE} SET version = version + 1 WHERE id = 2"))
            session.commit()
    assert audit.findings == []
    audit.assert_clean()
    assert strict.get(1).version == 3 and strict.get(2).version == 2


@pytest.mark.backends(only=lambda name: name.startswith("sqlite"))
@pytest.mark.apis(only=["sync"])
def test_no_report_on_fencings_own_statements(store: Any, backend_name: str, strict: Any) -> None:
    # fencing's commits go to its own connection (or a DB-API connection under
    # store.using()), where no ORM hook sees them: read the SQLite store's own connection
    conn = _sync_backend(store).conn
    audit = WriteAudit([TABLE])
    with audit.sqlite3(conn):
        out = strict.commit(strict.intent(1, "ship"), {"status": "shipped"})
        many = strict.commit_many([(strict.intent(k, "pack"), {"status": "p"}) for k in (1, 2)])
        assert isinstance(out, fencing.Committed) and [r.record.version for r in many] == [3, 2]
        # the same connection: a blind write is read
        with raw(store, backend_name) as run, pytest.raises(Exception, match=STRICT):
            run(f"UPDATE {TABLE} SET status = 'x' WHERE id = 2")
    assert [f.statement for f in audit.findings] == [
        f"UPDATE {TABLE} SET status = 'x' WHERE id = 2"
    ]


@on_shared_sql
@pytest.mark.apis(only=["sync"])
def test_allow_fencing_reports_every_write_but_fencings_own(
    engine: Any,  # noqa: F811 (the fixture)
    store: Any,
    make_table: Any,
) -> None:
    from sqlalchemy import text
    from sqlalchemy.orm import Session

    make_table(TABLE, [{"id": 1, "status": "new"}])
    Versioned = _model(versioned=True)
    audit = WriteAudit([TABLE], allow="fencing")
    with audit.sqlalchemy(engine):
        with Session(engine) as session:  # fencing's commit, in the session's transaction
            orders = store.using(session).table(TABLE, key="id", version="version")
            out = orders.commit(orders.intent(1, "ship"), {"status": "shipped"})
            assert isinstance(out, fencing.Committed)
            session.commit()
        assert audit.findings == []
        with Session(engine) as session:  # a versioned flush: outside fencing all the same
            session.get(Versioned, 1).status = "flushed"
            session.commit()
        with Session(engine) as session:
            session.execute(text(f"UPDATE {TABLE} SET version = version + 1 WHERE id = 1"))
            session.commit()
    assert [f.outside for f in audit.findings] == [True, True]
    assert "UPDATE of table 'orders_t' outside fencing (sqlalchemy)" in str(audit.findings[0])
    assert "2 write(s) outside fencing" in audit.report()


# -- the audit's reading of statements, and its other hooks -----------------------------------
@pytest.mark.parametrize(
    ("statement", "blind"),
    [
        ("UPDATE orders SET status = ? WHERE id = ?", True),
        ('UPDATE "orders" SET "status" = %s, "version" = %s WHERE "orders"."id" = %s', True),
        ("UPDATE `orders` SET `status` = %s WHERE `orders`.`id` = %s", True),
        ("UPDATE orders SET version = version WHERE id = 1", True),
        ("update main.orders as o set status = 1", True),
        ("UPDATE orders SET status=?, version=? WHERE orders.id = ? AND orders.version = ?", False),
        (
            'UPDATE "orders" SET "status" = %s, "version" = ("orders"."version" + 1)'
            ' WHERE ("orders"."id" = %s AND "orders"."version" = %s)',
            False,
        ),
        (
            "WITH w AS (UPDATE orders AS t SET status = $1, version = t.version + 1"
            " WHERE t.id = $2 AND t.version = $3 RETURNING *) SELECT * FROM w",
            False,
        ),
        ("UPDATE orders_archive SET status = 1", False),  # not watched
        ("SELECT * FROM orders WHERE id = 1 FOR UPDATE", False),
        ("INSERT INTO orders (id, status) VALUES (1, 'x')", False),
    ],
)
def test_what_the_audit_calls_blind(statement: str, blind: bool) -> None:
    audit = WriteAudit(["orders"])
    assert bool(audit.check(statement)) is blind
    assert len(audit.findings) == int(blind)


def test_the_audit_refuses_a_bad_allow_and_bad_tables() -> None:
    with pytest.raises(ValueError, match="allow must be"):
        WriteAudit(["orders"], allow="everything")
    with pytest.raises(TypeError):
        WriteAudit({"orders": None})  # type: ignore[dict-item]
    audit = WriteAudit("orders", allow="fencing")  # one name
    assert audit.check("UPDATE orders SET version = version + 1 WHERE id = 1")


def test_the_audit_reads_an_sqlite3_connection(tmp_path: Path) -> None:
    import sqlite3

    conn = sqlite3.connect(tmp_path / "a.db", isolation_level=None)
    conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, version INTEGER, status TEXT)")
    conn.execute("INSERT INTO orders VALUES (1, 1, 'new')")
    audit = WriteAudit({"orders": "version"})
    with audit.sqlite3(conn):
        conn.execute("UPDATE orders SET version = version + 1 WHERE id = 1")
        assert audit.findings == []
        conn.execute("UPDATE orders SET status = 'x' WHERE id = 1")
    conn.execute("UPDATE orders SET status = 'after' WHERE id = 1")  # no longer read
    conn.close()
    assert [(f.table, f.source) for f in audit.findings] == [("orders", "sqlite3")]
    assert "status = 'x'" in audit.findings[0].statement
    with pytest.raises(BlindWriteError, match="1 blind write"):
        audit.assert_clean()


def test_the_audit_as_a_context_manager(tmp_path: Path) -> None:
    sa = pytest.importorskip("sqlalchemy")
    lite = sa.create_engine(f"sqlite:///{tmp_path}/c.db")
    with lite.begin() as conn:
        conn.execute(sa.text("CREATE TABLE orders (id INTEGER PRIMARY KEY, rev INTEGER, s TEXT)"))
        conn.execute(sa.text("INSERT INTO orders VALUES (1, 1, 'new')"))

    def write(statement: str, fail: bool = False) -> None:
        with WriteAudit({"orders": "rev"}), lite.begin() as conn:
            conn.execute(sa.text(statement))
            if fail:
                raise KeyError("the test's own error")

    write("UPDATE orders SET s = 'moved', rev = rev + 1 WHERE id = 1")
    with pytest.raises(BlindWriteError, match=r"UPDATE orders SET s = 'x' WHERE id = 1"):
        write("UPDATE orders SET s = 'x' WHERE id = 1")
    with pytest.raises(KeyError):  # the test's own error is not hidden by the report
        write("UPDATE orders SET s = 'y' WHERE id = 1", fail=True)
    lite.dispose()
    with lite.begin() as conn:  # every lite's listener was removed on exit
        conn.execute(sa.text("UPDATE orders SET s = 'free' WHERE id = 1"))
    lite.dispose()


# -- the pytest plugin, in a pytest of its own ------------------------------------------------
PLUGIN_TESTS = """
import sqlalchemy as sa
import pytest

@pytest.fixture
def engine(tmp_path):
    engine = sa.create_engine(f"sqlite:///{tmp_path}/p.db")
    with engine.begin() as conn:
        conn.execute(sa.text(
            "CREATE TABLE orders (id INTEGER PRIMARY KEY, version INTEGER, status TEXT)"))
        conn.execute(sa.text("INSERT INTO orders VALUES (1, 1, 'new')"))
        conn.execute(sa.text("UPDATE orders SET status = 'fixture' WHERE id = 1"))  # not read
    yield engine
    engine.dispose()

@pytest.mark.fencing_audit("orders")
def test_blind(engine):
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE orders SET status = 'blind' WHERE id = 1"))

@pytest.mark.fencing_audit("orders")
def test_moved(engine):
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE orders SET version = version + 1 WHERE id = 1"))

def test_fixture(engine, fencing_audit):
    fencing_audit.watch({"orders": "version"})
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE orders SET status = 'fixture-blind' WHERE id = 1"))

def test_not_audited(engine):
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE orders SET status = 'free' WHERE id = 1"))
"""


def test_the_pytest_plugin_fails_a_marked_test_naming_statement_and_test(
    tmp_path: Path,
) -> None:
    pytest.importorskip("sqlalchemy")
    (tmp_path / "test_audited.py").write_text(textwrap.dedent(PLUGIN_TESTS))
    src = str(Path(fencing.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [
            *(sys.executable, "-W", "error", "-m", "pytest", "-p", "fencing.testing.pytest_plugin"),
            *("-p", "no:cacheprovider", "-q", "-rf", "--strict-markers", "test_audited.py"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "2 failed, 2 passed" in out, out
    assert "FAILED test_audited.py::test_blind - fencing.testing._audit.BlindWriteError" in out
    assert "FAILED test_audited.py::test_fixture - fencing.testing._audit.BlindWriteError" in out
    assert "test_audited.py::test_blind: UPDATE of table 'orders'" in out, out
    assert "UPDATE orders SET status = 'blind' WHERE id = 1" in out, out
    assert "status = 'fixture'" not in out.replace("status = 'fixture-blind'", ""), out
