"""The ``fencing`` command line: demo, check, bench, reconcile, relay, outbox, migrate,
prune, inspect, stats; ``fencing --version``.

Each subcommand lives in its own module and is imported only when run; the
``cli`` extra brings rich for tables and progress bars. Every subcommand and argument
has a help text (``tests/test_cli_help.py`` walks the parser to keep it so).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["main"]


def _cmd_migrate(args: argparse.Namespace, store: Any = None) -> int:
    """``fencing migrate``: on ``store`` (opened with ``migrate=False``; left open) if
    given, else on ``args.url``."""
    import fencing

    if store is None:
        with fencing.open(args.url, migrate=False) as opened:
            return _cmd_migrate(args, opened)
    store.migrate()
    print(f"migrated {store.url}")
    for table in args.guard_table or ():
        mode = args.guard_mode
        store.guard_table(table, version=args.version_column, key=args.key_column, mode=mode)
        trigger = f"fencing_guard_{table.rpartition('.')[2]}"
        print(f"guarded table {table} (trigger {trigger}{', strict' if mode == 'strict' else ''})")
    for table in args.unguard_table or ():
        store.unguard_table(table)
        print(f"unguarded table {table}")
    return 0


def _cmd_prune(args: argparse.Namespace) -> int:
    import json

    import fencing

    with fencing.open(args.url, migrate="check") as store:
        age = store.options.retention if args.older_than is None else args.older_than
        forgotten = store.prune(older_than=age)
        try:
            sent = store.outbox.prune(older_than=age)
        except fencing.ConfigurationError:  # a store without an outbox (memory, Redis)
            sent = None
    if args.json:
        print(json.dumps({"older_than": age, "pruned": forgotten, "outbox_pruned": sent}))
    else:
        outbox = "" if sent is None else f", {sent} sent outbox row(s)"
        print(
            f"pruned {forgotten} applied intent(s) and finished effect(s){outbox}"
            f" older than {age:g}s"
        )
    return 0


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number of seconds, not {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"a number of seconds from 0, not {text!r}")
    return value


def migrate_arguments(p: argparse.ArgumentParser, *, url: bool = True) -> None:
    """The arguments of ``fencing migrate`` (``url=False``: all but the store's URL, for a
    command that knows its store: Django's ``manage.py fencing_migrate``)."""
    if url:
        p.add_argument("url", help="store URL, e.g. sqlite:///app.db" + _url_help())
    p.add_argument(
        "--guard-table",
        action="append",
        metavar="TABLE",
        help="install the guard trigger on TABLE (repeatable): any UPDATE that leaves its"
        " version unchanged bumps it, one that sets it lower is refused (docs/guard.md)",
    )
    p.add_argument(
        "--guard-mode",
        choices=("bump", "strict"),
        default="bump",
        help="what the guard does with an UPDATE that leaves the version unchanged: bump it"
        " (default), or refuse it (strict: for staging, to find blind writers)",
    )
    p.add_argument(
        "--version-column", default="version", help="the guarded version column (version)"
    )
    p.add_argument(
        "--key-column", default="id", help="the guarded table's key column (id; SQLite uses it)"
    )
    p.add_argument(
        "--unguard-table", action="append", metavar="TABLE", help="remove TABLE's guard trigger"
    )


def version() -> str:
    """The installed distribution's version, else the package's ``__version__``."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("fencing")
    except PackageNotFoundError:
        import fencing

        return str(getattr(fencing, "__version__", "unknown"))


class _Version(argparse.Action):
    """``--version``: print it and exit (read only when asked for)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        kwargs.setdefault("help", "print fencing's version and exit")
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        print(f"fencing {version()}")
        parser.exit()


def _lazy(module: str, attr: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        import importlib

        fn: Callable[[argparse.Namespace], int] = getattr(importlib.import_module(module), attr)
        return fn(args)

    return run


def _adder(module: str) -> Callable[[argparse.ArgumentParser], None]:
    import importlib

    add: Callable[[argparse.ArgumentParser], None] = importlib.import_module(module).add_arguments
    return add


def _url_help() -> str:
    from ._url import URL_HELP

    return URL_HELP


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fencing",
        description="Background tasks that cannot commit stale decisions.",
    )
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", help="what to do (COMMAND -h: its help)"
    )

    commands: list[tuple[str, str, str]] = [
        ("demo", "fencing._demo", "race naive read-modify-write against fencing; judge both"),
        ("check", "fencing.testing._cli", "judge a recorded history (JSONL) for anomalies"),
        ("bench", "fencing._bench", "throughput and latency beside hand-written baselines"),
        (
            "reconcile",
            "fencing._reconcile",
            "list effects of stale or fenced intents not yet reconciled; --mark KEY",
        ),
        (
            "relay",
            "fencing.contrib._cli_relay",
            "publish committed outbox rows through a queue's own client (docs/outbox.md)",
        ),
        (
            "outbox",
            "fencing.contrib._cli_outbox",
            "list pending outbox rows with their age, or --dead rows (--retry/--drop ID);"
            " --fail-if-older SECONDS, --fail-if-dead for a monitor",
        ),
        (
            "inspect",
            "fencing._cli_inspect",
            "show one record of a collection or row of a guarded table: version, fence,"
            " its lease and the last intents applied to it",
        ),
        (
            "stats",
            "fencing._cli_stats",
            "per collection and table: records, applied intents, effects by state, leases"
            " held; the outbox's backlog",
        ),
    ]
    for name, module, help_text in commands:
        p = sub.add_parser(name, help=help_text, description=help_text)
        _adder(module)(p)
        p.set_defaults(func=_lazy(module, "run"))

    what = "create or upgrade fencing's tables in a store; install or remove guard triggers"
    p = sub.add_parser("migrate", help=what, description=what)
    migrate_arguments(p)
    p.set_defaults(func=_cmd_migrate)

    what = (
        "forget what is past the retention: applied intent ids, finished effects, sent"
        " outbox rows (schedule it: cron, Celery beat; docs/operations.md)"
    )
    p = sub.add_parser("prune", help=what, description=what)
    p.add_argument("url", help="store URL, e.g. sqlite:///app.db" + _url_help())
    p.add_argument(
        "--older-than",
        type=_seconds,
        default=None,
        metavar="S",
        help="seconds (default: 30 days, the store's retention). An intent redelivered"
        " after its id was pruned is no longer told a Duplicate: keep this above your"
        " queues' longest redelivery delay",
    )
    p.add_argument("--json", action="store_true", help="print the counts as JSON")
    p.set_defaults(func=_cmd_prune)

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        try:
            code = _main(argv)
        except SystemExit:  # argparse's --help, --version and usage errors
            sys.stdout.flush()  # what they printed, out here too
            raise
        sys.stdout.flush()  # here, so a reader that went away is seen here
        return code
    except BrokenPipeError:
        return _reader_gone()
    except SystemExit as exc:
        # rich's console meets a broken pipe with SystemExit(1), raised while handling it
        if isinstance(exc.__context__, BrokenPipeError):
            return _reader_gone()
        raise


def _reader_gone() -> int:
    """``fencing stats URL | head``: the reader closed the pipe; no traceback, and
    nothing more written (the interpreter's own last flush would fail again)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 141  # 128 + SIGPIPE, as a shell reports a command the pipe ended


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from ._errors import FencingError

    func: Any = args.func
    try:
        if isinstance(getattr(args, "url", None), str):
            from ._url import resolve_url

            args.url = resolve_url(args.url)
        return int(func(args))
    except FencingError as exc:
        print(f"fencing: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
