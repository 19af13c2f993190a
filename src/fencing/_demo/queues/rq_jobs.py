"""The queue demo on RQ: ``rq worker --with-scheduler <queue>``, N of them.

The job functions are module attributes, imported by name in each forked work horse.
A work horse killed after its commit fails its job with ``Retry(max=...)`` left, and
RQ runs it again: the crash is real here.
"""

from __future__ import annotations

import sys
import uuid
from typing import Any, Final

import fencing

from ...contrib.rq import enqueue_intent, fenced_job  # MissingDependency without the extra
from . import _chain, _tasks
from ._broker import redis_delete
from ._tasks import Settings

NAME: Final = "rq"
CRASH: Final = True
#: How the message comes back, for the demo's summary.
REDELIVERY: Final = "RQ runs its job again (Retry)"
BROKERS: Final = ("redis", "rediss")
CRASH_RETRIES: Final = 3

_common: dict[str, Any] = {
    "max_retries": _tasks.MAX_RETRIES,
    "backoff": _tasks.BACKOFF,
    "on_outcome": _tasks.on_outcome,
}


@fenced_job(
    target=_tasks.target("accounts"),
    on_stale=_tasks.policy("accounts"),
    name=_tasks.task_name("accounts", False),
    **_common,
)
def credit(record: fencing.Record) -> Any:
    return _tasks.decide_credit(record)


@fenced_job(
    target=_tasks.target("accounts"),
    on_stale=_tasks.policy("accounts"),
    lease=_tasks.LEASE,
    name=_tasks.task_name("accounts", True),
    **_common,
)
def credit_leased(record: fencing.Record) -> Any:
    return _tasks.decide_credit(record)


@fenced_job(
    target=_tasks.target("orders"),
    on_stale=_tasks.policy("orders"),
    name=_tasks.task_name("orders", False),
    **_common,
)
def order(record: fencing.Record) -> Any:
    return _tasks.decide_order(record)


@fenced_job(
    target=_tasks.target("orders"),
    on_stale=_tasks.policy("orders"),
    lease=_tasks.LEASE,
    name=_tasks.task_name("orders", True),
    **_common,
)
def order_leased(record: fencing.Record) -> Any:
    return _tasks.decide_order(record)


FENCED: Final = {
    ("accounts", False): credit,
    ("accounts", True): credit_leased,
    ("orders", False): order,
    ("orders", True): order_leased,
}


# -- the chain demo (``--chain``): ship and notify, per run -------------------------------
@fenced_job(name=_chain.task_name("ship", "naive"), **_chain.options("ship", "naive"))
def ship_naive(record: fencing.Record) -> Any:
    return _chain.decide_ship(record)


@fenced_job(name=_chain.task_name("ship", "chain"), **_chain.options("ship", "chain"))
def ship_chain(record: fencing.Record) -> Any:
    return _chain.decide_ship(record)


@fenced_job(name=_chain.task_name("notify", "naive"), **_chain.options("notify", "naive"))
def notify_naive(record: fencing.Record) -> Any:
    return _chain.decide_notify(record)


@fenced_job(name=_chain.task_name("notify", "chain"), **_chain.options("notify", "chain"))
def notify_chain(record: fencing.Record) -> Any:
    return _chain.decide_notify(record)


CHAIN: Final = {
    ("ship", "naive"): ship_naive,
    ("ship", "chain"): ship_chain,
    ("notify", "naive"): notify_naive,
    ("notify", "chain"): notify_chain,
}
_queues: dict[int, Any] = {}


def _chain_send(job: Any, intent: Any) -> None:
    """The naive run's direct enqueue of notify, from a work horse."""
    import os

    import redis
    from rq import Queue

    queue = _queues.get(os.getpid())
    if queue is None:
        s = _tasks.settings()
        queue = _queues[os.getpid()] = Queue(s.queue, connection=redis.Redis.from_url(s.broker))
    job_id = f"{_tasks.settings().prefix}-{uuid.uuid4().hex}"
    enqueue_intent(queue, job, intent, crash_retries=CRASH_RETRIES, job_id=job_id)


_chain.register({mode: CHAIN[("notify", mode)] for mode in _chain.MODES}, _chain_send)


def _preloaded_worker() -> type:
    """``rq.Worker``, named from this module, so the worker imports it before forking."""
    from rq import Worker

    return Worker


#: ``rq worker --worker-class`` names this: the parent imports the module (and fencing)
#: once, and every forked work horse starts with it loaded.
Worker: Final = _preloaded_worker()


def naive(payload: str) -> Any:
    from rq import Retry, get_current_job

    job = get_current_job()
    attempt = 1 + (job.number_of_retries or 0) if job is not None else 1
    try:
        return _tasks.run_naive(payload, attempt)
    except _tasks.DemoRetry:
        return Retry(max=_tasks.MAX_RETRIES, interval=1)


def broker_errors() -> tuple[type[Exception], ...]:
    import redis

    return (redis.RedisError, OSError)


class Sender:
    def __init__(self, settings: Settings) -> None:
        import redis
        from rq import Queue

        self.settings = settings
        self.redis = redis.Redis.from_url(settings.broker)
        self.queue = Queue(settings.queue, connection=self.redis)
        self.names: list[str] = []

    def _job_id(self) -> str:
        return f"{self.settings.prefix}-{uuid.uuid4().hex}"

    def commands(self, workers: int) -> list[list[str]]:
        run = "import sys; from rq.cli import main; sys.argv[0] = 'rq'; main()"
        commands = []
        for n in range(1, workers + 1):
            name = f"{self.settings.prefix}-w{n}"
            self.names.append(name)
            argv = [sys.executable, "-c", run, "worker", "--url", self.settings.broker]
            argv += ["--with-scheduler", "--name", name, "--logging_level", "WARNING"]
            argv += ["--worker-class", f"{__name__}.Worker"]
            commands.append([*argv, self.settings.queue])
        return commands

    def send(self, mode: str, kind: str, leased: bool, intent: Any) -> None:
        if mode == "fencing":
            enqueue_intent(
                self.queue,
                FENCED[(kind, leased)],
                intent,
                crash_retries=CRASH_RETRIES,
                job_id=self._job_id(),
            )
        else:
            self._naive(intent.to_json())

    def send_chain(self, step: str, mode: str, intent: Any) -> None:
        job = CHAIN[(step, mode)]
        enqueue_intent(self.queue, job, intent, crash_retries=CRASH_RETRIES, job_id=self._job_id())

    def _naive(self, payload: str) -> None:
        from rq import Retry

        self.queue.enqueue(naive, payload, retry=Retry(max=CRASH_RETRIES), job_id=self._job_id())

    def ping(self, token: str) -> None:
        self._naive(_tasks.PING + token)

    def close(self) -> None:
        self.redis.close()

    def cleanup(self) -> None:
        s = self.settings
        redis_delete(
            s.broker,
            [f"*{s.prefix}*"],
            {
                "rq:queues": [f"rq:queue:{s.queue}"],
                "rq:workers": [f"rq:worker:{name}" for name in self.names],
            },
        )
