"""The Django app: ``INSTALLED_APPS = [..., "fencing.contrib.django"]``."""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from typing import Any

from django.apps import AppConfig, apps
from django.db import connections
from django.db.backends.signals import connection_created

from ..._errors import StoreNotMigrated
from ..._observe import Event, add_observer, log
from .signals import fenced_commit
from .stores import alias_of, close_stores, store

__all__ = ["FencingConfig"]

_COMMITS = frozenset({"commit", "commit_many", "apply"})
_patched = threading.Lock()


class FencingConfig(AppConfig):  # type: ignore[misc]
    name = "fencing.contrib.django"
    label = "fencing"
    verbose_name = "fencing"
    # the admin's entries (entries.py: models without a table) need no other (models.W042)
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers fencing's system checks)

        add_observer(_SIGNAL)
        _close_before_test_db_destroyed()
        connection_created.connect(_open_early, dispatch_uid="fencing.contrib.django")


def _open_early(sender: Any, connection: Any, **kwargs: Any) -> None:
    """On SQLite, open the alias's store when Django first connects, before any
    transaction of Django's: opened later, inside an ``atomic()`` block that wrote,
    fencing's own connection would wait on that block's write lock (and fail with
    "database is locked" after its busy timeout). Errors are logged, not raised: the
    store's first use raises them."""
    if connection.vendor != "sqlite" or connection.alias not in connections.settings:
        return
    if connection.is_in_memory_db():
        return  # (fencing cannot reach it: store() says so when it is asked for)
    try:
        store(connection.alias)
    except StoreNotMigrated:  # FENCING["MIGRATE"] = "check" before manage.py migrate
        log.debug("fencing's tables are not on %r yet", connection.alias)
    except Exception:
        log.warning("fencing could not open the store of %r", connection.alias, exc_info=True)


class _Signaller:
    """Sends ``fenced_commit`` for the committed outcomes on a model's table made by the
    stores of ``store(alias)``."""

    def observe(self, event: Event) -> None:
        if event.kind != "table" or event.op not in _COMMITS or not event.committed:
            return
        alias = alias_of(event.origin)
        if alias is None:
            return
        model = _models().get(event.name)
        if model is None:
            return
        fenced_commit.send(
            sender=model,
            pk=event.key,
            version=event.current_version,
            intent_id=event.intent_id,
            using=alias,
        )


_SIGNAL = _Signaller()


_known: tuple[int, dict[str, Any]] = (-1, {})


def _models() -> dict[str, Any]:
    """Each table's concrete model, by ``db_table`` (the models of every app label, as
    Django registered them: a script's model whose label is no installed app too);
    built again only when a model was registered since."""
    global _known
    registered = list(apps.all_models.values())
    count = sum(len(models) for models in registered)
    if count == _known[0]:
        return _known[1]
    found: dict[str, Any] = {}
    for models in registered:
        for model in list(models.values()):
            meta = model._meta
            if not meta.proxy and not meta.abstract:
                found.setdefault(meta.db_table, model)
    _known = (count, found)
    return found


def _close_before_test_db_destroyed() -> None:
    """Close fencing's stores on a database before Django's test runner drops it (a
    server refuses to drop a database others are connected to; SQLite's WAL files
    would stay behind) or clones it for ``--parallel`` (a server's template copy wants
    no other session on it; SQLite's clone is a copy of the database file, which holds
    what fencing's WAL connections committed only once the log is checkpointed into it:
    without that, the clones missed the tables migrate had just made)."""
    from django.db.backends.base.creation import BaseDatabaseCreation

    with _patched:
        original = BaseDatabaseCreation.destroy_test_db
        if getattr(original, "_fencing_closes_stores", False):
            return
        cloning = BaseDatabaseCreation.clone_test_db

        @functools.wraps(original)
        def destroy_test_db(
            self: Any,
            old_database_name: Any = None,
            verbosity: int = 1,
            keepdb: bool = False,
            suffix: Any = None,
        ) -> Any:
            close_stores(self.connection.alias)
            name = None
            if self.connection.vendor == "sqlite" and not keepdb:
                conf = self.get_test_db_clone_settings(suffix) if suffix else None
                name = (conf or self.connection.settings_dict)["NAME"]
            done = original(self, old_database_name, verbosity, keepdb, suffix)
            if name and not self.is_in_memory_db(name):
                # a --parallel worker's stores on its clone end with the worker, which
                # leaves their WAL files: Django removes the database file only
                for tail in ("-wal", "-shm"):
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(f"{name}{tail}")
            return done

        @functools.wraps(cloning)
        def clone_test_db(self: Any, *args: Any, **kwargs: Any) -> Any:
            close_stores(self.connection.alias)
            if self.connection.vendor == "sqlite" and not self.connection.is_in_memory_db():
                with self.connection.cursor() as cursor:
                    cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            return cloning(self, *args, **kwargs)

        destroy_test_db._fencing_closes_stores = True  # type: ignore[attr-defined]
        BaseDatabaseCreation.destroy_test_db = destroy_test_db
        BaseDatabaseCreation.clone_test_db = clone_test_db
