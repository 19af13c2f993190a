"""``fencing relay URL --queue celery|rq|dramatiq|arq --app module:attr``: run a relay.

``--app`` names the object the queue's publisher sends with, imported from the
current directory like Celery's ``-A``:

- celery: a ``Celery`` app (its configured broker; task routes and queues as usual);
- rq: a ``redis.Redis`` connection, or an RQ ``Queue`` (its connection; its name is
  the queue of rows sent without ``queue=``);
- dramatiq: a ``Broker`` (import the module that declares the actors, so its queues
  are declared on RabbitMQ);
- arq: ``RedisSettings`` (the relay opens its own pool), or a zero-argument function
  returning ``RedisSettings`` or an ``ArqRedis`` pool (awaited if it is a coroutine).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import os
import signal
import sys
from typing import Any

from .._errors import ConfigurationError
from .._outbox import QUEUE_KINDS
from .._url import URL_HELP

__all__ = ["add_arguments", "load_app", "run"]


def add_arguments(parser: argparse.ArgumentParser, *, url: bool = True) -> None:
    """The arguments of ``fencing relay`` (``url=False``: all but the store's URL, for a
    command that knows its store: Django's ``manage.py fencing_relay``)."""
    if url:
        parser.add_argument(
            "url", help="store URL, e.g. sqlite:///app.db (the outbox's store)" + URL_HELP
        )
    parser.add_argument(
        "--queue",
        required=True,
        choices=QUEUE_KINDS,
        help="the task queue whose rows this relay publishes",
    )
    parser.add_argument(
        "--app",
        required=True,
        metavar="MODULE:ATTR",
        help="what to publish with: a Celery app, an RQ Redis connection or Queue, a Dramatiq"
        " broker, arq RedisSettings (or a function returning settings or a pool)",
    )
    parser.add_argument(
        "--once", action="store_true", help="drain the outbox and exit (cron, tests)"
    )
    parser.add_argument("--batch", type=int, default=100, metavar="N", help="rows per claim (100)")
    parser.add_argument(
        "--poll",
        type=float,
        default=1.0,
        metavar="S",
        help="seconds an idle relay waits before claiming again (1.0)",
    )
    parser.add_argument(
        "--ttl",
        type=float,
        default=30.0,
        metavar="S",
        help="seconds a claim holds its rows; another relay takes them after (30)",
    )
    parser.add_argument(
        "--name", default=None, help="this relay's name in claims and logs (<host>:<pid>)"
    )
    parser.add_argument(
        "--retention",
        type=float,
        default=7 * 86400.0,
        metavar="S",
        help="prune rows sent more than this many seconds ago (7 days)",
    )
    parser.add_argument(
        "--dead-after",
        type=_dead_after,
        default=10,
        metavar="N|never",
        help="give a row up as dead after N failed publishes while the broker took other rows"
        " (a poison row; its key's later rows then go on without it); never: hold its key"
        " back until it is published (10)",
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="no progress line (shown on stderr with --once, and on a terminal), only the"
        " final counts",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve Prometheus metrics on PORT: the relay's rows by result, the outbox's"
        " backlog and age, dead rows (the prometheus extra)",
    )
    parser.add_argument(
        "--metrics-addr",
        default="127.0.0.1",
        metavar="ADDR",
        help="the address --metrics-port listens on (127.0.0.1; 0.0.0.0 for every interface)",
    )
    parser.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default="warning",
        help="log level of the fencing.relay logger on stderr (info: one line per publish)",
    )


def _dead_after(text: str) -> int | None:
    if text.strip().lower() in ("never", "none", "0"):
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number of strikes or 'never', not {text!r}") from None
    if not 1 <= value <= 10_000:
        raise argparse.ArgumentTypeError("from 1 to 10000, or 'never'")
    return value


