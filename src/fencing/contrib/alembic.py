"""Alembic: fencing's tables made and upgraded by the application's own migrations, and
left alone by autogenerate (``pip install 'fencing[alembic]'``; docs: ``docs/alembic.md``).

A migration::

    from alembic import op
    from fencing.contrib.alembic import downgrade_fencing, upgrade_fencing

    def upgrade():
        upgrade_fencing(op)             # PostgreSQL: upgrade_fencing(op, schema="fencing")

    def downgrade():
        downgrade_fencing(op)           # drops fencing's tables, their data with them

``env.py``::

    from fencing.contrib.alembic import exclude_fencing

    context.configure(connection=connection, target_metadata=target_metadata,
                      **exclude_fencing(include_object=my_own_hook))   # the hook optional

``upgrade_fencing`` runs what ``fencing migrate URL`` runs, the backend package's own
migrate flow (its ``.sql`` files and upgrades), on the migration's connection and in its
transaction: PostgreSQL (fencing's tables in ``schema``, as the store URL's
``?schema=``), MySQL / MariaDB (in the connection's database) and SQLite; the dialect is
the connection's. It creates the tables, or upgrades them to this fencing's schema
version, or does nothing if they are there at this version: a later migration calling it
again after an upgrade of fencing brings the tables to the new version. Then open the
store with ``fencing.open(url, migrate=False)``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from .._errors import ConfigurationError, InvalidIdentifier, MissingDependency
from .._flow import drive
from .._validate import check_column
from ._steps import Query, runner

try:
    from sqlalchemy import text
    from sqlalchemy.engine import Connection, CursorResult
except ModuleNotFoundError as exc:  # pragma: no cover - exercised without the extra
    raise MissingDependency(
        f"fencing.contrib.alembic needs {exc.name}: pip install 'fencing[alembic]'"
    ) from exc

__all__ = [
    "PREFIX",
    "downgrade_fencing",
    "exclude_fencing",
    "include_name",
    "include_object",
    "is_fencing_table",
    "upgrade_fencing",
]

#: fencing's tables are named ``fencing_<name>``, their indexes and constraints too
PREFIX = "fencing_"


class Migration(Protocol):
    """What the operations take: Alembic's ``op`` (or an ``Operations``)."""

    def get_bind(self) -> Connection: ...


IncludeObject = Callable[[Any, str | None, str, bool, Any], bool]
IncludeName = Callable[[str | None, str, Mapping[str, str | None]], bool]


# -- the operations ------------------------------------------------------------------------
def upgrade_fencing(op: Migration | Connection, *, schema: str | None = None) -> None:
    """Create fencing's tables, or upgrade them to this fencing's schema version, on the
    migration's connection, in its transaction (``SchemaError`` if they are newer).
    ``schema`` (PostgreSQL only): the schema for fencing's tables, created if missing,
    as the store URL's ``?schema=``."""
    bind = _bind(op)
    dialect = _dialect(bind, schema)
    if dialect == "postgresql":
        from ..backends.postgres import schema as pg_schema

        drive(pg_schema.migrate(schema), runner(dialect, _query(bind, _PG_MARKER), schema=schema))
    elif dialect == "mysql":
        from ..backends.mysql import schema as mysql_schema

        drive(mysql_schema.migrate(), runner(dialect, _query(bind, _MYSQL_MARKER)))
    else:
        from ..backends.sqlite.flows import SQLiteFlows

        steps = _SQLiteSteps(bind)
        drive(
            SQLiteFlows().migrate(),
            runner(dialect, sqlite=lambda: steps),
        )


def downgrade_fencing(op: Migration | Connection, *, schema: str | None = None) -> None:
    """Drop fencing's tables (and their data) on the migration's connection; the
    PostgreSQL ``schema`` itself stays (it may hold more than fencing's tables)."""
    bind = _bind(op)
    dialect = _dialect(bind, schema)
    if dialect == "postgresql":
        from ..backends.postgres.schema import drop_ddl as pg_drop

        drops = pg_drop(schema)
    elif dialect == "mysql":
        from ..backends.mysql.schema import drop_ddl as mysql_drop

        drops = mysql_drop()
    else:
        from ..backends.sqlite.schema import drop_ddl as sqlite_drop

        drops = sqlite_drop()
    for statement in drops:
        bind.execute(text(statement))


def _bind(op: Migration | Connection) -> Connection:
    if isinstance(op, Connection):
        return op
    context = getattr(op, "get_context", None)
    if context is not None and getattr(context(), "as_sql", False):
        raise ConfigurationError(
            "fencing.contrib.alembic: offline (--sql) migrations are not supported: fencing's"
            " upgrade reads the schema version it finds; run the migration online, or"
            " `fencing migrate URL` beside it"
        )
    return op.get_bind()


