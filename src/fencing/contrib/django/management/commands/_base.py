"""What the ``fencing_*`` management commands share: the ``fencing`` command line's
own code, run on the store of a database alias (``--database``), never a URL (no
password on a command line)."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DEFAULT_DB_ALIAS, connections

from fencing import FencingError


class FencingCommand(BaseCommand):  # type: ignore[misc]
    """A ``fencing`` subcommand as a management command; ``run(args, store)`` is the
    command line's own, ``add(parser, url=False)`` its arguments but the URL."""

    add: Callable[..., None]
    run: Callable[..., int]
    #: what an exit status other than 0 means (a monitor's ``--fail-if-...``)
    failed = "fencing: the check failed"

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--database",
            default=DEFAULT_DB_ALIAS,
            help="the database alias whose fencing store to use (default: %(default)s)",
        )
        type(self).add(parser, url=False)

    def store(self, alias: str) -> Any:
        """The store the command runs on: ``store(alias)``'s."""
        from ... import store

        return store(alias)

    def handle(self, *args: Any, **options: Any) -> None:
        alias = options["database"]
        if alias not in connections.settings:
            raise CommandError(f"no database {alias!r} in settings.DATABASES")
        namespace = argparse.Namespace(**options)
        run = type(self).run
        try:
            with contextlib.redirect_stdout(self.stdout._out):
                code = run(namespace, self.store(alias))
        except FencingError as exc:
            raise CommandError(f"fencing: {type(exc).__name__}: {exc}", returncode=2) from exc
        if code:
            raise CommandError(self.failed, returncode=code)
