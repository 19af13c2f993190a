"""PostgreSQL's guard trigger on a table the user owns (``docs/guard.md``): a BEFORE
UPDATE FOR EACH ROW trigger ``fencing_guard_<table>`` running a plpgsql function of the
same name, both in the table's own schema. The function bumps the version column by
one when an UPDATE leaves it unchanged (``NEW := OLD + 1``, in the writer's own
statement) and raises ``check_violation`` when one sets it lower (or to NULL).

Installing first reads what is there (catalogs only: no lock on the table): a trigger and
function already as they would be are left alone, so a second install (a deploy running
``fencing migrate --guard-table`` again) changes nothing and waits on no writer. Otherwise
one pipeline, one transaction: the function replaced, the trigger replaced in place
(``CREATE OR REPLACE TRIGGER``, PostgreSQL 14 and up; before, dropped and created again).
Either takes a SHARE ROW EXCLUSIVE lock on the table, so it waits for open writers.
Removing drops both.
"""

from __future__ import annotations

from typing import Final

from ..._checks import guard_name, guard_refusal
from ..._errors import SchemaError
from ..._flow import Flow
from ..._request import Target
from .statements import quoted
from .steps import Answer, Pipeline, Query, read_only

__all__ = ["install", "install_ddl", "remove", "remove_ddl"]

# The table (as the search path finds it), its schema, and whether it has the column.
_FIND: Final = (
    "SELECT n.nspname, EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a"
    " WHERE a.attrelid = c.oid AND a.attname = %(column)s AND a.attnum > 0"
    " AND NOT a.attisdropped)"
    " FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
    " WHERE c.oid = to_regclass(%(table)s)"
)


# The installed guard as the catalogs hold it: the function's body (``prosrc``, the text
# between the dollar quotes, kept verbatim), and the trigger's kind (``tgtype`` 19:
# ROW | BEFORE | UPDATE), state, arguments, columns and condition; and the server's version.
_INSTALLED: Final = (
    "SELECT p.prosrc, l.lanname, p.pronargs, p.prorettype = 'trigger'::regtype,"
    " t.tgtype, t.tgenabled, t.tgnargs, t.tgattr::text, t.tgqual IS NULL,"
    " current_setting('server_version_num')::int"
    " FROM (SELECT 1) AS fencing_one"
    " LEFT JOIN pg_catalog.pg_trigger t ON t.tgrelid = to_regclass(%(table)s)"
    " AND t.tgname = %(name)s AND NOT t.tgisinternal"
    " LEFT JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid AND p.proname = %(name)s"
    " AND p.pronamespace = (SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = %(schema)s)"
    " LEFT JOIN pg_catalog.pg_language l ON l.oid = p.prolang"
)
_AS_INSTALLED: Final = ("plpgsql", 0, True, 19, "O", 0, "", True)
_REPLACE_TRIGGER: Final = 140000  # CREATE OR REPLACE TRIGGER, from PostgreSQL 14


def _body(target: Target) -> str:
    """The function's body, exactly as ``pg_proc.prosrc`` keeps it."""
    v = quoted(str(target.version_column))
    return (
        " BEGIN"
        f" IF NEW.{v} IS NOT DISTINCT FROM OLD.{v} THEN NEW.{v} := OLD.{v} + 1;"
        f" ELSIF NEW.{v} < OLD.{v} OR (NEW.{v} IS NULL AND OLD.{v} IS NOT NULL) THEN"
        " RAISE EXCEPTION USING ERRCODE = 'check_violation',"
        f" MESSAGE = '{guard_refusal(target)}',"
        f" DETAIL = 'from ' || OLD.{v} || ' to ' || coalesce(NEW.{v}::text, 'NULL');"
        " END IF; RETURN NEW; END "
    )


def _function(target: Target, function: str) -> str:
    # No percent sign anywhere: the driver sends this text with (empty) parameters.
    return (
        f"CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS"
        f" $fencing${_body(target)}$fencing$"
    )


def _found(target: Target, column: str | None) -> Flow[str | None]:
    """The schema of the table (``shop.orders``: ``shop``; a plain name: where the search
    path finds it), or None if there is no such table; ``column``, if given, must be one
    of its columns (removing needs none: the names never depend on the column)."""
    params = {"table": quoted(target.name), "column": column or ""}
    found: Answer = yield from read_only(Query(_FIND, params))
    if not found.rows:
        return None
    schema, has_column = found.rows[0]
    if column is not None and not has_column:
        raise SchemaError(f"table {target.name!r} has no version column {column!r}")
    return str(schema)


def _names(target: Target, schema: str) -> tuple[str, str, str]:
    """The trigger's name, its function's and the table's, quoted: both named
    ``fencing_guard_<table>``, in the table's schema."""
    where, name = quoted(schema), quoted(guard_name(target)[1])
    return name, f"{where}.{name}", f"{where}.{quoted(target.name.rpartition('.')[2])}"


def install(target: Target) -> Flow[None]:
    """Check the table and its version column; unless the function and trigger are there
    as they would be (then nothing is changed, and no lock taken), (re)create them."""
    column = str(target.version_column)
    schema = yield from _found(target, column)
    if schema is None:
        raise SchemaError(f"table {target.name!r} does not exist")
    table = _names(target, schema)[2]
    params = {"table": table, "name": guard_name(target)[1], "schema": schema}
    found: Answer = yield from read_only(Query(_INSTALLED, params))
    body, *kind, version = found.rows[0]
    if body == _body(target) and tuple(kind) == _AS_INSTALLED:
        return
    yield Pipeline(tuple(Query(ddl) for ddl in install_ddl(target, schema, version)))


def install_ddl(target: Target, schema: str, server_version: int) -> tuple[str, ...]:
    """The statements that (re)create the guard of ``target`` in ``schema`` (the table's),
    on a server of ``server_version`` (``server_version_num``)."""
    name, function, table = _names(target, schema)
    create = f" BEFORE UPDATE ON {table} FOR EACH ROW EXECUTE FUNCTION {function}()"
    if server_version >= _REPLACE_TRIGGER:
        trigger: tuple[str, ...] = (f"CREATE OR REPLACE TRIGGER {name}{create}",)
    else:
        trigger = (f"DROP TRIGGER IF EXISTS {name} ON {table}", f"CREATE TRIGGER {name}{create}")
    return (_function(target, function), *trigger)


def remove_ddl(target: Target, schema: str) -> tuple[str, str]:
    """The statements that drop the guard of ``target`` in ``schema`` (the table's)."""
    name, function, table = _names(target, schema)
    return f"DROP TRIGGER IF EXISTS {name} ON {table}", f"DROP FUNCTION IF EXISTS {function}()"


def remove(target: Target) -> Flow[None]:
    """Drop the trigger and its function (fine if they, or the table, are not there)."""
    schema = yield from _found(target, None)
    if schema is None:
        return
    yield Pipeline(tuple(Query(ddl) for ddl in remove_ddl(target, schema)))
