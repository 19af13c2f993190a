"""SQLite's guard trigger on a table the user owns (``docs/guard.md``).

A BEFORE UPDATE trigger cannot change NEW in SQLite, so the guard is two triggers:

* ``fencing_guard_<table>``: AFTER UPDATE, WHEN the version is unchanged, sets it to the
  old one plus one on the same row (found by the key column, so a WITHOUT ROWID table
  works too). Its own UPDATE moves the version, so it never fires itself again, with
  or without ``PRAGMA recursive_triggers``; it runs inside the writer's statement, so the
  write and the bump are one atomic change. In strict mode it is a BEFORE UPDATE trigger
  instead, WHEN the version is unchanged, that ``RAISE(ABORT, ...)``: a blind write is
  refused;
* ``fencing_guardlow_<table>``: BEFORE UPDATE, WHEN the version would go lower (or to
  NULL), ``RAISE(ABORT, ...)``: the statement is undone, the transaction goes on.

Installing first reads both triggers' text (a read transaction): already as they would be,
nothing is written and no write lock taken (no wait for an open writer); otherwise it
drops and creates both in one transaction (idempotent, atomic).
"""

from __future__ import annotations

import sqlite3

from ..._checks import (
    GUARD_PREFIX,
    check_unique_key,
    guard_name,
    guard_refusal,
    guard_strict_refusal,
)
from ..._errors import SchemaError
from ..._request import Target
from .operations import describe
from .statements import quote

__all__ = ["install", "install_ddl", "installed", "remove", "remove_ddl", "trigger_names"]

LOW_PREFIX = "fencing_guardlow_"


def trigger_names(target: Target) -> tuple[str, str]:
    """The bump trigger's name and the refusal trigger's (in the table's database)."""
    name = guard_name(target)[1]
    return name, LOW_PREFIX + name[len(GUARD_PREFIX) :]


def _schema(target: Target) -> str:
    """``"main".``, the table's database as a prefix of a trigger's name, or nothing."""
    schema = guard_name(target)[0]
    return "" if schema is None else quote(schema) + "."


def _create(target: Target) -> tuple[str, str]:
    # A trigger lives in its table's database and names the table unqualified there.
    where = _schema(target)
    bump, low = (where + quote(n) for n in trigger_names(target))
    t, v = quote(target.name.rpartition(".")[2]), quote(str(target.version_column))
    k = quote(target.key_column)
    unchanged = (
        f"CREATE TRIGGER {bump} AFTER UPDATE ON {t} FOR EACH ROW"
        f" WHEN NEW.{v} IS OLD.{v}"
        f" BEGIN UPDATE {t} SET {v} = OLD.{v} + 1 WHERE {k} = NEW.{k}; END"
    )
    if target.guard_mode == "strict":
        unchanged = (
            f"CREATE TRIGGER {bump} BEFORE UPDATE ON {t} FOR EACH ROW"
            f" WHEN NEW.{v} IS OLD.{v}"
            f" BEGIN SELECT RAISE(ABORT, '{guard_strict_refusal(target)}'); END"
        )
    return (
        unchanged,
        f"CREATE TRIGGER {low} BEFORE UPDATE OF {v} ON {t} FOR EACH ROW"
        f" WHEN NEW.{v} < OLD.{v} OR (NEW.{v} IS NULL AND OLD.{v} IS NOT NULL)"
        f" BEGIN SELECT RAISE(ABORT, '{guard_refusal(target)}'); END",
    )


def remove_ddl(target: Target) -> tuple[str, ...]:
    """The statements that drop both triggers (fine if they are not there)."""
    return tuple(
        f"DROP TRIGGER IF EXISTS {_schema(target)}{quote(n)}" for n in trigger_names(target)
    )


def install_ddl(target: Target) -> tuple[str, ...]:
    """The statements that (re)create both triggers: dropped, then created. Also what
    an offline migration writes out."""
    return (*remove_ddl(target), *_create(target))


def _drop(conn: sqlite3.Connection, target: Target) -> None:
    for text in remove_ddl(target):
        conn.execute(text)


def installed(conn: sqlite3.Connection, target: Target) -> bool:
    """Check the table and its columns as ``install`` does; whether both triggers are
    there as it would make them (``sqlite_master`` keeps each one's text, its schema
    prefix dropped). A read: ``guard_table`` runs it first, so that installing a guard
    that is there already takes no write lock (and waits for no open writer)."""
    _check(conn, target)
    where = _schema(target)
    names = trigger_names(target)
    found = dict(
        conn.execute(
            f"SELECT name, sql FROM {where}sqlite_master WHERE type = 'trigger' AND name IN (?, ?)",
            names,
        ).fetchall()
    )
    wanted = [t.replace(f"CREATE TRIGGER {where}", "CREATE TRIGGER ", 1) for t in _create(target)]
    return [found.get(name) for name in names] == wanted


def install(conn: sqlite3.Connection, target: Target) -> None:
    """Check the table and its columns (the key unique: the bump finds its row by it),
    then (re)create both triggers."""
    _check(conn, target)
    for text in install_ddl(target):
        conn.execute(text)


def _check(conn: sqlite3.Connection, target: Target) -> None:
    found = describe(conn, target.name)
    if found is None:
        raise SchemaError(f"table {target.name!r} does not exist")
    names, unique = found
    for column, what in ((target.version_column, "version"), (target.key_column, "key")):
        if column not in names:
            raise SchemaError(f"table {target.name!r} has no {what} column {column!r}")
    check_unique_key(target, names, unique)


def remove(conn: sqlite3.Connection, target: Target) -> None:
    """Drop both triggers (fine if they are not there; a database not attached: nothing
    to drop)."""
    if guard_name(target)[0] is not None and describe(conn, target.name) is None:
        return
    _drop(conn, target)
