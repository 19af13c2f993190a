"""Django migration operations: fencing's tables and a table's guard trigger, made by
``manage.py migrate``.

::

    from django.db import migrations
    from fencing.contrib.django.operations import GuardTable

    class Migration(migrations.Migration):
        dependencies = [("shop", "0001_initial")]
        operations = [GuardTable("Order")]          # or "shop.Order"

The app ships its own migration (``fencing/0001_initial``: :class:`CreateFencingTables`),
so ``manage.py migrate`` creates fencing's tables. Each operation runs the backend's own
flow (the statements ``fencing migrate URL --guard-table`` runs) on
``schema_editor.connection``, in the migration's transaction (PostgreSQL, SQLite; MySQL
commits DDL on its own), honours ``--database`` and the routers' ``allow_migrate``, and
is reversible. ``sqlmigrate`` shows the statements the operation runs on a database
where it has nothing to upgrade (fencing's tables from empty, the guard from none).
"""

from __future__ import annotations

from typing import Any

from django.db import router
from django.db.migrations.operations.base import Operation

from ..._checks import guard_target
from ..._errors import ConfigurationError
from ..._flow import Flow, drive
from ..._request import Target
from ..._validate import mapped_table
from .._steps import Query, runner
from .stores import _settings

__all__ = ["CreateFencingTables", "GuardTable", "UnguardTable", "UpgradeFencingTables"]

_VENDORS = ("postgresql", "mysql", "sqlite")


def _vendor(connection: Any) -> str:
    vendor = str(connection.vendor)
    if vendor not in _VENDORS:
        raise ConfigurationError(
            f"fencing has no backend for Django's {vendor} database {connection.alias!r}"
            " (PostgreSQL, MySQL/MariaDB and SQLite are supported)"
        )
    return vendor


def fencing_schema(alias: str) -> str | None:
    """PostgreSQL: the schema of fencing's tables on ``alias``
    (``FENCING["OPTIONS"][alias]["schema"]``, as ``store(alias)`` opens them)."""
    options = (_settings().get("OPTIONS") or {}).get(alias) or {}
    schema = options.get("schema")
    return None if schema is None else str(schema)


def _query(connection: Any) -> Query:
    """Runs one statement on Django's ``connection`` (its cursor: the driver's
    placeholders, whatever the driver)."""

    def query(sql: str, params: Any) -> tuple[tuple[str, ...], list[tuple[Any, ...]], int]:
        with connection.cursor() as cursor:
            cursor.execute(sql, params or None)
            if not cursor.description:
                return (), [], cursor.rowcount
            names = tuple(str(column[0]) for column in cursor.description)
            return names, [tuple(row) for row in cursor.fetchall()], cursor.rowcount

    return query


def _sqlite(connection: Any) -> Any:
    """The ``sqlite3`` connection under Django's (a SQLite body runs on it)."""
    connection.ensure_connection()
    return connection.connection


def _flows(vendor: str, schema: str | None) -> Any:
    if vendor == "postgresql":
        from ...backends.postgres.flows import PostgresFlows

        return PostgresFlows(schema)
    if vendor == "mysql":
        from ...backends.mysql.flows import MySQLFlows

        return MySQLFlows()
    from ...backends.sqlite.flows import SQLiteFlows

    return SQLiteFlows()


def _run(schema_editor: Any, flow: Flow[None], planned: tuple[str, ...]) -> None:
    """``flow`` on the migration's connection; with ``sqlmigrate`` (``collect_sql``),
    the ``planned`` statements written out instead."""
    if schema_editor.collect_sql:
        for statement in planned:
            schema_editor.execute(statement, None)
        return
    connection = schema_editor.connection
    run = runner(
        connection.vendor,
        _query(connection),
        schema=fencing_schema(connection.alias),
        sqlite=lambda: _sqlite(connection),
    )
    drive(flow, run)


