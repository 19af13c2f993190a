"""PostgreSQL's guard trigger on a table the user owns (``docs/guard.md``): a BEFORE
UPDATE FOR EACH ROW trigger ``fencing_guard_<table>`` running a plpgsql function of the
same name, both in the table's own schema. The function bumps the version column by
one when an UPDATE leaves it unchanged (``NEW := OLD + 1``, in the writer's own
statement) and raises ``check_violation`` when one sets it lower (or to NULL).

Installing is one pipeline, one transaction: the function replaced, the trigger dropped
and created again; a second install changes nothing. Removing drops both.
"""

from __future__ import annotations

from typing import Final

from ..._checks import GUARD_PREFIX, guard_refusal
from ..._errors import SchemaError
from ..._flow import Flow
from ..._request import Target
from .statements import quoted
from .steps import Answer, Pipeline, Query, read_only

__all__ = ["install", "remove"]

# The table (as the search path finds it), its schema, and whether it has the column.
_FIND: Final = (
    "SELECT n.nspname, EXISTS (SELECT 1 FROM pg_catalog.pg_attribute a"
    " WHERE a.attrelid = c.oid AND a.attname = %(column)s AND a.attnum > 0"
    " AND NOT a.attisdropped)"
    " FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
    " WHERE c.oid = to_regclass(%(table)s)"
)


def _function(target: Target, function: str) -> str:
    v = quoted(str(target.version_column))
    # No percent sign anywhere: the driver sends this text with (empty) parameters.
    return (
        f"CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS"
        " $fencing$ BEGIN"
        f" IF NEW.{v} IS NOT DISTINCT FROM OLD.{v} THEN NEW.{v} := OLD.{v} + 1;"
        f" ELSIF NEW.{v} < OLD.{v} OR (NEW.{v} IS NULL AND OLD.{v} IS NOT NULL) THEN"
        " RAISE EXCEPTION USING ERRCODE = 'check_violation',"
        f" MESSAGE = '{guard_refusal(target)}',"
        f" DETAIL = 'from ' || OLD.{v} || ' to ' || coalesce(NEW.{v}::text, 'NULL');"
        " END IF; RETURN NEW; END $fencing$"
    )


def _found(target: Target, column: str) -> Flow[str | None]:
    """The schema of the table, or None if there is no such table."""
    params = {"table": quoted(target.name), "column": column}
    found: Answer = yield from read_only(Query(_FIND, params))
    if not found.rows:
        return None
    schema, has_column = found.rows[0]
    if not has_column:
        raise SchemaError(f"table {target.name!r} has no version column {column!r}")
    return str(schema)


def install(target: Target) -> Flow[None]:
    """Check the table and its version column, then (re)create the function and trigger."""
    column = str(target.version_column)
    schema = yield from _found(target, column)
    if schema is None:
        raise SchemaError(f"table {target.name!r} does not exist")
    name = quoted(GUARD_PREFIX + target.name)
    function, table = f"{quoted(schema)}.{name}", f"{quoted(schema)}.{quoted(target.name)}"
    yield Pipeline(
        (
            Query(_function(target, function)),
            Query(f"DROP TRIGGER IF EXISTS {name} ON {table}"),
            Query(
                f"CREATE TRIGGER {name} BEFORE UPDATE ON {table}"
                f" FOR EACH ROW EXECUTE FUNCTION {function}()"
            ),
        )
    )


def remove(target: Target) -> Flow[None]:
    """Drop the trigger and its function (fine if they, or the table, are not there)."""
    schema = yield from _found(target, str(target.version_column))
    name = quoted(GUARD_PREFIX + target.name)
    if schema is None:
        return
    yield Pipeline(
        (
            Query(f"DROP TRIGGER IF EXISTS {name} ON {quoted(schema)}.{quoted(target.name)}"),
            Query(f"DROP FUNCTION IF EXISTS {quoted(schema)}.{name}()"),
        )
    )
