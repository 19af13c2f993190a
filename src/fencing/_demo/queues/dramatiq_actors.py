"""The queue demo on Dramatiq: N worker processes, each a ``dramatiq.Worker`` (:func:`main`).

The crash after commit is real here. Dramatiq acknowledges a message after its actor
returns; a worker process SIGKILLed after its commit leaves the message
unacknowledged, and the broker gives it back:

- RabbitMQ requeues a consumer's unacknowledged messages as soon as its channel
  closes, which the killed process's connection does at once.
- The Redis broker keeps a fetched message's id in the fetching process's
  ``__acks__`` set, and every command of every process (``dispatch.lua``) records
  that process's heartbeat; when a command runs maintenance, it puts back on the
  queue the unacknowledged messages of each process whose heartbeat is older than
  ``heartbeat_timeout``. Dramatiq's defaults (60 s, maintenance on 0.1% of the
  commands) would bring the message back after a minute or more; the demo's broker
  (:func:`make_broker`, the same in the demo and in its workers) takes
  ``HEARTBEAT_TIMEOUT`` and runs maintenance on every command. A live worker
  process polls Redis at least once a second whatever it works on (its delay-queue
  consumer, every ``worker_timeout`` at most), so its heartbeat stays fresh; a killed
  one's message is back about 3 s after it died.

The processes are not the ``dramatiq`` command: its main process stops all its worker
processes, and exits, as soon as one dies ("Worker with PID ... exited unexpectedly
... Shutting down"), so a crash would take every worker down. One command per worker
(``--processes 1``) would survive that, but through two processes whose exit status
(1 for a killed child, as for other failures) says less than the demo needs. Each
process here runs what the command's worker process runs (``process_boot``, a
``dramatiq.Worker`` on the run's queue, one thread), is the process the crash
kills, and the demo starts a new one in its place (``processes.Workers.check``).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Final

from ...contrib.dramatiq import fenced_actor  # MissingDependency without the extra
from . import _chain, _tasks
from ._broker import redis_delete
from ._tasks import KINDS, Settings

if TYPE_CHECKING:
    import dramatiq as _dramatiq

NAME: Final = "dramatiq"
#: The message of a worker process killed before its ack comes back: the crash is real.
CRASH: Final = True
BROKERS: Final = ("redis", "rediss", "amqp")
#: Redis broker: a process whose heartbeat is this old (ms) is dead; its messages go back.
HEARTBEAT_TIMEOUT: Final = 3000
#: Redis broker: maintenance (requeueing dead processes' messages) on every command.
MAINTENANCE_CHANCE: Final = 1_000_000
#: How the message comes back, for the demo's summary.
REDELIVERY: Final = (
    "the broker redelivers its unacknowledged message: RabbitMQ at once, Redis once the"
    f" process's heartbeat is {HEARTBEAT_TIMEOUT / 1000:g}s old"
)


def make_broker(settings: Settings) -> _dramatiq.Broker:
    from dramatiq.middleware import CurrentMessage

    broker: _dramatiq.Broker
    if settings.broker.startswith("redis"):
        from dramatiq.brokers.redis import RedisBroker

        broker = RedisBroker(  # type: ignore[no-untyped-call]
            url=settings.broker,
            namespace=settings.prefix,
            heartbeat_timeout=HEARTBEAT_TIMEOUT,
            maintenance_chance=MAINTENANCE_CHANCE,
        )
    else:
        from dramatiq.brokers.rabbitmq import RabbitmqBroker

        broker = RabbitmqBroker(url=amqp_url(settings.broker), confirm_delivery=True)
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


def build_chain(broker: _dramatiq.Broker, settings: Settings) -> dict[tuple[str, str], Any]:
    """The chain demo's fenced actors by (step, mode), registered with ``_chain``."""
    chain = {
        (step, mode): fenced_actor(
            broker=broker,
            actor_name=_chain.task_name(step, mode).replace(".", "_"),
            queue_name=settings.queue,
            **_chain.options(step, mode),
        )(_chain.DECIDE[step])
        for step in _chain.STEPS
        for mode in _chain.MODES
    }

    def send(actor: Any, intent: Any) -> None:
        actor.enqueue(intent)

    _chain.register({mode: chain[("notify", mode)] for mode in _chain.MODES}, send)
    return chain


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
        self.chain = build_chain(self.broker, settings)

    def commands(self, workers: int) -> list[list[str]]:
        argv = [sys.executable, "-c", f"from {__name__} import main; main()"]
        return [list(argv) for _ in range(workers)]

    def env(self) -> dict[str, str]:
        return {"dramatiq_queue_prefetch": "1"}

    def send(self, mode: str, kind: str, leased: bool, intent: Any) -> None:
        if mode == "fencing":
            self.fenced[(kind, leased)].enqueue(intent)
        else:
            self.naive.send(intent.to_json())

    def send_chain(self, step: str, mode: str, intent: Any) -> None:
        self.chain[(step, mode)].enqueue(intent)

    def ping(self, token: str) -> None:
        self.naive.send(_tasks.PING + token)

    def close(self) -> None:
        self.broker.close()

    def cleanup(self) -> None:
        s = self.settings
        if s.broker.startswith("redis"):
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


def main() -> None:
    """One worker process, as the ``dramatiq`` command's worker process runs, until SIGTERM.

    One worker thread on the run's queue (and its delay queue); the demo starts N of these.
    """
    import logging
    import signal
    import threading

    import dramatiq

    logging.basicConfig(
        level=logging.WARNING, format="[%(asctime)s] [PID %(process)d] %(name)s: %(message)s"
    )
    # every run returns its verdict or report, which no result backend keeps: not news
    logging.getLogger("dramatiq.worker.WorkerThread").addFilter(
        lambda record: "Results middleware" not in record.getMessage()
    )
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    broker.emit_after("process_boot")
    worker = dramatiq.Worker(broker, queues={_tasks.settings().queue}, worker_threads=1)
    worker.start()
    while not stop.wait(1.0):
        pass
    worker.stop()
    broker.close()
    _tasks.close()


if _tasks.in_worker():
    import dramatiq

    broker = make_broker(_tasks.settings())
    dramatiq.set_broker(broker)
    _fenced, _naive = build(broker, _tasks.settings())
    _chained = build_chain(broker, _tasks.settings())