def load_app(spec: str) -> Any:
    """The object named by ``module:attr`` (``module.attr`` also accepted), importing
    from the current directory."""
    module, sep, attr = spec.partition(":")
    if not sep:
        module, _, attr = spec.rpartition(".")
    if not module or not attr:
        raise ConfigurationError(f"--app is module:attr, not {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found: Any = importlib.import_module(module)
    except ImportError as exc:
        raise ConfigurationError(f"--app: cannot import {module!r}: {exc}") from exc
    for part in attr.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise ConfigurationError(f"--app: {module!r} has no {attr!r}") from None
    return found


def _publisher(kind: str, app: Any) -> Any:
    if kind == "celery":
        from .celery import publisher as celery_publisher

        return celery_publisher(app)
    if kind == "rq":
        from .rq import publisher as rq_publisher

        return rq_publisher(app)
    if kind == "dramatiq":
        from .dramatiq import publisher as dramatiq_publisher

        return dramatiq_publisher(app)
    raise AssertionError(kind)  # pragma: no cover


class _Progress:
    """A rich progress line on stderr: with ``--once``, the drain against the backlog it
    started with; in loop mode (on a terminal), the rows relayed so far. Without rich, a
    plain line per batch (``--once`` only)."""

    def __init__(self, backlog: int | None, enabled: bool) -> None:
        self.enabled = enabled
        self.bar: Any = None
        self.task: Any = None
        if not enabled:
            return
        try:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )
        except ModuleNotFoundError:
            return
        self.bar = Progress(
            TextColumn("relaying"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
        )
        total = None if backlog is None else max(backlog, 1)
        self.task = self.bar.add_task("relay", total=total, detail="")
        self.bar.start()

    def update(self, counts: Any, totals: Any) -> None:
        if not self.enabled:
            return
        detail = f"failed {totals.failed}" if totals.failed else ""
        if totals.dead:
            detail += f" dead {totals.dead}"
        if self.bar is None:
            print(f"published {totals.published}, failed {totals.failed}", file=sys.stderr)
            return
        total = self.bar.tasks[0].total
        if total is not None:
            total = max(total, totals.published)
        self.bar.update(self.task, completed=totals.published, total=total, detail=detail)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _progress(args: argparse.Namespace, backlog: int) -> _Progress:
    if args.once:
        return _Progress(backlog, not args.quiet)
    return _Progress(None, not args.quiet and sys.stderr.isatty())


def _summary(totals: Any, backlog: Any) -> str:
    return (
        f"published {totals.published} row(s), marked {totals.marked}, failed {totals.failed},"
        f" held back {totals.held}, dead {totals.dead}; {backlog.pending} pending (oldest"
        f" {backlog.oldest_age:.1f}s), {backlog.dead} dead in all"
    )


def _logging(level: str) -> None:
    import logging

    log = logging.getLogger("fencing.relay")
    log.setLevel(level.upper())
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        log.addHandler(handler)
        log.propagate = False


def _describe_app(app: Any) -> str:
    """What the relay publishes with, for its start line (no secrets: no broker URL)."""
    main = getattr(app, "main", None)  # a Celery app's name
    kind = type(app).__name__
    return f"{kind} {main!r}" if isinstance(main, str) and main else kind


def _started(args: argparse.Namespace, relay: Any, waker: Any, app: Any, url: str) -> None:
    """The start line: what it relays, from where, as whom (stderr, and the log)."""
    import logging

    from .._url import redact_url

    wait = "LISTEN wake-ups" if waker is not None else f"polls every {args.poll:g}s"
    line = (
        f"relay {relay.name} started: {args.queue} rows of {redact_url(url)} through"
        f" {_describe_app(app)}; batches of {args.batch}, claims of {args.ttl:g}s, {wait}"
    )
    if args.metrics_port is not None:
        line += f"; metrics on http://{args.metrics_addr}:{args.metrics_port}/metrics"
    if args.once:
        line += "; --once"
    logging.getLogger("fencing.relay").info(line)
    if not args.quiet:
        print(line, file=sys.stderr, flush=True)


def _metrics(args: argparse.Namespace, store: Any = None) -> tuple[Any, Any]:
    """With ``--metrics-port``: serve the metrics; the relay's counter (its on_batch),
    and the sync store opened for the backlog gauges when ``store`` (the relay's own,
    sync) is not given (the caller closes it)."""
    if args.metrics_port is None:
        return None, None
    import fencing

    from .prometheus import RelayMetrics, serve, watch

    serve(args.metrics_port, args.metrics_addr)
    if store is not None:
        watch(store, label=store.backend.scheme)
        return RelayMetrics(args.queue), None
    gauges = fencing.open(args.url, migrate="check")
    try:
        watch(gauges, label=gauges.backend.scheme)
    except BaseException:
        gauges.close()
        raise
    return RelayMetrics(args.queue), gauges


def _on_batch(progress: _Progress, counter: Any) -> Any:
    if counter is None:
        return progress.update

    def both(counts: Any, totals: Any) -> None:
        counter(counts, totals)
        progress.update(counts, totals)

    return both


def _waker(store: Any, args: argparse.Namespace) -> Any:
    """The store's own wake-ups when it has them (PostgreSQL: ``LISTEN``, its
    ``backend.outbox_waiter``), for a relay that waits (not ``--once``); None: poll."""
    make = getattr(store.backend, "outbox_waiter", None)
    return None if make is None or args.once else make(args.queue)


class _Terminate:
    """SIGTERM stops the relay after the row it is publishing (a relay in loop mode),
    also when it arrives before the relay is made: ``stop()`` takes no lock, so the
    handler cannot deadlock on the thread it interrupts."""

    def __init__(self) -> None:
        self.asked = False
        self.relay: Any = None

    def __call__(self, *_: object) -> None:
        self.asked = True
        if self.relay is not None:
            self.relay.stop()

    def attach(self, relay: Any) -> None:
        self.relay = relay
        if self.asked:
            relay.stop()


def run(args: argparse.Namespace, store: Any = None) -> int:
    """``fencing relay``: on ``store`` (left open) if given, else on ``args.url`` (arq:
    always ``args.url``, opened as an async store)."""
    terminate = _Terminate()
    if args.once:
        return _relay(args, terminate, store)
    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        return _relay(args, terminate, store)
    finally:  # (a relay run in a process that goes on: SIGTERM is the process's again)
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _relay(args: argparse.Namespace, terminate: _Terminate, given: Any = None) -> int:
    _logging(args.log_level)
    app = load_app(args.app)
    if args.queue == "arq":
        return asyncio.run(_run_async(args, app, terminate))
    if given is None:
        import fencing

        with fencing.open(args.url, migrate="check") as opened:
            return _relay_on(args, terminate, app, opened)
    return _relay_on(args, terminate, app, given)


def _relay_on(args: argparse.Namespace, terminate: _Terminate, app: Any, store: Any) -> int:
    from .relay import Relay

    counter, _ = _metrics(args, store)
    waker = _waker(store, args)
    relay = Relay(
        store,
        _publisher(args.queue, app),
        name=args.name,
        batch=args.batch,
        poll=args.poll,
        ttl=args.ttl,
        retention=args.retention,
        dead_after=args.dead_after,
        waker=waker,
    )
    _started(args, relay, waker, app, store.url)
    progress = _progress(args, relay.backlog().pending)
    relay.on_batch = _on_batch(progress, counter)
    try:
        if args.once:
            totals = relay.run_once()
        else:
            terminate.attach(relay)
            try:
                totals = relay.run()
            except KeyboardInterrupt:
                totals = relay.counts
    finally:
        progress.close()
        relay.close()
    backlog = relay.backlog()
    print(_summary(totals, backlog), flush=True)
    return 1 if args.once and totals.failed else 0


async def _arq_publisher(app: Any) -> Any:
    from .arq import publisher as arq_publisher

    if callable(app) and not isinstance(app, type) and not hasattr(app, "host"):
        app = app()
        if inspect.isawaitable(app):
            app = await app
    return arq_publisher(app)


async def _run_async(args: argparse.Namespace, app: Any, terminate: _Terminate) -> int:
    import fencing

    from .relay import AsyncRelay

    store = await fencing.open_async(args.url, migrate="check")
    gauges = None
    try:
        counter, gauges = _metrics(args)
        waker = _waker(store, args)
        relay = AsyncRelay(
            store,
            await _arq_publisher(app),
            name=args.name,
            batch=args.batch,
            poll=args.poll,
            ttl=args.ttl,
            retention=args.retention,
            dead_after=args.dead_after,
            waker=waker,
        )
        _started(args, relay, waker, app, args.url)
        progress = _progress(args, (await relay.backlog()).pending)
        relay.on_batch = _on_batch(progress, counter)
        try:
            if args.once:
                totals = await relay.run_once()
            else:
                loop = asyncio.get_running_loop()
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.add_signal_handler(sig, relay.stop)
                if terminate.asked:  # before the loop's handler was in place
                    relay.stop()
                totals = await relay.run()
        finally:
            progress.close()
            await relay.close()
        backlog = await relay.backlog()
    finally:
        if gauges is not None:
            gauges.close()
        await store.close()
    print(_summary(totals, backlog), flush=True)
    return 1 if args.once and totals.failed else 0
