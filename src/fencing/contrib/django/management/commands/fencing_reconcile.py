"""``manage.py fencing_reconcile [--database ALIAS]``: ``fencing reconcile`` on the
alias's store (effects of intents that never committed; ``--mark KEY``)."""

from fencing import _reconcile

from ._base import FencingCommand


class Command(FencingCommand):
    help = (
        "list effects of stale or fenced intents not yet reconciled (--mark KEY marks one);"
        " --fail-if-any for a monitor"
    )
    add = staticmethod(_reconcile.add_arguments)
    run = staticmethod(_reconcile.run)
    failed = "fencing: effects need reconciling"
