"""The queue demo on Dramatiq: ``dramatiq fencing._queue_demo.dramatiq_actors:broker``.

No crash here: Dramatiq's main process stops every worker when one of them dies, and
the Redis broker gives a dead worker's messages back only after its heartbeat
timeout; the demo's crash-after-commit is left out on this queue.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Final

from ..contrib.dramatiq import fenced_actor  # MissingDependency without the extra
from . import _tasks
from ._tasks import KINDS, Settings

if TYPE_CHECKING:
    import dramatiq as _dramatiq

NAME: Final = "dramatiq"
CRASH: Final = False
BROKERS: Final = ("redis", "rediss", "amqp")


def make_broker(settings: Settings) -> _dramatiq.Broker:
    from dramatiq.middleware import CurrentMessage

    broker: _dramatiq.Broker
    if settings.broker.startswith("redis"):
        from dramatiq.brokers.redis import RedisBroker

        broker = RedisBroker(url=settings.broker, namespace=settings.prefix)  # type: ignore[no-untyped-call]
    else:
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        broker = RabbitmqBroker(url=amqp_url(settings.broker))
    broker.add_middleware(CurrentMessage())
    return broker


def _attempt() -> int:
    from dramatiq.middleware import CurrentMessage

    message = CurrentMessage.get_current_message()
    retries = message.options.get("retries", 0) if message is not None else 0
    return retries + 1 if isinstance(retries, int) else 1


def naive(payload: str) -> str:
    return _tasks.run_naive(payload, _attempt())


def _retry_naive(retries: int, exc: BaseException) -> bool:
    return isinstance(exc, _tasks.DemoRetry) and retries < _tasks.MAX_RETRIES


def build(broker: _dramatiq.Broker, settings: Settings) -> tuple[dict[tuple[str, bool], Any], Any]:
    """The fenced actors by (kind, leased), and the naive actor, on ``broker``."""
    import dramatiq

    fenced = {
        (kind, leased): fenced_actor(
            target=_tasks.target(kind),
            broker=broker,
            actor_name=_tasks.task_name(kind, leased).replace(".", "_"),
            queue_name=settings.queue,
            on_stale=_tasks.policy(kind),
            lease=_tasks.LEASE if leased else None,
            max_retries=_tasks.MAX_RETRIES,
            backoff=_tasks.BACKOFF,
            on_outcome=_tasks.on_outcome,
        )(_tasks.DECIDE[kind])
        for kind in KINDS
        for leased in (False, True)
    }
    naive_actor = dramatiq.actor(
        broker=broker,
        queue_name=settings.queue,
        actor_name="fencing_demo_naive",
        max_retries=_tasks.MAX_RETRIES,
        retry_when=_retry_naive,
        min_backoff=int(_tasks.BACKOFF.base * 1000),
        max_backoff=int(_tasks.BACKOFF.cap * 1000),
    )(naive)
    return fenced, naive_actor


def broker_errors() -> tuple[type[Exception], ...]:
    import redis
    from dramatiq.errors import BrokerError

    return (BrokerError, redis.RedisError, OSError)


def amqp_url(url: str) -> str:
    """``amqp://host//`` names the vhost "/" (as Celery reads it); pika needs ``/%2F``."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/%2F")) if parts.path == "//" else url


class Sender:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.broker = make_broker(settings)
        self.fenced, self.naive = build(self.broker, settings)

    def commands(self, workers: int) -> list[list[str]]:
        argv = [sys.executable, "-m", "dramatiq", f"{__name__}:broker"]
        argv += ["--processes", str(workers), "--threads", "1", "--queues", self.settings.queue]
        return [argv]

    def env(self) -> dict[str, str]:
        return {"dramatiq_queue_prefetch": "1"}

    def send(self, mode: str, kind: str, leased: bool, intent: Any) -> None:
        if mode == "fencing":
            self.fenced[(kind, leased)].enqueue(intent)
        else:
            self.naive.send(intent.to_json())

    def ping(self, token: str) -> None:
        self.naive.send(_tasks.PING + token)

    def close(self) -> None:
        self.broker.close()

    def cleanup(self) -> None:
        s = self.settings
        if s.broker.startswith("redis"):
            from ._broker import redis_delete

            redis_delete(s.broker, [f"{s.prefix}*"])
            return
        import pika  # type: ignore[import-untyped]

        connection = pika.BlockingConnection(pika.URLParameters(amqp_url(s.broker)))
        try:
            channel = connection.channel()
            for name in (s.queue, f"{s.queue}.DQ", f"{s.queue}.XQ"):
                channel.queue_delete(queue=name)
        finally:
            connection.close()


if _tasks.in_worker():
    import dramatiq

    broker = make_broker(_tasks.settings())
    dramatiq.set_broker(broker)
    _fenced, _naive = build(broker, _tasks.settings())
