"""RQ: ``@fenced_job(target=...)`` makes ``decide`` a job function; ``enqueue_intent`` sends it.

::

    from fencing.contrib.rq import enqueue_intent, fenced_job

    @fenced_job(target=lambda: open_store().collection("orders"))
    def ship(record):
        return {**record.state, "status": "shipped"}

    enqueue_intent(Queue("orders", connection=redis), ship, orders.get("o-1"), "ship")

The job function takes one argument, the payload (the intent's JSON, or a signed
token), and is importable by its module path like any RQ job. What it does with
each outcome:

- stale, fenced, contended, missing: the job *finishes*, its result records it;
  never retried;
- ``TransientStoreError`` / ``LeaseHeld`` / a ``retry_on`` error: the job returns an
  ``rq.Retry``, RQ's own way for a job to ask to run again, bounded by
  ``max_retries``, same job, same payload (run workers ``--with-scheduler`` for the
  backoff intervals);
- an unsigned, tampered or malformed message, an exception of ``decide``, or a
  retryable error once the retries are used up: the job fails and is not retried
  (its ``retries_left`` is set to 0 first).

``enqueue_intent`` enqueues with ``retry=Retry(max=crash_retries)``: that is how RQ
re-runs a job whose work horse was killed (SIGKILL, OOM) or that a dead worker
abandoned; the re-run reports ``Duplicate`` if the commit had landed.

Through the transactional outbox: ``store.using(conn).outbox.send(ship, record, "ship",
queue="orders", job_timeout=60)`` writes the job in your transaction (``queue`` is the
queue's name, default the publisher's; ``crash_retries`` as above; the other options
are ``Queue.enqueue``'s: ``job_timeout``, ``result_ttl``, ``ttl``, ``failure_ttl``,
``description``, ``at_front``, ``meta``). A relay (``fencing relay URL --queue rq --app
shop:redis``, or ``Relay(store, publisher(redis))``) enqueues it by its import path,
with a ``job_id`` derived from the row, once committed.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, cast

from .._errors import ConfigurationError, InvalidInput, MissingDependency
from .._outbox import OutboxRow
from .._values import Intent, Record
from ._common import (
    Action,
    Backoff,
    Decision,
    FencedTask,
    LeaseSpec,
    OutcomeHook,
    Step,
    TargetSource,
    TaskReport,
    TransactionSource,
    aeffect,
    current_intent,
    current_lease,
    current_target,
    effect,
    publish_id,
)

try:
    from redis import Redis
    from rq import Queue, Retry, get_current_job
    from rq.job import Job
except ModuleNotFoundError as exc:  # pragma: no cover - exercised without the extra
    raise MissingDependency(
        f"fencing.contrib.rq needs {exc.name}: pip install 'fencing[rq]'"
    ) from exc

if TYPE_CHECKING:
    from .._policy import StalePolicy
    from .._signing import Signer

__all__ = [
    "Backoff",
    "FencedJob",
    "LeaseSpec",
    "RQPublisher",
    "Step",
    "TaskReport",
    "aeffect",
    "current_intent",
    "current_lease",
    "current_target",
    "effect",
    "enqueue_intent",
    "fenced_job",
    "publisher",
]

#: ``Queue.enqueue`` options an outbox row may carry (besides ``queue``, ``crash_retries``).
OUTBOX_OPTIONS = frozenset(
    {"job_timeout", "result_ttl", "ttl", "failure_ttl", "description", "at_front", "meta"}
)


class FencedJob(Protocol):
    """A fenced RQ job function: ``job(payload)``, with its spec as ``job.fencing``."""

    fencing: FencedTask
    __name__: str
    __qualname__: str
    __module__: str

    def __call__(self, payload: str) -> dict[str, Any] | Retry: ...


def _intervals(spec: FencedTask) -> list[int]:
    # RQ schedules retries in whole seconds; never 0, which would mean "now".
    return [max(1, math.ceil(spec.retry_delay(n))) for n in range(1, spec.max_retries + 1)]


def fenced_job(
    *,
    target: TargetSource,
    on_stale: StalePolicy | None = None,
    lease: LeaseSpec | None = None,
    signer: Signer | None = None,
    max_retries: int = 5,
    backoff: Backoff | None = None,
    retry_on: tuple[type[Exception], ...] = (),
    on_outcome: OutcomeHook | None = None,
    transaction: TransactionSource | None = None,
    then: Callable[[Step], Any] | None = None,
    supersede: bool | None = None,
    debounce: float | None = None,
    max_wait: float | None = None,
    name: str | None = None,
) -> Callable[[Decision], FencedJob]:
    """Decorate ``decide(record) -> new state | SKIP`` into a fenced RQ job function.

    Define it at module level: RQ imports it by ``module.name`` in the work horse.
    ``target`` is a sync ``Collection`` or ``Table`` or a function returning one,
    called once per process (each forked work horse opens its own store).
    """

    def decorate(decide: Decision) -> FencedJob:
        qualname = getattr(decide, "__qualname__", decide.__name__)
        spec = FencedTask(
            name=name or f"{decide.__module__}.{qualname}",
            target=target,
            decide=decide,
            on_stale=on_stale,
            lease=lease,
            signer=signer,
            max_retries=max_retries,
            backoff=backoff,
            retry_on=retry_on,
            on_outcome=on_outcome,
            transaction=transaction,
            then=then,
            supersede=supersede,
            debounce=debounce,
            max_wait=max_wait,
        )

        def job(payload: str) -> dict[str, Any] | Retry:
            current = get_current_job()
            attempt = 1 + (current.number_of_retries or 0) if current is not None else 1
            report = spec.run(payload, attempt=attempt)
            if report.action is Action.RETRY:
                return Retry(max=spec.max_retries, interval=_intervals(spec))
            if report.action in (Action.REFUSE, Action.FAIL):
                if current is not None:
                    current.retries_left = 0  # a refused or failed run is never re-run
                assert report.error is not None
                raise report.error
            return report.to_dict()

        job.__name__ = decide.__name__
        job.__qualname__ = qualname
        job.__module__ = decide.__module__
        job.__doc__ = decide.__doc__
        fenced = cast(FencedJob, job)
        fenced.fencing = spec
        spec.outbox_route = _outbox_route
        return fenced

    return decorate


def _check_importable(job: FencedJob) -> None:
    """RQ's worker imports ``module.qualname``: that must be this job, not something else."""
    found: object = sys.modules.get(job.__module__)
    for part in job.__qualname__.split("."):
        found = getattr(found, part, None)
    if found is not job:
        raise ConfigurationError(
            f"RQ will import {job.__module__}.{job.__qualname__}, which is not this fenced job:"
            " apply @fenced_job where the function is defined, at module level"
        )


