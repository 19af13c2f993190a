"""``manage.py fencing_migrate [--database ALIAS] [--guard-model shop.Order]``:
``fencing migrate`` on the alias's database (fencing's tables created or upgraded,
guard triggers installed or removed), for a project that does not use the app's
migrations. The routers' ``allow_migrate`` for the app ``fencing`` is honoured."""

from __future__ import annotations

import argparse
from typing import Any

from django.apps import apps
from django.core.management.base import CommandError
from django.db import router

import fencing
from fencing import _cli
from fencing._validate import mapped_table

from ._base import FencingCommand


def _add(parser: Any, *, url: bool) -> None:
    _cli.migrate_arguments(parser, url=url)
    parser.add_argument(
        "--guard-model",
        action="append",
        metavar="APP.MODEL",
        help="install the guard trigger on a model's table (repeatable): its primary key,"
        " its VersionField's column",
    )
    parser.add_argument("--unguard-model", action="append", metavar="APP.MODEL", help="remove it")


def _run(args: argparse.Namespace, store: Any) -> int:
    with store:
        code = _cli._cmd_migrate(args, store)
        for label in args.guard_model or ():
            table, key, version = mapped_table(_model(label), None)
            column = version or args.version_column
            store.guard_table(table, version=column, key=key, mode=args.guard_mode)
            strict = ", strict" if args.guard_mode == "strict" else ""
            print(f"guarded model {label} (table {table}{strict})")
        for label in args.unguard_model or ():
            table = mapped_table(_model(label), None)[0]
            store.unguard_table(table)
            print(f"unguarded model {label} (table {table})")
    return code


def _model(label: str) -> Any:
    try:
        return apps.get_model(label)
    except (LookupError, ValueError) as exc:
        raise CommandError(f"--guard-model: {exc}") from exc


class Command(FencingCommand):
    help = (
        "create or upgrade fencing's tables on a database alias; install or remove guard triggers"
    )
    add = staticmethod(_add)
    run = staticmethod(_run)

    def store(self, alias: str) -> Any:
        """A store of its own, opened with ``migrate=False`` (``store(alias)`` may be
        set to check the tables, which this command makes)."""
        from ...stores import _settings, database_url

        if not router.allow_migrate(alias, "fencing"):
            raise CommandError(
                f"the routers' allow_migrate keeps fencing's tables off database {alias!r}"
            )
        options = dict((_settings().get("OPTIONS") or {}).get(alias) or {})
        return fencing.open(database_url(alias), migrate=False, **options)
