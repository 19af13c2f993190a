"""The demo's options (``DemoConfig``) and their checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from .._errors import ConfigurationError, InvalidInput
from .._html import check_report_path


@dataclass(frozen=True)
class DemoConfig:
    seed: int = 7
    tasks: int = 400
    workers: int = 8
    keys: int = 4
    store: str | None = None
    processes: bool = False
    history_dir: str | None = None
    queue: str | None = None  # celery, rq, dramatiq or arq: real worker processes of that queue
    broker: str | None = None  # the queue's broker URL (default: a local Redis database)
    outbox: bool = False  # with queue: naive send after commit vs the outbox and a relay
    report: str | None = None  # write the race as an HTML page here (report.py)
    chain: bool = False  # with outbox: ship -> notify, naive vs in the worker's transaction


QUEUES: Final = ("celery", "rq", "dramatiq", "arq")
QUEUE_DEFAULTS: Final = {"tasks": 120, "workers": 4}


def validate(config: DemoConfig) -> None:
    for name, low, high in (("tasks", 10, 100_000), ("workers", 1, 64), ("keys", 1, 1000)):
        value = getattr(config, name)
        if not low <= value <= high:
            raise InvalidInput(f"--{name} must be from {low} to {high}, not {value}")
    if config.queue is not None and config.queue not in QUEUES:
        raise InvalidInput(f"--queue must be one of {', '.join(QUEUES)}, not {config.queue!r}")
    if config.broker is not None and config.queue is None:
        raise InvalidInput("--broker needs --queue")
    if config.queue is not None and config.processes:
        raise InvalidInput("--queue runs worker processes of its own: drop --processes")
    if config.outbox and config.queue is None:
        raise InvalidInput("--outbox needs --queue (celery, rq, dramatiq or arq)")
    if config.chain and not config.outbox:
        raise InvalidInput("--chain needs --queue and --outbox (--queue celery --outbox --chain)")
    if config.outbox and config.store is not None:
        raise InvalidInput(
            "--outbox runs on the demo's own SQLite file (its relay would publish any row"
            " of another store's outbox): drop --store"
        )
    if config.report is not None:
        if config.outbox:
            raise InvalidInput(
                "--report draws the race of naive and fencing writes; the --outbox race"
                " (lost and doubled sends) has no report yet: drop one of them"
            )
        check_report_path(config.report, "--report")
    shared = "--queue" if config.queue is not None else "--processes" if config.processes else ""
    if shared and config.store is not None:
        lowered = config.store.lower()
        if lowered.startswith("memory:") or ":memory:" in lowered:
            raise ConfigurationError(
                f"{shared} needs a store shared between processes: a file"
                " (sqlite:///demo.db) or a server, not an in-memory store"
            )
