"""Celery: ``@fenced_task(app, target=...)`` turns ``decide`` into a real Celery task.

::

    from celery import Celery
    from fencing.contrib.celery import fenced_task

    app = Celery("shop", broker="redis://localhost:6379/1")

    @fenced_task(app, target=lambda: open_store().collection("orders"))
    def ship(record):
        return {**record.state, "status": "shipped"}

    ship.enqueue(orders.get("o-1"), "ship")    # the intent JSON is the message's one argument

The task body is ``FencedTask.run``: a stale, fenced, contended or missing outcome
is a *successful* task whose result records it (never in ``autoretry_for``, never
retried); a ``TransientStoreError``, ``LeaseHeld`` or ``retry_on`` error is retried
with ``self.retry(countdown=...)``, bounded by ``max_retries``, with the same
payload, and fails the task once the retries are used up; an unsigned, tampered or
malformed message (any ``InvalidInput``) is refused with ``Reject(requeue=False)``;
an exception of ``decide`` fails the task.

Through the transactional outbox: ``store.using(conn).outbox.send(ship, record, "ship",
countdown=5)`` writes the message in your transaction; a relay (``fencing relay URL
--queue celery --app shop:app``, or ``Relay(store, publisher(app))``) sends it with
``app.send_task(task.name, args=(payload,), task_id=..., **options)`` once committed.

Defaults: ``acks_late=True`` and ``reject_on_worker_lost=True``, so a worker killed
after the commit and before the ack has its message redelivered, and the
redelivery reports ``Duplicate``. Pass them as options to change them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

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
    from celery import Celery, Task
    from celery.exceptions import Reject
except ModuleNotFoundError as exc:  # pragma: no cover - exercised without the extra
    raise MissingDependency(
        f"fencing.contrib.celery needs {exc.name}: pip install 'fencing[celery]'"
    ) from exc

if TYPE_CHECKING:
    from .._policy import StalePolicy
    from .._signing import Signer

__all__ = [
    "Backoff",
    "CeleryPublisher",
    "FencedCeleryTask",
    "LeaseSpec",
    "Step",
    "TaskReport",
    "aeffect",
    "current_intent",
    "current_lease",
    "current_target",
    "effect",
    "fenced_task",
    "publisher",
]

#: ``apply_async`` options the relay sets itself.
_RELAY_SETS = frozenset({"task_id", "args", "kwargs"})


class FencedCeleryTask(Task):  # type: ignore[misc]  # celery ships no type hints
    """The base class of fenced Celery tasks: a Celery ``Task`` with ``enqueue``."""

    #: The queue-independent spec, set per task by :func:`fenced_task`.
    fencing: FencedTask

    def enqueue(
        self,
        what: Record | Intent,
        transition: str | None = None,
        *,
        guard: Any = None,
        **options: Any,
    ) -> Any:
        """Send the intent (of ``what``, or ``what`` itself): ``apply_async`` with ``options``.

        Returns the ``AsyncResult``; ``options`` are ``apply_async``'s (``countdown``,
        ``queue``, ...). Call it after the transaction that produced the record has
        committed (see ``fencing.contrib.tx``).
        """
        payload = self.fencing.encode(what, transition, guard=guard)
        return self.apply_async((payload,), **options)

    def delay_intent(self, intent: Intent) -> Any:
        """``enqueue(intent)`` with no options."""
        return self.enqueue(intent)


def _outbox_route(
    task: Any, options: dict[str, Any]
) -> tuple[str, str, str | None, dict[str, Any]]:
    clash = _RELAY_SETS & set(options)
    if clash:
        raise InvalidInput(f"the relay sets {sorted(clash)} itself")
    queue = options.get("queue", getattr(task, "queue", None))
    if queue is not None and not isinstance(queue, str):
        raise InvalidInput("an outbox message's Celery queue is a queue name (a string)")
    if queue is not None:
        options["queue"] = queue
    return "celery", str(task.name), queue, options


class CeleryPublisher:
    """Sends outbox rows of Celery tasks through ``app.send_task`` (the relay's side).

    The message is the one ``task.enqueue`` sends: the payload as its one argument, the
    stored options (``countdown``, ``queue``, ...), and a ``task_id`` derived from the
    row (:func:`~fencing.contrib._common.publish_id`), the same on a re-publish.
    """

    kind = "celery"

    def __init__(self, app: Celery) -> None:
        _check_confirms(app)
        self.app = app

    def __repr__(self) -> str:
        return f"<CeleryPublisher {self.app.main!r}>"

    def publish(self, row: OutboxRow) -> None:
        self.app.send_task(row.task, args=(row.payload,), task_id=publish_id(row), **row.options)

    def close(self) -> None:
        pass


def publisher(app: Celery) -> CeleryPublisher:
    """The relay's publisher for Celery: rows sent with ``app.send_task``.

    On an AMQP broker (RabbitMQ) the app must publish with confirms
    (``broker_transport_options={"confirm_publish": True}``, py-amqp), or it is refused
    with ``ConfigurationError``: without them ``send_task`` returns once the message is
    on the socket, and a connection lost then loses it while the relay marks it sent.
    What is checked is the connection Celery writes with, as kombu resolves it
    (``broker_write_url`` before ``broker_url``, Celery's default AMQP broker when
    neither is set), and every alternate of a failover list."""
    return CeleryPublisher(app)


def _check_confirms(app: Celery) -> None:
    """Refuse an app whose writes could reach an AMQP broker without confirms: asked of
    kombu, on the connection Celery publishes with (``app.connection_for_write()``:
    ``broker_write_url`` or ``broker_url``, Celery's default broker when neither is set),
    every alternate of a failover list, before anything connects."""
    try:
        conn = app.connection_for_write()
    except ImportError as exc:  # the URL names a transport whose client is missing
        raise ConfigurationError(
            f"the outbox relay cannot tell whether Celery app {app.main!r} waits for the"
            f" broker's confirm: its broker transport needs {exc.name}, which is not"
            " installed"
        ) from exc
    try:
        for alternate in conn.alt or [None]:
            _check_transport(app, conn, alternate)
    finally:
        conn.release()


def _check_transport(app: Celery, conn: Any, alternate: str | None) -> None:
    """One alternate of the write connection (None: the connection as it is), seen as
    kombu sees it after a failover to it (``switch`` on a clone: nothing connects)."""
    from kombu.transport import get_transport_cls

    if alternate is not None:
        conn = conn.clone()
        conn.switch(alternate)
    try:
        transport = get_transport_cls(conn.transport_cls)
    except ImportError as exc:
        raise ConfigurationError(
            f"the outbox relay cannot tell whether Celery app {app.main!r} waits for the"
            f" broker's confirm: the transport {conn.transport_cls!r} needs {exc.name},"
            " which is not installed"
        ) from exc
    if getattr(transport, "driver_type", None) != "amqp":
        return  # Redis, SQS, ...: a publish returns once the broker has the message
    name = getattr(transport, "driver_name", None)
    if name != "py-amqp":
        raise ConfigurationError(
            f"the outbox relay publishes to AMQP with Celery app {app.main!r} through"
            f" {name or transport.__name__}, which does not wait for the broker's confirm:"
            " a row could be marked sent and lost. Use the pyamqp:// (amqp://) transport"
            ' with broker_transport_options = {"confirm_publish": True}'
        )
    if not (conn.transport_options or {}).get("confirm_publish"):
        raise ConfigurationError(
            f"the outbox relay publishes to AMQP ({conn.as_uri()}) with Celery app"
            f" {app.main!r}, which does not wait for the broker's confirm: a row could be"
            " marked sent and lost. Set app.conf.broker_transport_options ="
            ' {"confirm_publish": True} (with your other transport options)'
        )


def _body(spec: FencedTask) -> Callable[[Any, str], dict[str, Any]]:
    def run(self: Any, payload: str) -> dict[str, Any]:
        retries = int(self.request.retries or 0)
        report = spec.run(payload, attempt=retries + 1)
        if report.action is Action.RETRY:
            raise self.retry(
                exc=report.error,
                countdown=spec.retry_delay(retries + 1),
                max_retries=spec.max_retries,
            )
        if report.action is Action.REFUSE:
            raise Reject(str(report.error), requeue=False)
        if report.action is Action.FAIL:
            assert report.error is not None
            raise report.error
        return report.to_dict()

    return run


def fenced_task(
    app: Celery,
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
    **celery_task_options: Any,
) -> Callable[[Decision], FencedCeleryTask]:
    """Decorate ``decide(record) -> new state | SKIP`` into a fenced Celery task.

    ``target`` is a sync ``Collection`` or ``Table``, or a function returning one
    (called once per worker process, after fork). ``celery_task_options`` go to
    ``app.task`` (``queue``, ``acks_late``, ``time_limit``, ...). The task takes one
    argument, the payload; send it with ``task.enqueue(record, "transition")``.
    ``supersede``, ``debounce``, ``max_wait``: what ``store.outbox.send`` does for this
    task when the send says none of them (docs/outbox.md, "Superseded and debounced").
    """

    def decorate(decide: Decision) -> FencedCeleryTask:
        task_name = name or app.gen_task_name(decide.__name__, decide.__module__)
        spec = FencedTask(
            name=task_name,
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
        spec.outbox_route = _outbox_route
        run = _body(spec)
        run.__name__ = decide.__name__
        run.__qualname__ = getattr(decide, "__qualname__", decide.__name__)
        run.__module__ = decide.__module__
        run.__doc__ = decide.__doc__
        options: dict[str, Any] = {
            "acks_late": True,
            "reject_on_worker_lost": True,
            **celery_task_options,
        }
        task = app.task(
            run,
            bind=True,
            base=FencedCeleryTask,
            name=task_name,
            max_retries=max_retries,
            fencing=spec,
            **options,
        )
        return cast(FencedCeleryTask, task)

    return decorate