def _dialect(bind: Connection, schema: str | None) -> str:
    name = bind.dialect.name
    name = "mysql" if name == "mariadb" else name
    if name not in ("postgresql", "mysql", "sqlite"):
        raise ConfigurationError(
            f"fencing.contrib.alembic: no fencing backend for the {name!r} dialect"
            " (PostgreSQL, MySQL / MariaDB and SQLite have one)"
        )
    if schema is not None and name != "postgresql":
        raise ConfigurationError(
            f"fencing.contrib.alembic: schema= is PostgreSQL's; on {name} fencing's tables"
            " go where the connection points"
        )
    if schema is not None:
        try:
            check_column(schema, "schema")  # the rule of the store URL's ?schema=
        except InvalidIdentifier as exc:
            raise ConfigurationError(f"fencing.contrib.alembic: schema: {exc}") from exc
    return name


# -- the step runners: a backend's flow on the migration's connection ----------------------
_COLON: re.Pattern[str] = re.compile(r"(?<![:\w\\]):(?=\w)")  # would read as a bind: escape


def _execute(bind: Connection, sql: str, marker: re.Pattern[str], params: Any) -> Any:
    """One statement on ``bind`` (through SQLAlchemy, so whatever its DBAPI driver), its
    driver-style placeholders (``marker``) turned into SQLAlchemy binds: named ones keep
    their name, positional ones (``params`` a sequence) become ``p0``, ``p1``, ..."""
    sql = _COLON.sub(r"\\:", sql)
    if isinstance(params, Mapping):
        named = dict(params)
        sql = marker.sub(lambda m: ":" + m.group(1), sql)
    else:
        names = iter(range(len(params)))
        named = {f"p{i}": value for i, value in enumerate(params)}
        sql = marker.sub(lambda m: f":p{next(names)}", sql)
    return bind.execute(text(sql), named)


def _rows(result: CursorResult[Any]) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
    if not result.returns_rows:
        return (), []
    return tuple(result.keys()), [tuple(row) for row in result.fetchall()]


def _query(bind: Connection, marker: re.Pattern[str]) -> Query:
    """Runs one statement on ``bind`` (``marker``: its driver-style placeholders)."""

    def query(sql: str, params: Any) -> tuple[tuple[str, ...], list[tuple[Any, ...]], int]:
        result = _execute(bind, sql, marker, params)
        return (*_rows(result), result.rowcount)

    return query


_PG_MARKER = re.compile(r"%\((\w+)\)s")
_MYSQL_MARKER = re.compile(r"%s")


class _SQLiteSteps:
    """What a SQLite ``Txn`` body runs on: the migration's connection."""

    _MARKER = re.compile(r"\?")

    def __init__(self, bind: Connection) -> None:
        self.bind = bind

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """``sqlite3.Connection.execute``, as much of it as a ``Txn`` body uses."""
        return _execute(self.bind, sql, self._MARKER, params)


# -- autogenerate: fencing's tables left alone -------------------------------------------
def is_fencing_table(name: str | None) -> bool:
    """Whether a table (in any schema) is fencing's own."""
    return name is not None and name.startswith(PREFIX)


def include_object(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    """Alembic's ``include_object`` hook: False for fencing's tables and for the
    indexes, constraints and columns on them, in whatever schema."""
    if type_ == "table":
        return not is_fencing_table(name)
    table = getattr(obj, "table", None)
    return not (table is not None and is_fencing_table(getattr(table, "name", None)))


def include_name(name: str | None, type_: str, parent_names: Mapping[str, str | None]) -> bool:
    """Alembic's ``include_name`` hook: fencing's tables are not even reflected."""
    if type_ == "table":
        return not is_fencing_table(name)
    return not is_fencing_table(parent_names.get("table_name"))


def exclude_fencing(
    *, include_object: IncludeObject | None = None, include_name: IncludeName | None = None
) -> dict[str, Any]:
    """The keyword arguments of ``context.configure`` that leave fencing's tables alone,
    composed with the application's own hooks (each called only for what is not
    fencing's): ``context.configure(..., **exclude_fencing(include_object=mine))``."""
    app_object, app_name = include_object, include_name

    def object_hook(obj: Any, name: str | None, type_: str, reflected: bool, to: Any) -> bool:
        if not _include_object(obj, name, type_, reflected, to):
            return False
        return app_object is None or app_object(obj, name, type_, reflected, to)

    def name_hook(name: str | None, type_: str, parents: Mapping[str, str | None]) -> bool:
        if not _include_name(name, type_, parents):
            return False
        return app_name is None or app_name(name, type_, parents)

    return {"include_object": object_hook, "include_name": name_hook}


_include_object, _include_name = include_object, include_name
