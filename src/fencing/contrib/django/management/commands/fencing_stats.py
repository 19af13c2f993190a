"""``manage.py fencing_stats [--database ALIAS]``: ``fencing stats`` on the alias's store."""

from fencing import _cli_stats

from ._base import FencingCommand


class Command(FencingCommand):
    help = (
        "per collection and table: records, applied intents, effects by state, leases held;"
        " the outbox's backlog"
    )
    add = staticmethod(_cli_stats.add_arguments)
    run = staticmethod(_cli_stats.run)
