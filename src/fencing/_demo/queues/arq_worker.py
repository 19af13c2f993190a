"""The queue demo on arq: N worker processes, each an arq ``Worker`` (:func:`main`).

The fenced functions run ``FencedTask.arun`` against an async store; the naive one
runs the same synchronous naive worker as the other queues, in a thread.

The crash after commit is real here. arq leaves a job in its queue until the job
ends; the worker that starts it sets the job's "in progress" key
(``Worker.start_jobs``: ``psetex(in_progress_key, in_progress_timeout_s)``), and
every worker skips a job whose key exists. A worker SIGKILLed mid-job leaves the
key behind, so once it expires any worker runs the job again, with ``job_try`` + 1
(counted in ``max_tries``): the fencing run's re-run reports ``Duplicate``. arq
computes that lifetime in ``Worker.__init__`` as the longest function timeout of
the worker plus 10 s (``in_progress_timeout_s``, not a setting): 70 s with a
60 s timeout. The demo's processes run :class:`DemoWorker`, arq's ``Worker`` with
the lifetime cut to ``JOB_TIMEOUT + IN_PROGRESS_MARGIN``, so a killed job runs
again within seconds; ``JOB_TIMEOUT`` stays well above the demo's longest job (a
pause of at most 1.2 s, a lease wait of at most 2 s). Each process is one arq
worker running one job at a time, so the crash kills that whole worker; the demo
starts a new process in its place (``processes.Workers.check``).
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from typing import Any, ClassVar, Final

from ...contrib.arq import FencedFunction, enqueue_intent, fenced_function
from . import _chain, _tasks
from ._broker import redis_delete
from ._tasks import KINDS, Settings

NAME: Final = "arq"
#: A job whose worker died runs again once its in-progress key expired: the crash is real.
CRASH: Final = True
BROKERS: Final = ("redis", "rediss")
#: Every demo job's timeout (seconds): its longest job waits 2 s for a lease, or pauses 1.2 s.
JOB_TIMEOUT: Final = 5.0
#: A started job's in-progress key outlives the job's timeout by this (arq's own: 10 s).
IN_PROGRESS_MARGIN: Final = 1.0
#: How the job comes back, for the demo's summary.
REDELIVERY: Final = (
    "arq runs its job again once the job's in-progress key expired,"
    f" {JOB_TIMEOUT + IN_PROGRESS_MARGIN:g}s after it began"
)

FENCED: Final[dict[tuple[str, bool], FencedFunction]] = {
    (kind, leased): fenced_function(
        target=_tasks.atarget(kind),
        name=_tasks.task_name(kind, leased),
        on_stale=_tasks.policy(kind),
        lease=_tasks.LEASE if leased else None,
        max_retries=_tasks.MAX_RETRIES,
        backoff=_tasks.BACKOFF,
        on_outcome=_tasks.on_outcome,
        timeout=JOB_TIMEOUT,
        keep_result=30,
    )(_tasks.DECIDE[kind])
    for kind in KINDS
    for leased in (False, True)
}
NAIVE: Final = "fencing_demo.naive"
#: The chain demo's functions (``--chain``) by (step, mode).
CHAIN: Final[dict[tuple[str, str], FencedFunction]] = {
    (step, mode): fenced_function(
        name=_chain.task_name(step, mode),
        timeout=JOB_TIMEOUT,
        keep_result=30,
        **_chain.options(step, mode, asynchronous=True),
    )(_chain.DECIDE[step])
    for step in _chain.STEPS
    for mode in _chain.MODES
}
_pools: dict[int, Any] = {}


async def _chain_send(function: FencedFunction, intent: Any) -> None:
    """The naive run's direct enqueue of notify, from a worker (its own pool)."""
    from arq import create_pool

    s = _tasks.settings()
    pool = _pools.get(os.getpid())
    if pool is None:
        pool = await create_pool(_redis_settings(s.broker), default_queue_name=s.queue)
        _pools[os.getpid()] = pool
    await enqueue_intent(pool, function, intent, _job_id=f"{s.prefix}-{uuid.uuid4().hex}")


_chain.register(
    {mode: CHAIN[("notify", mode)] for mode in _chain.MODES},
    _chain_send,
    _queue_name=os.environ.get(_tasks.ENV_PREFIX + "QUEUE", "fencing-demo"),
)


