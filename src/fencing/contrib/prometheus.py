"""Prometheus metrics of fencing's operations (the ``prometheus`` extra): see docs/observability.md.

``enable()`` switches the metrics on in this process (they are off until then, and cost
nothing but one attribute check per operation); ``watch(store)`` adds the gauges of a
store's effects to reconcile and outbox backlog, read when scraped. The workers' helpers
start what the queue's usual way is: :func:`celery_metrics` (Celery's worker signals),
:func:`rq_worker_class` (an RQ worker class), :func:`dramatiq_middleware` (a Dramatiq
middleware), :func:`arq_startup` (an arq ``on_startup``), each serving the metrics over
HTTP on ``port``. Under a forking pool (Celery's prefork, RQ's work horses, Dramatiq's
processes) set ``PROMETHEUS_MULTIPROC_DIR`` (prometheus_client's multiprocess mode) so
that the one endpoint sums what every process counted.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Final

from .._errors import FencingError, InvalidInput, MissingDependency
from .._observe import Event, add_observer, remove_observer

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
    from prometheus_client import start_http_server as _serve
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.multiprocess import MultiProcessCollector
except ModuleNotFoundError as exc:  # pragma: no cover - exercised without the extra
    raise MissingDependency(
        f"fencing.contrib.prometheus needs {exc.name}: pip install 'fencing[prometheus]'"
    ) from exc

__all__ = [
    "Metrics",
    "RelayMetrics",
    "arq_startup",
    "celery_metrics",
    "disable",
    "dramatiq_middleware",
    "enable",
    "rq_worker_class",
    "serve",
    "watch",
]

#: commit and apply latency buckets, in seconds (a local commit is tens of microseconds)
BUCKETS: Final = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)
BUCKETS_MORE: Final = (0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
TIMED: Final = frozenset({"commit", "apply", "lease.acquire", "lease.renew", "lease.release"})


class Metrics:
    """The observer that counts; one per registry (``enable`` makes it).

    No label carries a per-key value: ``collection`` is a collection's or table's name
    (few, chosen in code), and a lease's name (per record by default, ``<name>/<key>``)
    is no label at all: lease series are per store, operation and outcome. Every label
    value comes from a bounded set, so the number of series does not grow with the
    number of records or leases (the full names are in the logs and spans)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.outcomes = Counter(
            "fencing_outcomes",
            "Outcomes of commits and applies, by store, target, outcome kind and, for a"
            " fenced one, why (newer_owner or expired)",
            ["store", "kind", "collection", "operation", "outcome", "fence_reason"],
            registry=registry,
        )
        self.latency = Histogram(
            "fencing_operation_seconds",
            "Latency of commits, applies and lease operations, by store and target"
            " (a lease operation's collection is empty: lease names are per record)",
            ["store", "kind", "collection", "operation"],
            buckets=(*BUCKETS, *BUCKETS_MORE),
            registry=registry,
        )
        self.leases = Counter(
            "fencing_lease_operations",
            "Lease acquisitions, renewals and releases, by what they came to",
            ["store", "operation", "outcome"],
            registry=registry,
        )
        self.waits = Counter(
            "fencing_lease_waits",
            "Times an acquire slept because the lease was held",
            ["store"],
            registry=registry,
        )
        self.fencings = Counter(
            "fencing_fenced_commits",
            "Commits refused because their lease lost to a newer owner (newer_owner) or"
            " ran out with nobody taking over (expired)",
            ["store", "kind", "collection", "fence_reason"],
            registry=registry,
        )
        self._children: dict[tuple[str, ...], tuple[Any, Any, Any]] = {}

    def observe(self, event: Event) -> None:
        # a label set's children are looked up once (``labels()`` checks and locks);
        # keyed by the label values only, so the cache is as bounded as the series
        lease = event.kind == "lease"
        reason = event.fence_reason or ""  # a FenceReason's value: newer_owner or expired
        where = (event.store, event.kind, "" if lease else event.name, event.op, event.outcome)
        children = self._children.get((*where, reason))
        if children is None:
            children = self._children[(*where, reason)] = self._make(*where, reason)
        counter, timer, extra = children
        counter.inc()
        if extra is not None:
            extra.inc(event.waits if lease else 1)
        if timer is not None and event.seconds is not None:
            timer.observe(event.seconds)

    def _make(
        self, store: str, kind: str, name: str, op: str, outcome: str, reason: str
    ) -> tuple[Any, Any, Any]:
        timer = None
        if op in TIMED:
            timer = self.latency.labels(store, kind, name, op)
        if kind == "lease":
            counter = self.leases.labels(store, op, outcome)
            waits = self.waits.labels(store) if op == "lease.acquire" else None
            return counter, timer, waits
        counter = self.outcomes.labels(store, kind, name, op, outcome, reason)
        fenced = None
        if outcome == "fenced":
            fenced = self.fencings.labels(store, kind, name, reason)
        return counter, timer, fenced