# -- fencing's tables ------------------------------------------------------------------
def _tables_ddl(vendor: str, schema: str | None, drop: bool) -> tuple[str, ...]:
    if vendor == "postgresql":
        from ...backends.postgres import schema as pg

        return pg.drop_ddl(schema) if drop else pg.install_ddl(schema)
    if vendor == "mysql":
        from ...backends.mysql import schema as my

        return my.drop_ddl() if drop else my.install_ddl()
    from ...backends.sqlite import schema as lite

    return lite.drop_ddl() if drop else lite.install_ddl()


class _Operation(Operation):  # type: ignore[misc]
    reduces_to_sql = True
    reversible = True

    def state_forwards(self, app_label: str, state: Any) -> None:
        pass  # no model changes: the migration state knows nothing of these


class CreateFencingTables(_Operation):
    """Create fencing's tables, or upgrade them to this fencing's schema version (the
    ``migrate`` flow the store runs); backwards: drop them, their data with them.
    ``hints`` go to the routers' ``allow_migrate`` (as ``RunSQL``'s do).
    PostgreSQL: in ``FENCING["OPTIONS"][alias]["schema"]`` when set (created if
    missing; never dropped)."""

    def __init__(self, hints: dict[str, Any] | None = None) -> None:
        self.hints = dict(hints or {})

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        return type(self).__qualname__, [], {"hints": self.hints} if self.hints else {}

    def describe(self) -> str:
        return "Create fencing's tables (or upgrade them to this fencing's schema)"

    @property
    def migration_name_fragment(self) -> str:
        return "fencing_tables"

    def _allowed(self, app_label: str, schema_editor: Any) -> bool:
        alias = schema_editor.connection.alias
        return bool(router.allow_migrate(alias, app_label, **self.hints))

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if not self._allowed(app_label, schema_editor):
            return
        connection = schema_editor.connection
        vendor, schema = _vendor(connection), fencing_schema(connection.alias)
        _run(schema_editor, _flows(vendor, schema).migrate(), _tables_ddl(vendor, schema, False))

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        if not self._allowed(app_label, schema_editor):
            return
        connection = schema_editor.connection
        vendor, schema = _vendor(connection), fencing_schema(connection.alias)
        for statement in _tables_ddl(vendor, schema, True):
            schema_editor.execute(statement, None)


class UpgradeFencingTables(CreateFencingTables):
    """Upgrade fencing's tables to this fencing's schema version (creating them if
    missing); backwards: nothing (an upgrade of fencing's schema is kept)."""

    def describe(self) -> str:
        return "Upgrade fencing's tables to this fencing's schema"

    @property
    def migration_name_fragment(self) -> str:
        return "fencing_upgrade"

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        pass


