"""Dramatiq: ``@fenced_actor(target=..., broker=...)`` turns ``decide`` into an actor.

::

    from fencing.contrib.dramatiq import fenced_actor

    @fenced_actor(target=lambda: open_store().collection("orders"), broker=broker)
    def ship(record):
        return {**record.state, "status": "shipped"}

    ship.enqueue(orders.get("o-1"), "ship")    # ship.send(payload) underneath

The actor's one argument is the payload (the intent's JSON or a signed token).
Retries go through Dramatiq's ``Retries`` middleware, restricted to transient
errors: the actor raises ``dramatiq.Retry`` for a ``TransientStoreError``,
``LeaseHeld`` or ``retry_on`` error and its ``retry_when`` accepts only that, at
most ``max_retries`` times, with the middleware's exponential backoff
(``min_backoff``/``max_backoff`` from ``backoff``). ``InvalidIntent`` and other bad
input are in ``throws``: the message fails at once. Stale, fenced, contended and
missing outcomes are successful messages; an exception of ``decide`` fails the
message without retry.

Dramatiq acknowledges a message after the actor returns. A worker killed before
that leaves the message unacknowledged: RabbitMQ redelivers it as soon as the
connection drops; the Redis broker moves it back to the queue once the dead
worker's heartbeat is older than ``heartbeat_timeout``. The redelivery reports
``Duplicate``. Add the ``CurrentMessage`` middleware to number attempts in logs and
reports (without it every run counts as attempt 1).

Through the transactional outbox: ``store.using(conn).outbox.send(ship, record, "ship",
delay=5000)`` writes the message in your transaction (options: ``delay`` in
milliseconds, and the message options ``time_limit`` and ``max_age``). A relay
(``fencing relay URL --queue dramatiq --app shop:broker``, or ``Relay(store,
publisher(broker))``) sends ``Message(queue, actor_name, (payload,))`` with
``broker.enqueue`` once committed; its ``message_id`` is derived from the row.
"""

from __future__ import annotations

from collections.abc import Callable
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
    import dramatiq
    from dramatiq.broker import Broker, get_broker
    from dramatiq.message import Message
    from dramatiq.middleware import CurrentMessage
except ModuleNotFoundError as exc:  # pragma: no cover - exercised without the extra
    raise MissingDependency(
        f"fencing.contrib.dramatiq needs {exc.name}: pip install 'fencing[dramatiq]'"
    ) from exc

if TYPE_CHECKING:
    from .._policy import StalePolicy
    from .._signing import Signer

__all__ = [
    "Backoff",
    "DramatiqPublisher",
    "FencedActor",
    "LeaseSpec",
    "Step",
    "TaskReport",
    "aeffect",
    "current_intent",
    "current_lease",
    "current_target",
    "effect",
    "fenced_actor",
    "publisher",
]

#: message options an outbox row may carry, besides ``delay`` (milliseconds)
OUTBOX_OPTIONS = frozenset({"time_limit", "max_age"})


class FencedActor(dramatiq.Actor[[str], dict[str, Any]]):
    """A Dramatiq ``Actor`` with ``enqueue``; its spec is ``actor.fencing``."""

    fencing: FencedTask

    def enqueue(
        self,
        what: Record | Intent,
        transition: str | None = None,
        *,
        guard: Any = None,
        delay: int | None = None,
        **options: Any,
    ) -> Message[dict[str, Any]]:
        """Send the intent of ``what`` (or ``what`` itself); ``delay`` in milliseconds."""
        payload = self.fencing.encode(what, transition, guard=guard)
        return self.send_with_options(args=(payload,), delay=delay, **options)


def _attempt() -> int:
    message = CurrentMessage.get_current_message()
    if message is None:
        return 1
    retries = message.options.get("retries", 0)
    return retries + 1 if isinstance(retries, int) else 1


