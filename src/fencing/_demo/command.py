"""``fencing demo``'s command line: its arguments, and the JSON or the rich output."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from .config import QUEUE_DEFAULTS, QUEUES, DemoConfig, validate
from .render import run_rich
from .runner import run_demo
from .scenario import LEASE_TTL, RunResult


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = DemoConfig()
    parser.add_argument("--seed", type=int, default=defaults.seed, help="schedule seed")
    parser.add_argument(
        "--tasks",
        type=int,
        help=f"tasks per run (default {defaults.tasks}; {QUEUE_DEFAULTS['tasks']} with --queue)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        help=f"workers per run (default {defaults.workers};"
        f" {QUEUE_DEFAULTS['workers']} worker processes with --queue)",
    )
    parser.add_argument(
        "--keys", type=int, default=defaults.keys, help="accounts and orders raced over (each)"
    )
    parser.add_argument(
        "--store",
        metavar="URL",
        help="store URL (default: a temporary SQLite file, sqlite:///...)",
    )
    parser.add_argument(
        "--processes",
        action="store_true",
        help="workers are real processes sharing the store (a file or a server)",
    )
    parser.add_argument("--history", metavar="DIR", help="keep naive.jsonl and fencing.jsonl here")
    parser.add_argument(
        "--queue",
        choices=QUEUES,
        help="run the schedule through this task queue, with real worker processes",
    )
    parser.add_argument(
        "--broker",
        metavar="URL",
        help="the queue's broker (default redis://127.0.0.1:6379/10; celery and dramatiq"
        " also take amqp://guest:guest@127.0.0.1:5672//)",
    )
    parser.add_argument(
        "--outbox",
        action="store_true",
        help="with --queue: the send after the commit, naive (a crash before the enqueue loses"
        " the task) vs the transactional outbox and a relay SIGKILLed mid-run",
    )
    parser.add_argument(
        "--chain",
        action="store_true",
        help="with --queue and --outbox: a two-step chain, ship -> notify, whose worker is"
        " SIGKILLed before and after its commit; naive (commit, then enqueue) vs the worker's"
        " transaction (commit, shipment row and notify's outbox row together)",
    )
    parser.add_argument(
        "--report",
        metavar="FILE",
        help="also write the race as one self-contained HTML page (race.html): the"
        " checker's verdict and a timeline per key, naive and fencing",
    )
    parser.add_argument("--json", action="store_true", help="machine output: no table, no bar")


def _config(args: argparse.Namespace) -> DemoConfig:
    defaults: Mapping[str, int] = asdict(DemoConfig())
    if args.queue is not None:
        defaults = QUEUE_DEFAULTS
    return DemoConfig(
        seed=args.seed,
        tasks=defaults["tasks"] if args.tasks is None else args.tasks,
        workers=defaults["workers"] if args.workers is None else args.workers,
        keys=args.keys,
        store=args.store,
        processes=args.processes,
        history_dir=args.history,
        queue=args.queue,
        broker=args.broker,
        outbox=args.outbox,
        report=args.report,
        chain=args.chain,
    )


def _summary(config: DemoConfig, results: dict[str, RunResult]) -> dict[str, Any]:
    fencing_report = results["fencing"].report
    ok = bool(fencing_report is not None and fencing_report.ok)
    return {
        "ok": ok,
        "config": asdict(config),
        "lease_ttl": LEASE_TTL,
        "runs": {mode: result.to_dict() for mode, result in results.items()},
    }


def run(args: argparse.Namespace) -> int:
    config = _config(args)
    validate(config)
    if args.json and config.chain:
        from .queues.chain import run_chain_demo

        chained = run_chain_demo(config)
        ok = chained["chain"].ok
        out = {"ok": ok, "config": asdict(config)}
        out["runs"] = {mode: result.to_dict() for mode, result in chained.items()}
        print(json.dumps(out, indent=2, sort_keys=True))
        return 0 if ok else 1
    if args.json and config.outbox:
        from .queues.outbox import run_outbox_demo

        runs = run_outbox_demo(config)
        ok = runs["outbox"].ok
        out = {"ok": ok, "config": asdict(config), "lease_ttl": LEASE_TTL}
        out["runs"] = {mode: result.to_dict() for mode, result in runs.items()}
        print(json.dumps(out, indent=2, sort_keys=True))
        return 0 if ok else 1
    if args.json:
        results = run_demo(config)
        summary = _summary(config, results)
        print(json.dumps(summary, indent=2, sort_keys=True))
        return 0 if summary["ok"] else 1
    return run_rich(config)