def enqueue_intent(
    queue: Queue,
    job: FencedJob,
    what: Record | Intent,
    transition: str | None = None,
    *,
    guard: Any = None,
    crash_retries: int = 3,
    **enqueue_options: Any,
) -> Job:
    """Enqueue ``job`` with the intent of ``what`` (or ``what`` itself) as its payload.

    ``crash_retries`` is how many times RQ re-runs the job if its work horse dies or
    its worker is lost (0: never); ``enqueue_options`` go to ``Queue.enqueue``
    (``job_timeout``, ``result_ttl``, ...).
    """
    spec = getattr(job, "fencing", None)
    if not isinstance(spec, FencedTask):
        raise ConfigurationError("enqueue_intent needs a job made by @fenced_job")
    _check_importable(job)
    _check_crash_retries(crash_retries)
    payload = spec.encode(what, transition, guard=guard)
    retry = Retry(max=crash_retries) if crash_retries else None
    return queue.enqueue(job, payload, retry=retry, **enqueue_options)


def _check_crash_retries(crash_retries: object) -> int:
    if isinstance(crash_retries, bool) or not isinstance(crash_retries, int) or crash_retries < 0:
        raise ConfigurationError("crash_retries must be a non-negative integer")
    return crash_retries


def _outbox_route(job: Any, options: dict[str, Any]) -> tuple[str, str, str | None, dict[str, Any]]:
    _check_importable(job)
    queue = options.pop("queue", None)
    if queue is not None and not isinstance(queue, str):
        raise InvalidInput("an outbox message's RQ queue is a queue name (a string)")
    try:
        options["crash_retries"] = _check_crash_retries(options.get("crash_retries", 3))
    except ConfigurationError as exc:
        raise InvalidInput(str(exc)) from None
    unknown = set(options) - OUTBOX_OPTIONS - {"crash_retries"}
    if unknown:
        raise InvalidInput(
            f"RQ outbox options are queue, crash_retries and {sorted(OUTBOX_OPTIONS)};"
            f" not {sorted(unknown)}"
        )
    return "rq", f"{job.__module__}.{job.__qualname__}", queue, options


class RQPublisher:
    """Enqueues outbox rows of RQ jobs by their import path (the relay's side): the
    payload as the one argument, ``retry=Retry(max=crash_retries)``, the stored
    ``Queue.enqueue`` options, and a ``job_id`` derived from the row."""

    kind = "rq"

    def __init__(self, connection: Redis, default_queue: str = "default") -> None:
        self.connection = connection
        self.default_queue = default_queue
        self._queues: dict[str, Queue] = {}

    def __repr__(self) -> str:
        return f"<RQPublisher default queue {self.default_queue!r}>"

    def _queue(self, name: str | None) -> Queue:
        name = name or self.default_queue
        queue = self._queues.get(name)
        if queue is None:
            queue = self._queues[name] = Queue(name, connection=self.connection)
        return queue

    def publish(self, row: OutboxRow) -> None:
        options = dict(row.options)
        retries = _check_crash_retries(options.pop("crash_retries", 3))
        retry = Retry(max=retries) if retries else None
        self._queue(row.queue).enqueue(
            row.task, row.payload, retry=retry, job_id=publish_id(row), **options
        )

    def close(self) -> None:
        pass


def publisher(connection: Redis | Queue, default_queue: str | None = None) -> RQPublisher:
    """The relay's publisher for RQ: a Redis connection (rows go to their ``queue``, or
    ``default_queue``, default "default"), or an RQ ``Queue`` (its connection; its name
    is the default queue)."""
    if isinstance(connection, Queue):
        return RQPublisher(connection.connection, default_queue or connection.name)
    return RQPublisher(connection, default_queue or "default")