_lock = threading.Lock()
_enabled: dict[int, Metrics] = {}


def enable(registry: CollectorRegistry | None = None) -> Metrics:
    """Count fencing's operations into ``registry`` (default: prometheus_client's
    global one) from now on. Idempotent: the same registry gives the same ``Metrics``."""
    registry = REGISTRY if registry is None else registry
    if not isinstance(registry, CollectorRegistry):
        raise InvalidInput(f"registry must be a CollectorRegistry, not {type(registry).__name__}")
    with _lock:
        metrics = _enabled.get(id(registry))
        if metrics is None:
            metrics = _enabled[id(registry)] = Metrics(registry)
        add_observer(metrics)
        return metrics


def disable(registry: CollectorRegistry | None = None) -> None:
    """Stop counting into ``registry`` (its metrics keep their values; ``enable`` again
    resumes them)."""
    registry = REGISTRY if registry is None else registry
    with _lock:
        metrics = _enabled.get(id(registry))
        if metrics is not None:
            remove_observer(metrics)


class _StoreGauges:
    """Read when scraped: a store's effects to reconcile and its outbox backlog."""

    def __init__(self, store: Any, label: str, limit: int) -> None:
        self.store, self.label, self.limit = store, label, limit

    def collect(self) -> Iterator[GaugeMetricFamily]:
        effects = GaugeMetricFamily(
            "fencing_effects_to_reconcile",
            "Effects of intents that ended uncommitted, not yet reconciled (counted up to"
            " the limit watch() was given)",
            labels=["store"],
        )
        pending = GaugeMetricFamily(
            "fencing_outbox_pending", "Outbox rows not yet sent", labels=["store"]
        )
        age = GaugeMetricFamily(
            "fencing_outbox_oldest_age_seconds",
            "Age of the oldest unsent outbox row, by the store's clock",
            labels=["store"],
        )
        dead = GaugeMetricFamily(
            "fencing_outbox_dead",
            "Outbox rows a relay gave up as dead (poison rows: alert on any)",
            labels=["store"],
        )
        superseded = GaugeMetricFamily(
            "fencing_outbox_superseded",
            "Outbox rows a newer send of their key and task superseded (never published),"
            " until pruned like sent rows",
            labels=["store"],
        )
        try:
            effects.add_metric([self.label], len(self.store.effects_to_reconcile(limit=self.limit)))
            yield effects
        except FencingError:
            pass  # a store that cannot say: no sample rather than a failed scrape
        try:
            stats = self.store.outbox.stats()
        except FencingError:
            return  # a store without an outbox (memory, Redis), or not migrated
        pending.add_metric([self.label], stats.pending)
        age.add_metric([self.label], stats.oldest_age)
        dead.add_metric([self.label], stats.dead)
        superseded.add_metric([self.label], stats.superseded)
        yield pending
        yield age
        yield dead
        yield superseded


def watch(
    store: Any,
    *,
    label: str | None = None,
    registry: CollectorRegistry | None = None,
    limit: int = 10_000,
) -> None:
    """Export ``store``'s gauges (a sync ``fencing.Store``): effects to reconcile and
    outbox backlog and age, read from the store on each scrape. ``label`` names it
    (default: its scheme)."""
    from .._store import Store

    if not isinstance(store, Store):
        raise InvalidInput(f"watch() takes a fencing.Store, not {type(store).__name__}")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1_000_000:
        raise InvalidInput(f"limit must be an integer from 1 to 1000000, not {limit!r}")
    registry = REGISTRY if registry is None else registry
    registry.register(_StoreGauges(store, label or store.backend.scheme, limit))


