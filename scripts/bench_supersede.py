"""Supersede and debounce, measured (issue 22): what a burst to one key costs, and what
the relay's throughput is on a workload with no repeats, with and without them.

Usage: ``python scripts/bench_supersede.py [--store sqlite] [--store URL ...]
[--rows 2000] [--rounds 5] [--json]``. ``--store``: ``sqlite`` (a store file in a
temporary directory) or a PostgreSQL / MySQL / MariaDB server URL
(``postgresql://root@127.0.0.1:5432/test``): the run makes a schema (PostgreSQL) or a
database (MySQL) of its own and drops it at the end (``bench_relay.Database``).

- burst: an order updated 100 times, each update followed by ``outbox.send`` of a fenced
  Celery task for it (Celery's in-memory broker), once plain and once with
  ``supersede=True``; then one ``Relay.run_once()`` and a worker that runs the task on
  every message published: publishes, worker runs (messages the task ran on), their
  outcomes and the calls of ``decide``, counted.
- throughput, no repeats: each round writes ``--rows`` rows, one per key (one
  transaction on the caller's connection through ``store.using(conn)``), then one
  ``Relay.run_once()`` drains them (batch 100, mark every 20) through a publisher that
  does nothing (so the store's work is what is measured, not a broker's); then the sent
  rows are pruned. Three sends, alternated round by round (their order rotates):
  ``plain``, ``supersede=True`` (the send's UPDATE of the key's waiting rows: none
  here), ``debounce=0`` (superseding, and every row has ``due_at``, which the claim
  checks). Reported: the median over the rounds of rows/s written and drained.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from celery import Celery

import fencing
from fencing.contrib.celery import fenced_task, publisher
from fencing.contrib.relay import OutboxRow, Relay

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_relay import Database

SENDS: dict[str, dict[str, Any]] = {
    "plain": {},
    "supersede": {"supersede": True},
    "debounce=0": {"debounce": 0},
}


class Nothing:
    """A publisher that publishes nothing: the relay's own cost, the store's work."""

    kind = "celery"

    def __init__(self) -> None:
        self.published = 0

    def publish(self, row: OutboxRow) -> None:
        self.published += 1

    def close(self) -> None:
        pass


def _ship(record: fencing.Record) -> dict[str, Any]:
    return {**record.state, "shipped": record.state.get("n")}


def burst(store: fencing.Store, supersede: bool) -> dict[str, Any]:
    """100 updates of one order, each sent: publishes and worker runs, counted."""
    app = Celery("bench-burst", broker="memory://", set_as_current=False)
    queue = f"q-{uuid.uuid4().hex}"
    orders = store.collection(f"orders_{uuid.uuid4().hex[:8]}")
    decided: list[int] = []  # the versions decide ran on

    def ship(record: fencing.Record) -> dict[str, Any]:
        decided.append(record.version)
        return _ship(record)

    task = fenced_task(app, target=orders, name="bench.ship", queue=queue)(ship)
    order = orders.create("o-1", {"n": 0})
    for n in range(1, 101):
        result = orders.commit(order.intent("edit"), {"n": n})
        assert isinstance(result, fencing.Committed)
        order = result.record
        store.outbox.send(task, order, "ship", supersede=supersede)
    counts = Relay(store, publisher(app)).run_once()
    outcomes: list[str] = []
    with app.connection_for_read() as conn:
        messages = conn.SimpleQueue(queue)
        while True:
            try:
                message = messages.get(timeout=0.05)
            except messages.Empty:
                break
            args, _, _ = message.payload
            outcomes.append(task.apply(args=args).get()["outcome"])
            message.ack()
    app.close()
    final = orders.get("o-1")
    assert final is not None and final.state["shipped"] == 100
    return {
        "send": "supersede" if supersede else "plain",
        "updates": 100,
        "published": counts.published,
        "worker_runs": len(outcomes),
        "decided": len(decided),
        "committed": outcomes.count("committed"),
        "stale": outcomes.count("stale"),
    }


def throughput(db: Database, store: fencing.Store, rows: int, rounds: int) -> dict[str, Any]:
    """Rows/s written and drained per send, rounds alternated; medians."""
    app = Celery("bench-throughput", broker="memory://", set_as_current=False)
    orders = store.collection("orders")
    task = fenced_task(app, target=orders, name="bench.ship")(_ship)
    conn = db.connect()
    view = store.using(conn).collection("orders")
    for i in range(rows):
        view.create(f"o-{i}", {"n": 0})
    conn.commit()
    records = [r for r in (orders.get(f"o-{i}") for i in range(rows)) if r is not None]
    names = list(SENDS)
    written: dict[str, list[float]] = {n: [] for n in names}
    drained: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            outbox = store.using(conn).outbox
            started = time.perf_counter()
            for record in records:  # one row per key: no repeats
                outbox.send(task, record, "ship", **SENDS[name])
            conn.commit()
            written[name].append(rows / (time.perf_counter() - started))
            nothing = Nothing()
            started = time.perf_counter()
            counts = Relay(store, nothing, batch=100, mark_every=20).run_once()
            drained[name].append(rows / (time.perf_counter() - started))
            assert counts.published == nothing.published == rows, counts
            assert store.outbox.stats().pending == 0
            store.outbox.prune(older_than=0)
    conn.close()
    app.close()
    return {
        name: {
            "written_rows_s": round(statistics.median(written[name])),
            "drained_rows_s": round(statistics.median(drained[name])),
            "drained_rounds": [round(x) for x in drained[name]],
        }
        for name in names
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", action="append", help="sqlite, or a server URL")
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)  # the worker's Stale lines, the relay's publishes
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as root:
        for url in args.store or ["sqlite"]:
            name = f"fencing_bench_{uuid.uuid4().hex[:8]}"
            where = Path(root) / name
            where.mkdir()
            db = Database(url, where, name)
            store = fencing.open(db.url)
            try:
                kind = db.kind
                report[kind] = {
                    "burst": [burst(store, False), burst(store, True)],
                    "no_repeats": throughput(db, store, args.rows, args.rounds),
                }
            finally:
                store.close()
                db.drop()
            if not args.json:
                _show(kind, report[kind], args.rows, args.rounds)
    if args.json:
        print(json.dumps(report, indent=2))
    return 0


def _show(kind: str, found: dict[str, Any], rows: int, rounds: int) -> None:
    print(f"== {kind}")
    for b in found["burst"]:
        print(
            f"burst of {b['updates']} updates to one key, {b['send']:>9} sends:"
            f" {b['published']} publish(es), {b['worker_runs']} worker run(s)"
            f" ({b['committed']} committed, {b['stale']} stale; decide ran {b['decided']} time(s))"
        )
    print(f"no repeats, {rows} rows a round, median of {rounds} rounds (alternated):")
    for name, n in found["no_repeats"].items():
        print(
            f"  {name:>10}: written {n['written_rows_s']:>6} rows/s,"
            f" drained by the relay {n['drained_rows_s']:>6} rows/s"
            f" (rounds: {', '.join(map(str, n['drained_rounds']))})"
        )


if __name__ == "__main__":
    sys.exit(main())
