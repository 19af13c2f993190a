"""``fencing bench``: fencing's operations beside the hand-written code with the same guarantee.

For each store and setting, each operation is measured through fencing and through a
hand-written baseline on the raw driver, alternately in the same run (see
``_harness``), and reported as ratios of time per call, with p50/p99 latency and peak
Python memory. ``--json`` prints a list of rows, ``--markdown`` a table to paste into
the README, ``--report FILE`` also writes them as an HTML page with charts (``_html``).
rich (the ``cli`` extra) is needed only for the default table output.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, Final, Protocol

from .._errors import ConfigurationError, FencingError, InvalidInput, StoreError
from ._harness import BenchFailed, Contest, Plan, Skip, measure, rows_for

__all__ = ["OPERATIONS", "add_arguments", "run"]

#: ``--only`` names, in the order contests run.
OPERATIONS: Final = (
    "commit",
    "refused",
    "table",
    "guard",
    "using",
    "worktx",
    "apply",
    "many",
    "fenced",
    "lease",
    "metrics",
)

DEFAULT_SECONDS: Final = 5.0
DEFAULT_ROUNDS: Final = 20
QUICK: Final = Plan(rounds=2, ops=4, warmup=2, min_ops=1)

Builder = Callable[[], Contest | Skip]


class Scenario(Protocol):
    """One store and setting: its contests by ``--only`` name, and its cleanup."""

    store_name: str
    setting: str

    def contests(self) -> list[tuple[str, Builder]]: ...
    def check_answers(self) -> list[tuple[str, Any, Any]]: ...
    def close(self) -> None: ...


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--store",
        action="append",
        default=[],
        metavar="URL",
        help="store to measure (repeatable); default: a temp SQLite WAL file at"
        " synchronous=FULL and at NORMAL. postgresql://, mysql://, redis:// URLs are"
        " measured beside hand-written one-round-trip baselines",
    )
    amount = parser.add_mutually_exclusive_group()
    amount.add_argument(
        "--seconds",
        type=float,
        help=f"time budget per operation, all rounds and sides (default {DEFAULT_SECONDS:g})",
    )
    amount.add_argument("--ops", type=int, help="calls per side per round (instead of --seconds)")
    parser.add_argument(
        "--rounds",
        type=int,
        help=f"alternating rounds per operation (default {DEFAULT_ROUNDS})",
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=OPERATIONS,
        help="measure only these operations (repeatable)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="a tiny run that checks everything works (CI)"
    )
    parser.add_argument(
        "--no-memory", action="store_true", help="skip the tracemalloc peak-memory blocks"
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--contention",
        action="store_true",
        help="the worker pattern under load (apply + Recompute, 16 threads and 4 processes,"
        " 1 and 64 keys, 0 and 2 ms decide) beside FOR UPDATE (PostgreSQL) and a redis-py"
        " Lock (Redis): goodput and client CPU per operation; needs --store",
    )
    mode.add_argument(
        "--server-cost",
        action="store_true",
        help="the server's own time per commit beside the same-answer baseline's"
        " (PostgreSQL: backend CPU; Redis: INFO commandstats); needs --store",
    )
    mode.add_argument(
        "--scale",
        action="store_true",
        help="commit latency at 10^3, 10^5 and 10^6 records and applied ids, and prune()"
        " at 10^6 beside concurrent commits (SQLite, and --store postgresql://); slow",
    )
    parser.add_argument(
        "--report",
        metavar="FILE",
        help="also write the results as one self-contained HTML page (bench.html):"
        " ratios and latency distributions per operation and store",
    )
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print the rows as JSON")
    output.add_argument("--markdown", action="store_true", help="print a Markdown table")


def plan_from(args: argparse.Namespace) -> Plan:
    """The measurement plan the options ask for; bad numbers raise ``InvalidInput``."""
    rounds, ops, seconds = args.rounds, args.ops, args.seconds
    if rounds is not None and not 1 <= rounds <= 1000:
        raise InvalidInput(f"--rounds must be from 1 to 1000, not {rounds}")
    if ops is not None and not 1 <= ops <= 1_000_000:
        raise InvalidInput(f"--ops must be from 1 to 1000000, not {ops}")
    if seconds is not None and not 0.01 <= seconds <= 3600:
        raise InvalidInput(f"--seconds must be from 0.01 to 3600, not {seconds}")
    base = QUICK if args.quick else Plan(rounds=DEFAULT_ROUNDS, seconds=DEFAULT_SECONDS)
    return Plan(
        rounds=base.rounds if rounds is None else rounds,
        ops=ops if ops is not None else (None if seconds is not None else base.ops),
        seconds=base.seconds if seconds is None else seconds,
        warmup=base.warmup,
        min_ops=base.min_ops,
        max_ops=base.max_ops,
        memory=not args.no_memory,
    )


def _scenario(url: str | None, synchronous: str = "full") -> Scenario:
    if url is None:
        from ._sqlite import SQLiteBench

        return SQLiteBench(None, synchronous)
    from .._url import StoreURL

    scheme = StoreURL.parse(url).scheme
    if scheme == "sqlite":
        from ._sqlite import SQLiteBench

        return SQLiteBench(url)
    if scheme in ("postgresql", "postgres"):
        from ._postgres import PostgresBench

        return PostgresBench(url)
    if scheme in ("mysql", "mariadb"):
        from ._mysql import MySQLBench

        return MySQLBench(url)
    if scheme in ("redis", "rediss"):
        from ._redis import RedisBench

        return RedisBench(url)
    raise ConfigurationError(f"fencing bench has no baseline for {scheme}:// stores")


def _redacted(url: str) -> str:
    from .._url import StoreURL

    try:
        return StoreURL.parse(url).redacted()
    except ConfigurationError:
        return url.split("://", 1)[0]


def _skipped(store: str, setting: str, operation: str | None, reason: str) -> dict[str, Any]:
    return {
        "kind": "skipped",
        "store": store,
        "setting": setting,
        "operation": operation,
        "reason": reason,
    }


def speedup_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """commit_many's commits/s over single collection.commit's, per store and setting."""
    out: list[dict[str, Any]] = []
    single: dict[tuple[str, str], dict[str, Any]] = {}
    many: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:  # fencing's numbers repeat on each baseline's row: take the first
        if r["kind"] == "pair" and r["operation"] == "collection.commit":
            single.setdefault((r["store"], r["setting"]), r)
        elif r["kind"] == "pair" and r["operation"].startswith("commit_many"):
            many.setdefault((r["store"], r["setting"]), r)
    for where, row in many.items():
        one = single.get(where)
        if one is None:
            continue
        ratio = row["fencing_ops_per_s"] / one["fencing_ops_per_s"]
        out.append(
            {
                "kind": "speedup",
                "store": row["store"],
                "setting": row["setting"],
                "operation": "commit_many vs collection.commit",
                "fencing_ops_per_s": row["fencing_ops_per_s"],
                "baseline_ops_per_s": one["fencing_ops_per_s"],
                "ratio": ratio,
                # no target: issue 21 set commit_many's beside the hand-written batch
                "target_ratio": None,
                "target_met": None,
            }
        )
    return out


def collect(
    targets: list[tuple[str | None, str]],
    plan: Plan,
    only: set[str] | None,
    say: Callable[[str], None],
) -> list[dict[str, Any]]:
    """Measure every store and setting; a list of rows."""
    rows: list[dict[str, Any]] = []
    for url, synchronous in targets:
        try:
            scenario = _scenario(url, synchronous)
        except (ConfigurationError, StoreError) as exc:
            # A backend not written yet, a driver not installed, a server not running.
            label = _redacted(url) if url else "sqlite"
            say(f"{label}: unavailable ({type(exc).__name__}: {exc}); skipped")
            rows.append(_skipped(label.split(":", 1)[0], label, None, f"unavailable: {exc}"))
            continue
        try:
            wrong = [case for case in scenario.check_answers() if case[1] != case[2]]
            if wrong:  # a baseline that returns less than fencing is no baseline
                raise BenchFailed(
                    f"{scenario.store_name}: the same-answer baseline answered otherwise: {wrong}"
                )
            for name, build in scenario.contests():
                if only and name not in only:
                    continue
                where = f"{scenario.store_name} ({scenario.setting}), {name}"
                try:
                    contest = build()
                    if isinstance(contest, Skip):
                        rows.append(
                            _skipped(
                                scenario.store_name,
                                scenario.setting,
                                contest.operation,
                                contest.reason,
                            )
                        )
                        continue
                    say(f"{where}: {', '.join(contest.stages)}")
                    result = measure(contest, plan)
                except FencingError:
                    raise
                except Exception as exc:  # a driver's error: say where, keep the cause
                    raise StoreError(f"{where}: {type(exc).__name__}: {exc}") from exc
                rows += rows_for(result, scenario.store_name, scenario.setting)
        finally:
            scenario.close()
    return rows + speedup_rows(rows)


_SCHEMES: Final = frozenset(
    {"sqlite", "postgresql", "postgres", "mysql", "mariadb", "redis", "rediss"}
)


def check_store(url: str) -> str:
    """A store URL the bench can measure; anything else raises before any work."""
    from .._url import StoreURL

    scheme = StoreURL.parse(url).scheme
    if scheme not in _SCHEMES:
        raise ConfigurationError(
            f"fencing bench has no hand-written baseline for {scheme}:// stores;"
            f" use one of {', '.join(sorted(_SCHEMES))}"
        )
    return url


def _run_mode(args: argparse.Namespace, plan: Plan) -> list[dict[str, Any]] | None:
    """Rows of ``--contention``, ``--server-cost`` or ``--scale``; None for the contests."""
    progress = sys.stderr.isatty() and not args.quick

    def say(text: str) -> None:
        if progress:
            print(text, file=sys.stderr, flush=True)

    if args.contention:
        from ._contention import GRID, QUICK_GRID, run_contention

        if not args.store:
            raise InvalidInput("--contention needs --store postgresql://... or redis://...")
        seconds = 0.3 if args.quick else (args.seconds or 4.0)
        return run_contention(args.store, seconds, say, QUICK_GRID if args.quick else GRID)
    if args.server_cost:
        from ._servercost import run_server_cost

        if not args.store:
            raise InvalidInput("--server-cost needs --store postgresql://... or redis://...")
        return run_server_cost(args.store, 30 if args.quick else (args.ops or 2000))
    if args.scale:
        from ._scale import run_scale

        urls: list[str | None] = [None, *args.store]
        return run_scale(urls, args.quick, say)
    return None


def run(args: argparse.Namespace) -> int:
    plan = plan_from(args)
    for url in args.store:
        check_store(url)
    report = getattr(args, "report", None)
    if report is not None:
        from .._html import check_report_path

        check_report_path(report, "--report")
    if report is not None and (args.contention or args.server_cost or args.scale):
        raise InvalidInput(
            "--report draws the operation contests, not --contention, --server-cost or --scale"
        )
    special = _run_mode(args, plan)
    if special is not None:
        from . import _report

        if args.json:
            print(_report.to_json(special))
        else:
            print(_report.modes_markdown(special), end="")
        return 0
    targets: list[tuple[str | None, str]] = (
        [(url, "") for url in args.store] if args.store else [(None, "full"), (None, "normal")]
    )
    only = set(args.only) if args.only else None
    progress = sys.stderr.isatty() and not args.quick

    def say(text: str) -> None:
        if progress or text.endswith("skipped"):
            print(text, file=sys.stderr, flush=True)

    rows = collect(targets, plan, only, say)
    from . import _report

    if args.json:
        print(_report.to_json(rows))
    elif args.markdown:
        print(_report.to_markdown(rows, quick=args.quick), end="")
    else:
        _report.print_rich(rows, quick=args.quick)
    if report is not None:
        from ._html import write_report

        write_report(report, rows, quick=args.quick)
        if not args.json:
            print(f"report: {report}", file=sys.stderr if args.markdown else sys.stdout)
    return 0