class RelayMetrics:
    """A relay's counters, fed by its ``on_batch`` (``fencing relay --metrics-port``):
    ``fencing_relay_rows_total{queue, result}`` with result ``published`` (the broker
    took it), ``failed`` (a publish raised; the row is tried again), ``lost`` (of the
    published, those whose claim had lapsed: they go out again and the worker answers
    ``Duplicate``), ``held`` (held back behind an earlier row of its key) and ``dead``."""

    RESULTS: Final = ("published", "failed", "lost", "held", "dead")

    def __init__(self, queue: str, registry: CollectorRegistry | None = None) -> None:
        self.queue = queue
        self.rows = Counter(
            "fencing_relay_rows",
            "Outbox rows a relay handled, by result",
            ["queue", "result"],
            registry=REGISTRY if registry is None else registry,
        )
        for result in self.RESULTS:  # every series present from the start, at 0
            self.rows.labels(queue, result)

    def __call__(self, counts: Any, totals: Any = None) -> None:
        for result in self.RESULTS:
            self.rows.labels(self.queue, result).inc(getattr(counts, result))


def serve(port: int, addr: str = "127.0.0.1") -> CollectorRegistry:
    """Enable the metrics and serve them over HTTP on ``addr:port`` (a thread); under
    ``PROMETHEUS_MULTIPROC_DIR`` the endpoint sums every process's files. Returns the
    registry served."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise InvalidInput(f"port must be an integer from 0 to 65535, not {port!r}")
    enable()
    registry: CollectorRegistry = REGISTRY
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    _serve(port, addr=addr, registry=registry)
    return registry


# -- the workers' helpers ---------------------------------------------------------------------
@contextlib.contextmanager
def _signal_handlers_kept() -> Iterator[None]:
    """Every signal handler put back, after, as it was before (main thread only: the
    only thread that can set one)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {s: signal.getsignal(s) for s in signal.valid_signals()}
    try:
        yield
    finally:
        for signum, handler in kept.items():
            if handler is not None and signal.getsignal(signum) != handler:
                signal.signal(signum, handler)


def celery_metrics(app: Any, *, port: int | None = None, addr: str = "127.0.0.1") -> None:
    """Celery: the worker serves the metrics on ``port`` (signal ``worker_init``, in the
    main process) and every pool process counts (``worker_process_init``). With the
    prefork pool set ``PROMETHEUS_MULTIPROC_DIR`` so the main process sees the children's
    counts."""
    from celery import signals

    def on_init(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", app) is not app:
            return  # the signal is global: another app's worker in this process
        if port is None:
            enable()
        else:
            serve(port, addr)

    def on_process_init(sender: Any = None, **_: Any) -> None:
        enable()

    signals.worker_init.connect(on_init, weak=False)
    signals.worker_process_init.connect(on_process_init, weak=False)


def rq_worker_class(base: type[Any] | None = None, *, port: int | None = None) -> type[Any]:
    """RQ: a worker class (``rq worker --worker-class``, or ``rq_worker_class()(...)``)
    that enables the metrics, and serves them on ``port``, before it works. Its work
    horses are forked: set ``PROMETHEUS_MULTIPROC_DIR`` so their counts are kept.
    When ``work()`` returns (a burst worker run in a process that goes on), the signal
    handlers RQ installed for it (SIGINT and SIGTERM's ``request_stop``, a job timeout's
    SIGALRM) are put back as they were: a later Ctrl-C is the process's again."""
    if base is None:
        from rq import Worker

        base = Worker

    class FencingMetricsWorker(base):  # type: ignore[misc, valid-type]
        def work(self, *args: Any, **kwargs: Any) -> Any:
            if port is None:
                enable()
            else:
                serve(port)
            with _signal_handlers_kept():
                return super().work(*args, **kwargs)

    return FencingMetricsWorker


def dramatiq_middleware(*, port: int | None = None) -> Any:
    """Dramatiq: a middleware (``broker.add_middleware(dramatiq_middleware(port=9464))``)
    that enables the metrics in every worker process; the first process to boot serves
    them on ``port`` (set ``PROMETHEUS_MULTIPROC_DIR`` with more than one process)."""
    import dramatiq

    class FencingMetrics(dramatiq.Middleware):
        def after_worker_boot(self, broker: Any, worker: Any) -> None:
            enable()
            if port is not None:
                # another worker process of this dramatiq may serve the port already
                with contextlib.suppress(OSError):
                    serve(port)

    return FencingMetrics()


def arq_startup(
    *, port: int | None = None, then: Callable[[dict[str, Any]], Awaitable[None]] | None = None
) -> Callable[[dict[str, Any]], Awaitable[None]]:
    """arq: an ``on_startup`` for ``WorkerSettings`` that enables the metrics and serves
    them on ``port``; ``then`` is your own ``on_startup``, run after."""

    async def on_startup(ctx: dict[str, Any]) -> None:
        if port is None:
            enable()
        else:
            serve(port)
        if then is not None:
            await then(ctx)

    return on_startup
