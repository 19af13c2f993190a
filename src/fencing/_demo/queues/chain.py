"""``fencing demo --queue Q --outbox --chain``: a two-step chain, ship -> notify, killed at
the worst moments, naive and in the worker's transaction.

This process is the application: it sends one ship message per order (every order
``paid``) to the queue's worker processes, for two runs on the demo's SQLite file, each
with its own table of orders (see ``_chain`` for what the workers do):

- ``naive``: ship books its shipment row on its own connection, then commits with
  today's fenced task, then enqueues notify; a worker killed between its row and its
  commit leaves a shipment behind (the redelivery books a second), one killed after the
  commit, before the enqueue and the ack, is answered ``Duplicate`` and notify is never
  sent;
- ``chain``: ship's commit, its shipment row and notify's outbox row are one worker
  transaction (``fenced_task(..., transaction=, then=)``); a relay process publishes
  notify, SIGKILLed twice after a publish and before marking the row sent (as in
  ``--outbox``). Killed before its commit, ship leaves nothing and the redelivery ships
  once; killed after, the redelivery is ``Duplicate`` and notify, committed with ship,
  is sent once.

The numbers come from the database (the orders' status, the shipment and notification
rows per order) and from the workers' events (duplicates refused, crashes).
"""

from __future__ import annotations

import dataclasses
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import fencing

from ..._errors import ConfigurationError
from ..config import DemoConfig
from ..scenario import start_mode
from ._broker import broker_url
from ._chain import (
    EVENTS,
    MODES,
    chain_crashes,
    create_tables,
    notifications_table,
    orders_table,
    shipments_table,
)
from .modules import preflight
from .outbox import QUIET, _cleanup_outbox_jobs, relay_hangs
from .processes import Workers
from .relay import Relays
from .runner import (
    POLL,
    RUN_TIMEOUT,
    _broker_failures,
    _Progress,
    processes,
    run_setup,
)

TITLES: Final = {
    "naive": "naive: commit, then enqueue",
    "chain": "worker transaction + outbox",
}


@dataclasses.dataclass
class ChainResult:
    """One run of the chain demo, per step, from the database and the workers' events."""

    mode: str
    orders: int
    run_id: str = ""
    seconds: float = 0.0
    killed_before_commit: int = 0
    killed_after_commit: int = 0
    relay_kills: int = 0
    # ship
    shipped: int = 0  # orders whose status moved past paid
    shipped_once: int = 0  # ... with exactly one shipment row
    shipped_twice: int = 0  # orders with more than one shipment row
    ship_lost: int = 0  # orders never shipped
    ship_duplicates_refused: int = 0
    # notify
    notify_sent: int = 0  # messages enqueued (naive) or published by the relay (chain)
    notify_republished: int = 0
    notified_once: int = 0
    notified_twice: int = 0
    notify_lost: int = 0  # shipped orders never notified
    notify_lost_orders: list[int] = dataclasses.field(default_factory=list)
    shipped_twice_orders: list[int] = dataclasses.field(default_factory=list)
    notify_duplicates_refused: int = 0
    notify_rows: int = 0  # notify's outbox rows (chain: one per order, none of a killed run)
    retries: int = 0
    errors: list[str] = dataclasses.field(default_factory=list)

    @property
    def lost(self) -> int:
        return self.ship_lost + self.notify_lost

    @property
    def ok(self) -> bool:
        return (
            self.shipped_once == self.orders
            and self.notified_once == self.orders
            and self.lost == 0
            and self.shipped_twice == 0
            and self.notified_twice == 0
            and not self.errors
        )

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["lost"] = self.lost
        out["ok"] = self.ok
        out["first_errors"] = self.errors[:5]
        out["errors"] = len(self.errors)
        return out


@dataclasses.dataclass
class _Run:
    mode: str
    orders: int
    table: str
    store: fencing.Store
    workers: Workers
    relays: Relays | None
    events: _Progress
    on_progress: Callable[[int], None]

    def __post_init__(self) -> None:
        self.acked: dict[str, dict[int, int]] = {"ship": {}, "notify": {}}
        self.sent = 0
        self.lines: list[dict[str, Any]] = []
        self.last_event = time.monotonic()

    def run(self, send: Callable[[fencing.Intent], None], result: ChainResult) -> None:
        start = time.monotonic()
        table = self.store.table(self.table)
        for order in range(1, self.orders + 1):
            send(table.intent(order, "ship"))
        while not self._done():
            if time.monotonic() - start > RUN_TIMEOUT:
                shipped = len(self.acked["ship"])
                raise ConfigurationError(
                    f"the {self.mode} chain run did not finish in {RUN_TIMEOUT:.0f}s"
                    f" ({shipped} of {self.orders} orders shipped)"
                )
            for line in self.events.of(self.mode):
                self._note(line)
            self.workers.check()
            if self.relays is not None:
                self.relays.check()
            time.sleep(POLL)
        result.seconds = time.monotonic() - start

    def _note(self, line: dict[str, Any]) -> None:
        self.last_event = time.monotonic()
        self.lines.append(line)
        step, order, what = str(line["step"]), int(line["order"]), str(line["what"])
        if what == "sent":
            self.sent += 1
        elif not what.startswith("crash-"):
            done = self.acked[step]
            done[order] = done.get(order, 0) + 1
            if step == "ship" and done[order] == 1:
                self.on_progress(1)

    def _done(self) -> bool:
        if len(self.acked["ship"]) < self.orders:
            return False
        sent = self.sent
        if self.relays is not None:
            if self.store.outbox.stats().pending:
                return False
            sent = sum(self.relays.published().values())
        ended = sum(self.acked["notify"].values())
        return ended >= sent or time.monotonic() - self.last_event > QUIET


