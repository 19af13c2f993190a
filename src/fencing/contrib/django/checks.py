"""``manage.py check``: what would make fencing silently not fence.

* ``fencing.W001`` — a :class:`~fencing.contrib.django.models.FencedModel` without its
  ``VersionField`` (a field that replaced ``version`` with another type): its saves are
  not conditional, nothing is fenced.
* ``fencing.W002`` — a database fencing cannot use: no backend for its vendor, a driver
  ``store.using()`` cannot join, or an in-memory SQLite database. Checked on the
  databases fenced models are written to, ``default`` and those of
  ``FENCING["OPTIONS"]``; without a connection.
* ``fencing.W003`` — a guard trigger that the applied migrations installed
  (:class:`~fencing.contrib.django.operations.GuardTable`) missing from its table (on
  SQLite, Django rebuilds a table for many ``AlterField`` and the trigger goes with
  it). A database check: run only on the databases the check is asked about
  (``manage.py check --database default``, ``migrate``, the test runner), and only when
  the database answers.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.core import checks
from django.db import DatabaseError, connections, router

from ..._errors import FencingError

__all__ = ["check_databases", "check_guards", "check_models"]


def _models(app_configs: Any) -> list[Any]:
    configs = apps.get_app_configs() if app_configs is None else app_configs
    return [
        model
        for config in configs
        for model in config.get_models()
        if not model._meta.proxy and not model._meta.abstract
    ]


def check_models(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``fencing.W001``: a fenced model without its version field."""
    from .models import FencedModel, version_field

    found = []
    for model in _models(app_configs):
        if issubclass(model, FencedModel) and version_field(model) is None:
            field = model._meta.get_field("version") if _has(model, "version") else None
            what = (
                "no version field"
                if field is None
                else f"a version field of type {type(field).__name__}, not VersionField"
            )
            found.append(
                checks.Warning(
                    f"{model._meta.label} is a FencedModel with {what}: its saves are not"
                    " conditional, a stale save overwrites newer state",
                    hint="Keep FencedModel's version field, a"
                    " fencing.contrib.django.VersionField (do not redefine `version`).",
                    obj=model,
                    id="fencing.W001",
                )
            )
    return found


def _has(model: Any, name: str) -> bool:
    return any(field.name == name for field in model._meta.get_fields())


def _fenced_aliases() -> list[str]:
    """The aliases fencing is used on, as far as settings tell: ``default``, those
    fenced models are written to, and those of ``FENCING["OPTIONS"]``."""
    from .models import version_field
    from .stores import _settings

    aliases = ["default"] if "default" in connections.settings else []
    for model in _models(None):
        if version_field(model) is not None:
            aliases.append(router.db_for_write(model))
    aliases.extend((_settings().get("OPTIONS") or {}).keys())
    return [alias for alias in dict.fromkeys(aliases) if alias in connections.settings]


def check_databases(**kwargs: Any) -> list[checks.CheckMessage]:
    """``fencing.W002``: a database fencing cannot use (asks no server anything)."""
    from ..._borrow import borrow_sync
    from .stores import database_url

    found = []
    for alias in _fenced_aliases():
        try:
            database_url(alias)
            borrow_sync(connections[alias])  # the driver: refused here, not connected
        except FencingError as exc:
            problem = str(exc)
        except Exception as exc:  # (a backend that cannot even be loaded)
            problem = f"{type(exc).__name__}: {exc}"
        else:
            continue
        found.append(
            checks.Warning(
                f"fencing cannot use the database {alias!r}: {problem}",
                hint="fencing runs on PostgreSQL (psycopg 3), MySQL/MariaDB (PyMySQL as"
                " MySQLdb) and SQLite (a file): route fenced models elsewhere, or"
                " silence fencing.W002 if fencing never uses this database.",
                id="fencing.W002",
            )
        )
    return found


