"""``manage.py fencing_relay --queue celery --app proj.celery:app [--database ALIAS]``:
``fencing relay`` on the alias's outbox (docs/outbox.md)."""

from __future__ import annotations

import argparse
from typing import Any

from fencing.contrib import _cli_relay

from ._base import FencingCommand


def _run(args: argparse.Namespace, store: Any) -> int:
    if args.queue == "arq":  # an async relay opens its own (async) store on the alias's URL
        from ...stores import database_url

        args.url = database_url(args.database)
        return _cli_relay.run(args)
    return _cli_relay.run(args, store)


class Command(FencingCommand):
    help = "publish committed outbox rows through a queue's own client (docs/outbox.md)"
    add = staticmethod(_cli_relay.add_arguments)
    run = staticmethod(_run)
    failed = "fencing: some rows could not be published"
