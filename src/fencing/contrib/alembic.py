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

A table's guard trigger (``docs/guard.md``) in the migration that creates the table::

    def upgrade():
        op.create_table("orders", ...)
        guard_table(op, "orders")       # version="version", key="id"

    def downgrade():
        unguard_table(op, "orders")
        op.drop_table("orders")

Offline (``alembic upgrade --sql``) each operation writes out its static DDL: the guard's
as it is, fencing's tables' for the schema version the database is known to be at
(``upgrade_fencing(op, offline_from=0)``: none yet).

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

from .._checks import guard_target
from .._errors import ConfigurationError, InvalidIdentifier, MissingDependency
from .._flow import drive
from .._request import Target
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
    "guard_table",
    "include_name",
    "include_object",
    "is_fencing_table",
    "unguard_table",
    "upgrade_fencing",
]

#: fencing's tables are named ``fencing_<name>``, their indexes and constraints too
PREFIX = "fencing_"


class Migration(Protocol):
    """What the operations take: Alembic's ``op`` (or an ``Operations``)."""

    def get_bind(self) -> Connection: ...

    def get_context(self) -> Any: ...


IncludeObject = Callable[[Any, str | None, str, bool, Any], bool]
IncludeName = Callable[[str | None, str, Mapping[str, str | None]], bool]