def _judge(run: _Run, path: str, run_id: str, result: ChainResult) -> None:
    mode = run.mode
    conn = sqlite3.connect(path, timeout=30)
    try:
        status = dict(conn.execute(f"SELECT id, status FROM {orders_table(run_id, mode)}"))
        counts = {}
        for name in (shipments_table(run_id), notifications_table(run_id)):
            rows = conn.execute(
                f"SELECT order_id, COUNT(*) FROM {name} WHERE mode = ? GROUP BY order_id", (mode,)
            )
            counts[name] = dict(rows)
        okey = f"table:{orders_table(run_id, mode)}:%"
        (rows,) = conn.execute(
            "SELECT COUNT(*) FROM fencing_outbox WHERE okey LIKE ?", (okey,)
        ).fetchone()
        result.notify_rows = int(rows)
    finally:
        conn.close()
    shipments = counts[shipments_table(run_id)]
    notes = counts[notifications_table(run_id)]
    shipped = [o for o, s in status.items() if s != "paid"]
    result.shipped = len(shipped)
    result.ship_lost = run.orders - len(shipped)
    result.shipped_once = sum(1 for o in shipped if shipments.get(o, 0) == 1)
    result.shipped_twice_orders = sorted(o for o, n in shipments.items() if n > 1)
    result.shipped_twice = len(result.shipped_twice_orders)
    result.notified_once = sum(1 for n in notes.values() if n == 1)
    result.notified_twice = sum(1 for n in notes.values() if n > 1)
    result.notify_lost_orders = sorted(o for o in shipped if notes.get(o, 0) == 0)
    result.notify_lost = len(result.notify_lost_orders)
    for line in run.lines:
        step, what = line["step"], line["what"]
        result.killed_before_commit += what == "crash-before"
        result.killed_after_commit += what == "crash-after"
        if what == "duplicate":
            if step == "ship":
                result.ship_duplicates_refused += 1
            else:
                result.notify_duplicates_refused += 1
        result.retries += what == "retry"  # a transient error: the queue runs it again
        if what in ("fail", "refuse"):
            result.errors.append(f"{step} {line['order']}: {line.get('detail', what)}")
    result.notify_sent = run.sent
    if run.relays is not None:
        published = run.relays.published()
        result.notify_sent = sum(published.values())
        result.notify_republished = sum(n - 1 for n in published.values() if n > 1)
        result.relay_kills = run.relays.kills


def run_chain_demo(
    config: DemoConfig,
    on_start: Callable[[str, int], None] | None = None,
    on_progress: Callable[[str, int], None] | None = None,
) -> dict[str, ChainResult]:
    """Ship ``config.tasks`` orders through ``config.queue``, naive then in the worker's
    transaction; each run's result."""
    assert config.queue is not None
    queue = config.queue
    module = preflight(config)
    url = broker_url(config)
    temp, settings, _history = run_setup(config, url, None)
    control, run_id, path = Path(settings.control), settings.run_id, str(temp / "demo.db")
    before, after = chain_crashes(config.seed, config.tasks)
    results: dict[str, ChainResult] = {}
    with (
        processes(temp, lambda: _cleanup_outbox_jobs(url, control)) as started,
        fencing.open(settings.store) as store,
        _broker_failures(queue, module),
    ):
        create_tables(path, run_id, config.tasks)
        sender = module.Sender(settings)
        restarts = 4 * (len(before) + len(after)) + 4
        workers = started.start(sender, settings, config.workers, restarts)
        events = _Progress(control / EVENTS)
        relays: Relays | None = None
        for mode in MODES:
            advance = start_mode(mode, config.tasks, on_start, on_progress)
            if mode == "chain":
                relays = started.start_relays(
                    queue, control, relay_hangs(config.seed, config.tasks)
                )
            run = _Run(
                mode,
                config.tasks,
                orders_table(run_id, mode),
                store,
                workers,
                relays if mode == "chain" else None,
                events,
                advance,
            )
            result = ChainResult(mode, config.tasks, run_id)

            def send(intent: fencing.Intent, mode: str = mode) -> None:
                sender.send_chain("ship", mode, intent)

            try:
                run.run(send, result)
            finally:
                if relays is not None:
                    relays.stop()
            _judge(run, path, run_id, result)
            results[mode] = result
    return results