# -- a table's guard trigger -------------------------------------------------------------
class _GuardOperation(_Operation):
    def __init__(
        self,
        model: str,
        version: str | None = None,
        hints: dict[str, Any] | None = None,
        mode: str = "bump",
    ) -> None:
        self.model = model
        self.version = version
        self.hints = dict(hints or {})
        guard_target("checked", "id", "version", mode)  # a bad mode: refused when written
        self.mode = mode

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        kwargs: dict[str, Any] = {}
        if self.version is not None:
            kwargs["version"] = self.version
        if self.mode != "bump":
            kwargs["mode"] = self.mode
        if self.hints:
            kwargs["hints"] = self.hints
        return type(self).__qualname__, [self.model], kwargs

    @property
    def migration_name_fragment(self) -> str:
        name = self.model.rpartition(".")[2].lower()
        return f"{'guard' if isinstance(self, GuardTable) else 'unguard'}_{name}"

    def references_model(self, name: str, app_label: str) -> bool:
        label, _, model = self.model.rpartition(".")
        return model.lower() == name.lower() and (not label or label == app_label)

    def _model(self, app_label: str, state: Any) -> Any:
        label, _, name = self.model.rpartition(".")
        return state.apps.get_model(label or app_label, name)

    def target(self, model: Any) -> Target:
        """The guarded table of ``model`` (as the migration state has it): its
        ``db_table``, its primary key's column, the column of its ``VersionField``
        (or of the field ``version`` names)."""
        table, key, column = mapped_table(model, None)
        if self.version is not None:
            column = model._meta.get_field(self.version).column
        if column is None:
            raise ConfigurationError(
                f"{model._meta.label} has no VersionField: GuardTable({self.model!r},"
                " version=...) names the field the guard moves on"
            )
        return guard_target(table, key, column, self.mode)

    def _install(self, app_label: str, schema_editor: Any, state: Any) -> None:
        self._change(app_label, schema_editor, state, remove=False)

    def _remove(self, app_label: str, schema_editor: Any, state: Any) -> None:
        self._change(app_label, schema_editor, state, remove=True)

    def _change(self, app_label: str, schema_editor: Any, state: Any, *, remove: bool) -> None:
        """Install (or remove) the guard on the migration's connection; with
        ``sqlmigrate`` (collect_sql) its DDL is written out as planned."""
        model = self._model(app_label, state)
        connection = schema_editor.connection
        if not self.allow_migrate_model(connection.alias, model):
            return
        vendor = _vendor(connection)
        target = self.target(model)
        planned: tuple[str, ...] = ()
        if schema_editor.collect_sql:
            planned = _guard_ddl(connection, vendor, target, remove=remove)
        flows = _flows(vendor, fencing_schema(connection.alias))
        steps = flows.unguard_table(target) if remove else flows.guard_table(target)
        _run(schema_editor, steps, planned)


class GuardTable(_GuardOperation):
    """Install fencing's guard trigger on ``model``'s table (``"Order"`` in the
    migration's app, or ``"shop.Order"``): an UPDATE that leaves the version unchanged
    bumps it, one that sets it lower is refused (docs/guard.md); ``mode="strict"``
    refuses the unchanged one too (staging: blind writers fail loudly). The version
    column is the model's ``VersionField`` (or ``version=`` a field's name). A later
    ``GuardTable`` of the same model with another mode replaces the trigger.
    Backwards: removed."""

    def describe(self) -> str:
        strict = " (strict)" if self.mode == "strict" else ""
        return f"Install fencing's guard trigger{strict} on {self.model}"

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        self._install(app_label, schema_editor, to_state)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        self._remove(app_label, schema_editor, from_state)


class UnguardTable(_GuardOperation):
    """Remove fencing's guard trigger from ``model``'s table (fine if there is none).
    Backwards: installed again (``version=`` as for :class:`GuardTable`)."""

    def describe(self) -> str:
        return f"Remove fencing's guard trigger from {self.model}"

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        self._remove(app_label, schema_editor, from_state)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        self._install(app_label, schema_editor, to_state)


def _guard_ddl(connection: Any, vendor: str, target: Target, remove: bool) -> tuple[str, ...]:
    """What installing (removing) the guard runs where there is none (one): for
    ``sqlmigrate``, which runs nothing (PostgreSQL: the schema the table is made in and
    the server's version are read)."""
    if vendor == "postgresql":
        from ...backends.postgres import guard as pg

        schema, dot, _ = target.name.rpartition(".")
        if not dot:
            with connection.cursor() as cursor:
                cursor.execute("SELECT current_schema()")
                schema = str(cursor.fetchone()[0])
        if remove:
            return pg.remove_ddl(target, schema)
        return pg.install_ddl(target, schema, int(connection.pg_version) >= pg._REPLACE_TRIGGER)
    if vendor == "mysql":
        from ...backends.mysql import guard as my

        return (my.remove_ddl(target),) if remove else my.install_ddl(target)
    from ...backends.sqlite import guard as lite

    return lite.remove_ddl(target) if remove else lite.install_ddl(target)
