"""PostgreSQL's guard trigger on a table the user owns (``docs/guard.md``): a BEFORE
UPDATE FOR EACH ROW trigger ``fencing_guard_<table>`` running a plpgsql function of the
same name, both in the table's own schema. The function bumps the version column by
one when an UPDATE leaves it unchanged (``NEW := OLD + 1``, in the writer's own
statement; in strict mode it raises ``check_violation`` instead) and raises
``check_violation`` when one sets it lower (or to NULL).

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

from ..._checks import guard_name, guard_refusal, guard_strict_refusal
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
    """The function's body, exactly as ``pg_proc.prosrc`` keeps it: an unchanged version
    bumped, or (strict mode) the UPDATE refused."""
    v = quoted(str(target.version_column))
    unchanged = f"NEW.{v} := OLD.{v} + 1;"
    if target.guard_mode == "strict":
        unchanged = (
            "RAISE EXCEPTION USING ERRCODE = 'check_violation',"
            f" MESSAGE = '{guard_strict_refusal(target)}',"
            f" DETAIL = 'version ' || coalesce(OLD.{v}::text, 'NULL') || ' left unchanged',"
            " HINT = 'move the version (version = version + 1) or commit through fencing';"
        )
    return (
        " BEGIN"
        f" IF NEW.{v} IS NOT DISTINCT FROM OLD.{v} THEN {unchanged}"
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


def _names(target: Target, schema: str | None) -> tuple[str, str, str]:
    """The trigger's name, its function's and the table's, quoted: both named
    ``fencing_guard_<table>``, in the table's schema (None: unqualified, where the
    search path finds the table and makes the function)."""
    name, table = quoted(guard_name(target)[1]), quoted(target.name.rpartition(".")[2])
    if schema is None:
        return name, name, table
    where = quoted(schema)
    return name, f"{where}.{name}", f"{where}.{table}"


def install_ddl(target: Target, schema: str | None, replace: bool) -> tuple[str, ...]:
    """The statements that (re)create the guard of ``target`` in ``schema``: its
    function, then its trigger, replaced in place if ``replace`` (PostgreSQL 14 and up),
    else dropped and created again. Also what an offline migration writes out."""
    name, function, table = _names(target, schema)
    create = f" BEFORE UPDATE ON {table} FOR EACH ROW EXECUTE FUNCTION {function}()"
    if replace:
        return (_function(target, function), f"CREATE OR REPLACE TRIGGER {name}{create}")
    return (
        _function(target, function),
        f"DROP TRIGGER IF EXISTS {name} ON {table}",
        f"CREATE TRIGGER {name}{create}",
    )


def remove_ddl(target: Target, schema: str | None) -> tuple[str, ...]:
    """The statements that drop the guard (fine if it is not there)."""
    name, function, table = _names(target, schema)
    return (f"DROP TRIGGER IF EXISTS {name} ON {table}", f"DROP FUNCTION IF EXISTS {function}()")


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
    ddl = install_ddl(target, schema, version >= _REPLACE_TRIGGER)
    yield Pipeline(tuple(Query(text) for text in ddl))


def remove(target: Target) -> Flow[None]:
    """Drop the trigger and its function (fine if they, or the table, are not there)."""
    schema = yield from _found(target, None)
    if schema is None:
        return
    yield Pipeline(tuple(Query(text) for text in remove_ddl(target, schema)))