def fenced_actor(
    *,
    target: TargetSource,
    broker: Broker | None = None,
    actor_name: str | None = None,
    queue_name: str = "default",
    priority: int = 0,
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
    **actor_options: Any,
) -> Callable[[Decision], FencedActor]:
    """Decorate ``decide(record) -> new state | SKIP`` into a fenced Dramatiq actor.

    ``target`` is a sync ``Collection`` or ``Table`` or a function returning one
    (called once per worker process; worker threads share it). ``broker`` defaults
    to Dramatiq's global broker; ``actor_options`` go to ``dramatiq.actor``
    (``time_limit``, ...), except the retry options this module sets.
    """
    reserved = {"max_retries", "retry_when", "throws", "min_backoff", "max_backoff"}
    clash = reserved & set(actor_options)
    if clash:
        raise InvalidInput(
            f"fenced_actor sets {sorted(clash)} itself; use max_retries=, backoff=, retry_on="
        )

    def decorate(decide: Decision) -> FencedActor:
        name = actor_name or decide.__name__
        spec = FencedTask(
            name=name,
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

        def run(payload: str) -> dict[str, Any]:
            report = spec.run(payload, attempt=_attempt())
            if report.action is Action.RETRY:
                raise dramatiq.Retry(f"{report.kind}: {report.error}") from report.error
            if report.action in (Action.REFUSE, Action.FAIL):
                assert report.error is not None
                raise report.error
            return report.to_dict()

        def retry_when(retries: int, exc: BaseException) -> bool:
            return isinstance(exc, dramatiq.Retry) and retries < spec.max_retries

        run.__name__ = decide.__name__
        run.__qualname__ = getattr(decide, "__qualname__", decide.__name__)
        run.__module__ = decide.__module__
        run.__doc__ = decide.__doc__
        make = dramatiq.actor(
            actor_class=FencedActor,
            actor_name=name,
            queue_name=queue_name,
            priority=priority,
            broker=broker or get_broker(),
            max_retries=spec.max_retries,
            retry_when=retry_when,
            throws=(InvalidInput,),
            min_backoff=int(spec.backoff.base * 1000),
            max_backoff=int(spec.backoff.cap * 1000),
            **actor_options,
        )
        actor = make(run)
        assert isinstance(actor, FencedActor)
        actor.fencing = spec
        spec.outbox_route = _outbox_route
        return actor

    return decorate


def _outbox_route(
    actor: Any, options: dict[str, Any]
) -> tuple[str, str, str | None, dict[str, Any]]:
    unknown = set(options) - OUTBOX_OPTIONS - {"delay"}
    if unknown:
        raise InvalidInput(
            f"Dramatiq outbox options are delay and {sorted(OUTBOX_OPTIONS)}; not {sorted(unknown)}"
        )
    delay = options.get("delay")
    if delay is not None and (isinstance(delay, bool) or not isinstance(delay, int) or delay < 0):
        raise InvalidInput("delay is a non-negative number of milliseconds")
    return "dramatiq", str(actor.actor_name), str(actor.queue_name), options


def _check_confirms(broker: Broker) -> None:
    """Refuse a broker that publishes to RabbitmqBroker without confirms (the Redis
    broker answers every push). Dramatiq waits for confirms when the broker's
    ``confirm_delivery`` is true (any true value), so that is what is read: on a
    RabbitmqBroker or any subclass, a missing attribute (a subclass that never set it)
    is no confirm; any other broker that has the switch must have it on."""
    import sys

    rabbitmq = sys.modules.get("dramatiq.brokers.rabbitmq")  # not loaded: no RabbitmqBroker
    amqp = rabbitmq is not None and isinstance(broker, rabbitmq.RabbitmqBroker)
    if (amqp or hasattr(broker, "confirm_delivery")) and not getattr(
        broker, "confirm_delivery", False
    ):
        raise ConfigurationError(
            f"the outbox relay publishes with a {type(broker).__name__} made without"
            " confirm_delivery=True: a row could be marked sent and lost on a"
            " connection lost right after the publish. Make the relay's broker with"
            " RabbitmqBroker(..., confirm_delivery=True)"
        )


class DramatiqPublisher:
    """Sends outbox rows of Dramatiq actors with ``broker.enqueue`` (the relay's side):
    ``Message(queue_name, actor_name, args=(payload,))`` with the stored options and a
    ``message_id`` derived from the row; ``delay`` as ``broker.enqueue``'s."""

    kind = "dramatiq"

    def __init__(self, broker: Broker) -> None:
        _check_confirms(broker)
        self.broker = broker

    def __repr__(self) -> str:
        return f"<DramatiqPublisher {type(self.broker).__name__}>"

    def publish(self, row: OutboxRow) -> None:
        options = dict(row.options)
        delay = options.pop("delay", None)
        message: Message[Any] = Message(
            queue_name=row.queue or "default",
            actor_name=row.task,
            args=(row.payload,),
            kwargs={},
            options=options,
            message_id=publish_id(row),
        )
        self.broker.enqueue(message, delay=delay)

    def close(self) -> None:
        pass


def publisher(broker: Broker | None = None) -> DramatiqPublisher:
    """The relay's publisher for Dramatiq: ``broker`` (default: the global broker)."""
    return DramatiqPublisher(broker if broker is not None else get_broker())