def check_guards(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """``fencing.W003``: a guard the applied migrations installed, missing."""
    found: list[checks.CheckMessage] = []
    for alias in databases or ():
        try:
            found.extend(_missing_guards(alias, app_configs))
        except DatabaseError:
            continue  # not reachable (or not migrated): nothing to say about it
    return found


def _expected(alias: str) -> list[tuple[Any, Any]]:
    """(model, operation) of each guard the applied migrations on ``alias`` installed
    and did not remove, in the order they were applied."""
    from django.db.migrations.loader import MigrationLoader

    from .operations import GuardTable, UnguardTable

    loader = MigrationLoader(connections[alias], ignore_no_migrations=True)
    applied = loader.applied_migrations or {}
    guards: dict[tuple[str, str], Any] = {}
    seen: set[tuple[str, str]] = set()
    for leaf in loader.graph.leaf_nodes():
        for node in loader.graph.forwards_plan(leaf):
            if node in seen or node not in applied:
                continue
            seen.add(node)
            for operation in loader.graph.nodes[node].operations:
                if isinstance(operation, GuardTable | UnguardTable):
                    label, _, name = operation.model.rpartition(".")
                    key = ((label or node[0]).lower(), name.lower())
                    if isinstance(operation, GuardTable):
                        guards[key] = operation
                    else:
                        guards.pop(key, None)
    found = []
    for (label, name), operation in guards.items():
        try:
            model = apps.get_model(label, name)
        except LookupError:
            continue  # the model is gone (its table too)
        found.append((model, operation))
    return found


def _missing_guards(alias: str, app_configs: Any) -> list[checks.CheckMessage]:
    connection = connections[alias]
    if connection.vendor not in ("postgresql", "mysql", "sqlite"):
        return []
    labels = None if app_configs is None else {config.label for config in app_configs}
    found = []
    for model, operation in _expected(alias):
        if labels is not None and model._meta.app_label not in labels:
            continue
        if not router.allow_migrate_model(alias, model):
            continue
        target = operation.target(model)
        if not _installed(connection, target):
            strict = target.guard_mode == "strict"
            found.append(
                checks.Warning(
                    "the guard trigger the migrations installed is"
                    f" missing from table {target.name!r} on database {alias!r}: writes"
                    " that leave its version unchanged are not fenced",
                    hint="Install it again: a migration with GuardTable("
                    f"{model._meta.label!r}{', mode=' + repr('strict') if strict else ''})"
                    " after the one that rebuilt the table, or"
                    f" `manage.py fencing_migrate --database {alias} --guard-model"
                    f" {model._meta.label}{' --guard-mode strict' if strict else ''}`.",
                    obj=model,
                    id="fencing.W003",
                )
            )
    return found


def _installed(connection: Any, target: Any) -> bool:
    """Whether the guard's trigger is on its table (its name only: a read of the
    catalog)."""
    from ..._checks import guard_name

    schema, name = guard_name(target)
    if connection.vendor == "postgresql":
        from ...backends.postgres.statements import quoted

        sql = (
            "SELECT count(*) FROM pg_catalog.pg_trigger WHERE tgrelid = to_regclass(%s)"
            " AND tgname = %s AND NOT tgisinternal"
        )
        params: tuple[Any, ...] = (quoted(target.name), name)
    elif connection.vendor == "mysql":
        sql = (
            "SELECT count(*) FROM information_schema.TRIGGERS"
            " WHERE TRIGGER_SCHEMA = COALESCE(%s, DATABASE()) AND TRIGGER_NAME = %s"
        )
        params = (schema, name)
    else:
        from ...backends.sqlite.guard import trigger_names

        where = "" if schema is None else f'"{schema}".'
        sql = (
            f"SELECT count(*) FROM {where}sqlite_master WHERE type = 'trigger' AND name IN (%s, %s)"
        )
        params = trigger_names(target)
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return int(cursor.fetchone()[0]) == len(params)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return int(cursor.fetchone()[0]) > 0


checks.register(check_models, checks.Tags.models)
checks.register(check_databases, checks.Tags.database)
checks.register(check_guards, checks.Tags.database)
