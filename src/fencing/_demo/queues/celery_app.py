"""The queue demo on Celery: ``celery -A fencing._demo.queues.celery_app worker``.

:func:`build` makes the app (the fenced tasks through ``fencing.contrib.celery`` and
the naive task); the worker builds it from the environment the demo sets, the demo
builds its own to send with. A worker killed after its commit has its message
redelivered (``acks_late`` and ``reject_on_worker_lost``, the integration's defaults).
"""

from __future__ import annotations

import os
import sys
import uuid
from typing import TYPE_CHECKING, Any, Final

from ...contrib.celery import fenced_task  # MissingDependency without the extra
from . import _chain, _tasks
from ._broker import redis_delete
from ._tasks import KINDS, Settings

if TYPE_CHECKING:
    from celery import Celery

NAME: Final = "celery"
#: A message whose worker dies after the commit comes back: the crash is real here.
CRASH: Final = True
#: How the message comes back, for the demo's summary.
REDELIVERY: Final = "Celery requeues its unacknowledged message (reject_on_worker_lost)"
BROKERS: Final = ("redis", "rediss", "amqp", "pyamqp")


def build(settings: Settings) -> tuple[Celery, dict[tuple[str, bool], Any], Any]:
    """The app, its fenced tasks by (kind, leased), and the naive task."""
    from celery import Celery

    app = Celery("fencing_demo", broker=settings.broker, set_as_current=False)
    app.conf.update(
        task_default_queue=settings.queue,
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        worker_enable_remote_control=False,
        worker_send_task_events=False,
    )
    if settings.broker.startswith("redis"):
        app.conf.broker_transport_options = {"global_keyprefix": f"{settings.prefix}:"}
    else:  # RabbitMQ: a publish returns once the broker confirmed it (the outbox relay)
        app.conf.broker_transport_options = {"confirm_publish": True}
    fenced = {
        (kind, leased): fenced_task(
            app,
            target=_tasks.target(kind),
            on_stale=_tasks.policy(kind),
            lease=_tasks.LEASE if leased else None,
            max_retries=_tasks.MAX_RETRIES,
            backoff=_tasks.BACKOFF,
            on_outcome=_tasks.on_outcome,
            name=_tasks.task_name(kind, leased),
        )(_tasks.DECIDE[kind])
        for kind in KINDS
        for leased in (False, True)
    }

    def naive(self: Any, payload: str) -> str:
        retries = int(self.request.retries or 0)
        try:
            return _tasks.run_naive(payload, attempt=retries + 1)
        except _tasks.DemoRetry as exc:
            countdown = _tasks.BACKOFF.delay(retries + 1)
            raise self.retry(exc=exc, countdown=countdown, max_retries=_tasks.MAX_RETRIES) from exc

    naive_task = app.task(
        naive,
        bind=True,
        name="fencing_demo.naive",
        acks_late=True,
        reject_on_worker_lost=True,
        max_retries=_tasks.MAX_RETRIES,
    )
    return app, fenced, naive_task


def build_chain(app: Celery) -> dict[tuple[str, str], Any]:
    """The chain demo's fenced tasks by (step, mode), registered with ``_chain``."""
    chain = {
        (step, mode): fenced_task(
            app, name=_chain.task_name(step, mode), **_chain.options(step, mode)
        )(_chain.DECIDE[step])
        for step in _chain.STEPS
        for mode in _chain.MODES
    }

    def send(task: Any, intent: Any) -> None:
        task.enqueue(intent)

    _chain.register({mode: chain[("notify", mode)] for mode in _chain.MODES}, send)
    return chain


def broker_errors() -> tuple[type[Exception], ...]:
    """What the broker's client raises when the broker is unreachable or refuses."""
    import redis
    from kombu.exceptions import OperationalError

    return (OperationalError, redis.RedisError, OSError)


class Sender:
    """The demo's side: enqueue, start the workers, delete the run's broker state."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.app, self.fenced, self.naive = build(settings)
        self.chain = build_chain(self.app)

    def commands(self, workers: int) -> list[list[str]]:
        argv = [sys.executable, "-m", "celery", "-A", __name__, "worker", "--pool=prefork"]
        argv += [f"--concurrency={workers}", "-O", "fair", "-Q", self.settings.queue]
        argv += ["--without-heartbeat", "--without-mingle", "--without-gossip"]
        argv += ["--loglevel=WARNING", "-n", f"{self.settings.prefix}-{uuid.uuid4().hex[:6]}@%h"]
        return [argv]

    def send(self, mode: str, kind: str, leased: bool, intent: Any) -> None:
        if mode == "fencing":
            self.fenced[(kind, leased)].enqueue(intent)
        else:
            self.naive.apply_async((intent.to_json(),))

    def send_chain(self, step: str, mode: str, intent: Any) -> None:
        self.chain[(step, mode)].enqueue(intent)

    def ping(self, token: str) -> None:
        self.naive.apply_async((_tasks.PING + token,))

    def close(self) -> None:
        self.app.close()

    def cleanup(self) -> None:
        s = self.settings
        if s.broker.startswith("redis"):
            redis_delete(s.broker, [f"{s.prefix}:*"])
            return
        with self.app.connection_for_write() as conn:
            channel = conn.default_channel
            channel.queue_delete(queue=s.queue)
            channel.exchange_delete(exchange=s.queue)


if _tasks.in_worker():
    app, _fenced, _naive = build(_tasks.settings())
    _chained = build_chain(app)
    if os.environ.get("FENCING_METRICS_PORT"):  # docs/observability.md: the demo's metrics
        from ...contrib.prometheus import celery_metrics

        celery_metrics(app, port=int(os.environ["FENCING_METRICS_PORT"]))
