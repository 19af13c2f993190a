"""MySQL / MariaDB's guard trigger on a table the user owns (``docs/guard.md``): a
BEFORE UPDATE FOR EACH ROW trigger ``fencing_guard_<table>`` that sets the version
column to the old one plus one when an UPDATE leaves it unchanged (``<=>``: NULL-safe;
in strict mode it refuses that UPDATE with ``SIGNAL`` instead), and refuses with
``SIGNAL SQLSTATE '45000'`` one that sets it lower (or to NULL).

MySQL has no ``CREATE OR REPLACE TRIGGER`` (MariaDB has) and DDL commits on its own,
so installing first reads the trigger there: the same text is left alone (a second
install changes nothing, and leaves no moment unguarded); another one is dropped and
created again in one batch.
"""

from __future__ import annotations

from typing import Final

from ..._checks import guard_name, guard_refusal, guard_strict_refusal
from ..._errors import SchemaError
from ..._flow import Flow
from ..._request import Target
from .steps import Result, Script, one
from .templates import quote

__all__ = ["install", "install_ddl", "remove", "remove_ddl", "trigger_body"]

_FIND: Final = (
    "SELECT ACTION_STATEMENT FROM information_schema.TRIGGERS"
    " WHERE TRIGGER_SCHEMA = COALESCE(%s, DATABASE()) AND TRIGGER_NAME = %s"
)


def trigger_body(target: Target) -> str:
    """The trigger's body (as ``information_schema.TRIGGERS`` gives it back)."""
    v = quote(str(target.version_column))
    unchanged = f"SET NEW.{v} = OLD.{v} + 1;"
    if target.guard_mode == "strict":
        unchanged = f"SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{guard_strict_refusal(target)}';"
    return (
        f"BEGIN IF NEW.{v} < OLD.{v} OR (NEW.{v} IS NULL AND OLD.{v} IS NOT NULL) THEN"
        f" SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{guard_refusal(target)}';"
        f" ELSEIF NEW.{v} <=> OLD.{v} THEN {unchanged} END IF; END"
    )


def install(target: Target, columns: frozenset[str]) -> Flow[None]:
    """(Re)create the trigger unless it is there as it would be; ``columns`` are the
    table's (the flow that calls this read them: the table exists and is InnoDB)."""
    if target.version_column not in columns:
        raise SchemaError(f"table {target.name!r} has no version column {target.version_column!r}")
    database, name = guard_name(target)
    body = trigger_body(target)
    found: list[Result] = yield one(_FIND, database, name)
    if found[0].rows and str(found[0].rows[0][0]) == body:
        return
    yield Script(*install_ddl(target)).batch()


def install_ddl(target: Target) -> tuple[str, str]:
    """The statements that (re)create the trigger: dropped, then created (in the table's
    database: a trigger must be). Also what an offline migration writes out."""
    trigger, table = _trigger(target), quote(target.name)
    return (
        remove_ddl(target),
        f"CREATE TRIGGER {trigger} BEFORE UPDATE ON {table} FOR EACH ROW {trigger_body(target)}",
    )


def remove_ddl(target: Target) -> str:
    """The statement that drops the trigger (fine if it is not there)."""
    return f"DROP TRIGGER IF EXISTS {_trigger(target)}"


def remove(target: Target) -> Flow[None]:
    """Drop the trigger (fine if it is not there)."""
    yield one(remove_ddl(target))


def _trigger(target: Target) -> str:
    """The trigger's name, quoted: ``database``.``fencing_guard_<table>`` for a
    ``database.table``, else ``fencing_guard_<table>`` in this database."""
    database, name = guard_name(target)
    return quote(name if database is None else f"{database}.{name}")
