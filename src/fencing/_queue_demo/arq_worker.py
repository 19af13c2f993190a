"""The queue demo on arq: ``arq fencing._queue_demo.arq_worker.WorkerSettings``, N of them.

The fenced functions run ``FencedTask.arun`` against an async store; the naive one
runs the same synchronous naive worker as the other queues, in a thread. No crash
here: arq runs a killed worker's job again only once its "in progress" key has
expired (the job's timeout plus 10 s); the demo's crash-after-commit is left out.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from typing import Any, ClassVar, Final

from ..contrib.arq import FencedFunction, enqueue_intent, fenced_function
from . import _tasks
from ._tasks import KINDS, Settings

NAME: Final = "arq"
CRASH: Final = False
BROKERS: Final = ("redis", "rediss")
JOB_TIMEOUT: Final = 60.0

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
    return [*FENCED.values(), naive_fn]


def _redis_settings(url: str) -> Any:
    from arq.connections import RedisSettings

    return RedisSettings.from_dsn(url)


async def _shutdown(ctx: dict[str, Any]) -> None:
    _tasks.close()


class WorkerSettings:
    """arq's worker settings, from the environment the demo sets."""

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
        argv = [sys.executable, "-m", "arq", f"{__name__}.WorkerSettings"]
        return [list(argv) for _ in range(workers)]

    def send(self, mode: str, kind: str, leased: bool, intent: Any) -> None:
        if mode == "fencing":
            job = enqueue_intent(self.pool, FENCED[(kind, leased)], intent, _job_id=self._job_id())
            self.loop.run_until_complete(job)
        else:
            self._naive(intent.to_json())

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
        from ._broker import redis_delete

        s = self.settings
        redis_delete(s.broker, [f"*{s.prefix}*"])