# -- the operations ------------------------------------------------------------------------
def upgrade_fencing(
    op: Migration | Connection, *, schema: str | None = None, offline_from: int | None = None
) -> None:
    """Create fencing's tables, or upgrade them to this fencing's schema version, on the
    migration's connection, in its transaction (``SchemaError`` if they are newer).
    ``schema`` (PostgreSQL only): the schema for fencing's tables, created if missing,
    as the store URL's ``?schema=``.

    Offline (``alembic upgrade --sql``), nothing can be read: ``offline_from`` says the
    fencing schema version the database is at when the migration runs (0: no fencing
    tables), and the DDL from there is written out; without it, refused. Online it is
    not used: the version is read."""
    offline = _offline(op)
    if offline is not None:
        _write(offline, _upgrade_ddl(offline, schema, offline_from))
        return
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
    PostgreSQL ``schema`` itself stays (it may hold more than fencing's tables).
    Offline, the same statements are written out."""
    offline = _offline(op)
    dialect = _dialect(offline.dialect if offline is not None else _bind(op), schema)
    if dialect == "postgresql":
        from ..backends.postgres.schema import TABLES
    elif dialect == "mysql":
        from ..backends.mysql.schema import TABLES
    else:
        from ..backends.sqlite.schema import TABLES
    quote = (offline.dialect if offline is not None else _bind(op).dialect).identifier_preparer
    where = f"{quote.quote_schema(schema)}." if schema is not None else ""
    drops = [f"DROP TABLE IF EXISTS {where}{quote.quote(name)}" for name in reversed(TABLES)]
    if dialect == "postgresql":  # the outbox's claim tokens (schema 4)
        drops.append(f"DROP SEQUENCE IF EXISTS {where}fencing_outbox_claim")
    if offline is not None:
        _write(offline, drops)
        return
    for drop in drops:
        _bind(op).execute(text(drop))


def guard_table(
    op: Migration | Connection,
    name: str,
    *,
    version: str = "version",
    key: str = "id",
    mode: str = "bump",
) -> None:
    """Install the guard trigger ``fencing_guard_<name>`` on a table (``docs/guard.md``;
    as ``store.guard_table``, the same DDL) on the migration's own connection, so a table
    the same migration just created is there to guard. ``name`` may be
    ``schema.table``; ``mode="strict"`` refuses an UPDATE that leaves the version
    unchanged instead of bumping it (a later migration calling this with the other mode
    replaces the trigger). Idempotent; offline, its DDL is written out."""
    _guard(op, guard_target(name, key, version, mode), install=True)


def unguard_table(op: Migration | Connection, name: str) -> None:
    """Remove the guard trigger from a table (fine if there is none), on the migration's
    own connection; offline, its DDL is written out."""
    _guard(op, guard_target(name, "id", "version"), install=False)


def _guard(op: Migration | Connection, target: Target, *, install: bool) -> None:
    offline = _offline(op)
    if offline is not None:
        _write(offline, _guard_ddl(_dialect(offline.dialect, None), target, install))
        return
    bind = _bind(op)
    dialect = _dialect(bind, None)
    if dialect == "postgresql":
        from ..backends.postgres import guard as pg_guard

        flow = pg_guard.install(target) if install else pg_guard.remove(target)
        drive(flow, runner(dialect, _query(bind, _PG_MARKER)))
    elif dialect == "mysql":
        from ..backends.mysql.flows import MySQLFlows

        flows = MySQLFlows()
        drive(
            flows.guard_table(target) if install else flows.unguard_table(target),
            runner(dialect, _query(bind, _MYSQL_MARKER)),
        )
    else:
        from ..backends.sqlite.flows import SQLiteFlows

        sqlite, steps = SQLiteFlows(), _SQLiteSteps(bind)
        drive(
            sqlite.guard_table(target) if install else sqlite.unguard_table(target),
            runner(dialect, sqlite=lambda: steps),
        )


# -- offline (``alembic upgrade --sql``): static DDL written out ---------------------------
def _offline(op: Migration | Connection) -> Any:
    """The migration context of an offline migration, else None."""
    if isinstance(op, Connection):
        return None
    get_context = getattr(op, "get_context", None)
    context = get_context() if get_context is not None else None
    return context if getattr(context, "as_sql", False) else None


def _write(context: Any, statements: Sequence[str]) -> None:
    """Write ``statements`` into the migration's SQL script, each ended as Alembic ends
    its own; on MySQL one with a ``;`` inside (a trigger's ``BEGIN ... END`` body) between
    ``DELIMITER`` lines, as the ``mysql`` client reads it."""
    end = context.impl.command_terminator
    mysql = _dialect(context.dialect, None) == "mysql"
    for statement in statements:
        if mysql and ";" in statement:
            context.impl.static_output(f"DELIMITER //\n{statement}//\nDELIMITER {end}")
        else:
            context.impl.static_output(statement + end)


def _upgrade_ddl(context: Any, schema: str | None, offline_from: int | None) -> list[str]:
    dialect = _dialect(context.dialect, schema)
    if offline_from is None or isinstance(offline_from, bool) or not isinstance(offline_from, int):
        raise ConfigurationError(
            "fencing.contrib.alembic: an offline (--sql) upgrade_fencing cannot read the"
            " schema version it upgrades from: say it, upgrade_fencing(op, offline_from=N)"
            " (0: no fencing tables yet), or run the migration online"
        )
    stored = offline_from or None
    if dialect == "postgresql":
        from ..backends.postgres import schema as pg_schema
        from ..backends.postgres.statements import qualified

        _check_from(offline_from, pg_schema.SCHEMA_VERSION)
        return [qualified(t, schema) for t in pg_schema.upgrade_ddl(stored, schema)]
    if dialect == "mysql":
        from ..backends.mysql import schema as mysql_schema

        _check_from(offline_from, mysql_schema.SCHEMA_VERSION)
        return list(mysql_schema.upgrade_ddl(stored))
    from ..backends.sqlite import schema as sqlite_schema

    _check_from(offline_from, sqlite_schema.SCHEMA_VERSION)
    return list(sqlite_schema.upgrade_ddl(stored))


def _check_from(offline_from: int, current: int) -> None:
    if not 0 <= offline_from <= current:
        raise ConfigurationError(
            f"fencing.contrib.alembic: offline_from={offline_from}: this fencing knows its"
            f" schema versions 1 to {current} (0: no fencing tables)"
        )


def _guard_ddl(dialect: str, target: Target, install: bool) -> tuple[str, ...]:
    """A guard's static DDL: what ``store.guard_table`` would run where nothing is read
    (PostgreSQL: the function in the table's schema as named, or where the search path
    makes it; the trigger dropped and created again, as on any version)."""
    if dialect == "postgresql":
        from ..backends.postgres import guard as pg_guard

        schema = target.name.rpartition(".")[0] or None
        if install:
            return pg_guard.install_ddl(target, schema, replace=False)
        return pg_guard.remove_ddl(target, schema)
    if dialect == "mysql":
        from ..backends.mysql import guard as mysql_guard

        return mysql_guard.install_ddl(target) if install else (mysql_guard.remove_ddl(target),)
    from ..backends.sqlite import guard as sqlite_guard

    return sqlite_guard.install_ddl(target) if install else sqlite_guard.remove_ddl(target)


def _bind(op: Migration | Connection) -> Connection:
    return op if isinstance(op, Connection) else op.get_bind()


def _dialect(bind: Any, schema: str | None) -> str:
    """The fencing backend of a connection's dialect (or of a dialect itself)."""
    name = getattr(bind, "dialect", bind).name
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