async def naive(ctx: dict[str, Any], payload: str) -> str:
    from arq.worker import Retry

    attempt = ctx.get("job_try", 1)
    try:
        return await asyncio.to_thread(_tasks.run_naive, payload, attempt)
    except _tasks.DemoRetry:
        raise Retry(defer=_tasks.BACKOFF.delay(attempt)) from None


def _functions() -> list[Any]:
    from arq.worker import func

    naive_fn = func(naive, name=NAIVE, timeout=JOB_TIMEOUT, max_tries=_tasks.MAX_RETRIES)
    return [*FENCED.values(), *CHAIN.values(), naive_fn]


def _redis_settings(url: str) -> Any:
    from arq.connections import RedisSettings

    return RedisSettings.from_dsn(url)


async def _shutdown(ctx: dict[str, Any]) -> None:
    _tasks.close()


class WorkerSettings:
    """arq's worker settings, from the environment the demo sets (see :func:`main`)."""

    functions: ClassVar[list[Any]] = _functions()
    redis_settings = _redis_settings(
        os.environ.get(_tasks.ENV_PREFIX + "BROKER", "redis://127.0.0.1:6379/10")
    )
    queue_name = os.environ.get(_tasks.ENV_PREFIX + "QUEUE", "fencing-demo")
    job_timeout = JOB_TIMEOUT
    keep_result = 30
    max_jobs = 1  # one job at a time per worker process, as on the other queues
    poll_delay = 0.02
    handle_signals = True
    on_shutdown = _shutdown


def _worker_class() -> type[Any]:
    from arq.worker import Worker

    class DemoWorker(Worker):
        """arq's ``Worker``: a killed worker's job runs again soon after its timeout."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # arq sets this to the longest function timeout + 10 s, with no setting for it
            # (python-arq/arq#407); every demo job has JOB_TIMEOUT, so this margin is arq's
            # with 10 s cut to IN_PROGRESS_MARGIN: a live job is cancelled at its timeout, and
            # its key deleted, before the key could expire under it.
            if not hasattr(self, "in_progress_timeout_s"):  # pragma: no cover - another arq
                raise RuntimeError("arq.worker.Worker has no in_progress_timeout_s")
            self.in_progress_timeout_s = JOB_TIMEOUT + IN_PROGRESS_MARGIN

    return DemoWorker


def main() -> None:
    """One worker process: ``arq WorkerSettings`` as the CLI runs it, on :class:`DemoWorker`.

    The demo starts N of these and replaces one the crash killed. Not the ``arq`` command:
    it cannot run a ``Worker`` subclass.
    """
    import logging.config

    from arq.logs import default_log_config
    from arq.worker import get_kwargs

    logging.config.dictConfig(default_log_config(verbose=False))
    _worker_class()(**get_kwargs(dict(vars(WorkerSettings)))).run()


def broker_errors() -> tuple[type[Exception], ...]:
    import redis

    return (redis.RedisError, OSError)


class Sender:
    def __init__(self, settings: Settings) -> None:
        from arq import create_pool

        self.settings = settings
        self.loop = asyncio.new_event_loop()
        self.pool = self.loop.run_until_complete(
            create_pool(_redis_settings(settings.broker), default_queue_name=settings.queue)
        )

    def _job_id(self) -> str:
        return f"{self.settings.prefix}-{uuid.uuid4().hex}"

    def commands(self, workers: int) -> list[list[str]]:
        argv = [sys.executable, "-c", f"from {__name__} import main; main()"]
        return [list(argv) for _ in range(workers)]

    def send(self, mode: str, kind: str, leased: bool, intent: Any) -> None:
        if mode == "fencing":
            job = enqueue_intent(self.pool, FENCED[(kind, leased)], intent, _job_id=self._job_id())
            self.loop.run_until_complete(job)
        else:
            self._naive(intent.to_json())

    def send_chain(self, step: str, mode: str, intent: Any) -> None:
        job = enqueue_intent(self.pool, CHAIN[(step, mode)], intent, _job_id=self._job_id())
        self.loop.run_until_complete(job)

    def _naive(self, payload: str) -> None:
        self.loop.run_until_complete(self.pool.enqueue_job(NAIVE, payload, _job_id=self._job_id()))

    def ping(self, token: str) -> None:
        self._naive(_tasks.PING + token)

    def close(self) -> None:
        try:
            self.loop.run_until_complete(self.pool.aclose())
        finally:
            self.loop.close()

    def cleanup(self) -> None:
        s = self.settings
        redis_delete(s.broker, [f"*{s.prefix}*"])
