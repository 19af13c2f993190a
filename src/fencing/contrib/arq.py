"""arq: ``@fenced_function(target=...)`` turns ``decide`` into an arq job function.

::

    from fencing.contrib.arq import enqueue_intent, fenced_function

    async def orders():
        return (await fencing.open_async(URL)).collection("orders")

    @fenced_function(target=orders)
    async def ship(record):
        return {**record.state, "status": "shipped"}

    class WorkerSettings:
        functions = [ship]                 # an arq Function, registered by its name

    await enqueue_intent(redis, ship, await collection.get("o-1"), "ship")

The job runs ``FencedTask.arun`` against an async store. A ``TransientStoreError``,
``LeaseHeld`` or ``retry_on`` error raises ``arq.worker.Retry(defer=...)``: arq runs
the same job (same payload) again, bounded by ``max_tries = max_retries + 1``; once
the retries are used up the job fails with the error. Stale, fenced, contended and
missing outcomes are successful jobs whose result records them. An unsigned,
tampered or malformed message, or an exception of ``decide``, fails the job; arq
does not retry a job that raised.

arq keeps a job in its queue until it finishes; a worker killed mid-job leaves an
"in progress" key that expires after the longest function timeout of the worker
plus 10 s (arq's ``in_progress_timeout_s``, not a setting), after which any worker
runs the job again (``job_try`` + 1): a redelivery that reports
``Duplicate`` if the commit had landed.

Through the transactional outbox: ``store.using(conn).outbox.send(ship, record, "ship",
_defer_by=5)`` writes the job in your transaction (options: ``_queue_name``,
``_defer_by`` and ``_expires`` in seconds). An async relay (``fencing relay URL --queue
arq --app shop:redis_settings``, or ``AsyncRelay(store, publisher(pool))``) enqueues it
with ``enqueue_job`` once committed, under a ``_job_id`` derived from the row: arq
drops a re-publish after a relay crash while the job or its result is kept.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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
    from arq.connections import ArqRedis, RedisSettings, create_pool
    from arq.jobs import Job
    from arq.worker import Function, Retry
except ModuleNotFoundError as exc:  # pragma: no cover - exercised without the extra
    raise MissingDependency(
        f"fencing.contrib.arq needs {exc.name}: pip install 'fencing[arq]'"
    ) from exc

if TYPE_CHECKING:
    from .._policy import StalePolicy
    from .._signing import Signer

__all__ = [
    "ArqPublisher",
    "Backoff",
    "FencedFunction",
    "LeaseSpec",
    "Step",
    "TaskReport",
    "aeffect",
    "current_intent",
    "current_lease",
    "current_target",
    "effect",
    "enqueue_intent",
    "fenced_function",
    "publisher",
]

#: ``enqueue_job`` options an outbox row may carry
OUTBOX_OPTIONS = frozenset({"_queue_name", "_defer_by", "_expires"})


@dataclass
class FencedFunction(Function):
    """An arq ``Function`` (put it in ``WorkerSettings.functions``) with its spec."""

    fencing: FencedTask | None = None


def fenced_function(
    *,
    target: TargetSource,
    name: str | None = None,
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
    timeout: float | None = None,
    keep_result: float | None = None,
) -> Callable[[Decision], FencedFunction]:
    """Decorate ``decide(record)`` (sync or async) into a fenced arq job function.

    ``target`` is an ``AsyncCollection`` or ``AsyncTable``, or a function returning
    one (or an awaitable of one), resolved once per worker event loop. ``timeout``
    and ``keep_result`` are arq's per-function settings (seconds; None: the
    worker's defaults).
    """

    def decorate(decide: Decision) -> FencedFunction:
        qualname = getattr(decide, "__qualname__", decide.__name__)
        spec = FencedTask(
            name=name or qualname,
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

        async def job(ctx: dict[str, Any], payload: str) -> dict[str, Any]:
            try_ = ctx.get("job_try", 1)
            attempt = try_ if isinstance(try_, int) and try_ > 0 else 1
            report = await spec.arun(payload, attempt=attempt)
            if report.action is Action.RETRY:
                raise Retry(defer=spec.retry_delay(attempt))
            if report.action in (Action.REFUSE, Action.FAIL):
                assert report.error is not None
                raise report.error
            return report.to_dict()

        job.__name__ = decide.__name__
        job.__qualname__ = qualname
        job.__module__ = decide.__module__
        job.__doc__ = decide.__doc__
        spec.outbox_route = _outbox_route
        return FencedFunction(
            name=spec.name,
            coroutine=job,
            timeout_s=timeout,
            keep_result_s=keep_result,
            keep_result_forever=None,
            max_tries=spec.max_retries + 1,
            fencing=spec,
        )

    return decorate


async def enqueue_intent(
    redis: ArqRedis,
    function: FencedFunction,
    what: Record | Intent,
    transition: str | None = None,
    *,
    guard: Any = None,
    **enqueue_options: Any,
) -> Job | None:
    """Enqueue ``function`` with the intent of ``what`` (or ``what`` itself).

    ``enqueue_options`` go to ``ArqRedis.enqueue_job`` (``_queue_name``,
    ``_defer_by``, ``_job_id``, ...). Passing ``_job_id=intent.id`` makes arq refuse a
    second enqueue of the same intent (it returns None) while the job or its
    result is kept; fencing refuses a second commit of it either way.
    """
    spec = function.fencing if isinstance(function, FencedFunction) else None
    if spec is None:
        raise ConfigurationError("enqueue_intent needs a function made by @fenced_function")
    payload = spec.encode(what, transition, guard=guard)
    return await redis.enqueue_job(function.name, payload, **enqueue_options)


def _outbox_route(
    function: Any, options: dict[str, Any]
) -> tuple[str, str, str | None, dict[str, Any]]:
    unknown = set(options) - OUTBOX_OPTIONS
    if unknown:
        raise InvalidInput(
            f"arq outbox options are {sorted(OUTBOX_OPTIONS)}; not {sorted(unknown)}"
        )
    for name in ("_defer_by", "_expires"):
        value = options.get(name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or value < 0
        ):
            raise InvalidInput(f"{name} is a non-negative number of seconds")
    queue = options.get("_queue_name")
    if queue is not None and not isinstance(queue, str):
        raise InvalidInput("_queue_name is a queue name (a string)")
    return "arq", str(function.name), queue, options


class ArqPublisher:
    """Enqueues outbox rows of arq functions with ``enqueue_job`` (the async relay's
    side), under a ``_job_id`` derived from the row: a job id arq still knows is not
    enqueued again (``enqueue_job`` answers None), which counts as published."""

    kind = "arq"

    def __init__(self, redis: ArqRedis | RedisSettings) -> None:
        self._settings = redis if isinstance(redis, RedisSettings) else None
        self._pool: ArqRedis | None = None if isinstance(redis, RedisSettings) else redis
        self._own = self._pool is None

    def __repr__(self) -> str:
        return "<ArqPublisher>"

    async def pool(self) -> ArqRedis:
        if self._pool is None:
            assert self._settings is not None
            # one try: the relay's own backoff retries a broker that is down
            self._pool = await create_pool(self._settings, retry=0)
        return self._pool

    async def publish(self, row: OutboxRow) -> None:
        pool = await self.pool()
        await pool.enqueue_job(row.task, row.payload, _job_id=publish_id(row), **row.options)

    async def close(self) -> None:
        if self._own and self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.aclose()


def publisher(redis: ArqRedis | RedisSettings) -> ArqPublisher:
    """The relay's publisher for arq: an ``ArqRedis`` pool (``create_pool``'s; its
    ``default_queue_name`` for rows without ``_queue_name``), or ``RedisSettings``
    (the publisher opens its pool and closes it with the relay)."""
    return ArqPublisher(redis)
