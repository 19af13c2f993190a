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
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, cast

from .._errors import ConfigurationError, MissingDependency
from .._values import Intent, Record
from ._common import (
    Action,
    Backoff,
    Decision,
    FencedTask,
    LeaseSpec,
    OutcomeHook,
    TargetSource,
    TaskReport,
    aeffect,
    current_intent,
    current_target,
    effect,
)

try:
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
    "TaskReport",
    "aeffect",
    "current_intent",
    "current_target",
    "effect",
    "enqueue_intent",
    "fenced_job",
]


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
    if isinstance(crash_retries, bool) or not isinstance(crash_retries, int) or crash_retries < 0:
        raise ConfigurationError("crash_retries must be a non-negative integer")
    payload = spec.encode(what, transition, guard=guard)
    retry = Retry(max=crash_retries) if crash_retries else None
    return queue.enqueue(job, payload, retry=retry, **enqueue_options)
