"""What every task-queue integration shares, free of any queue import.

A :class:`FencedTask` is the queue-independent half of a fenced task: the target it
commits to, the ``decide`` function, the stale policy, an optional lease and signer.
The per-queue modules (``celery``, ``rq``, ``dramatiq``, ``arq``) only put
:meth:`FencedTask.encode`'s string in a message and map the :class:`TaskReport` of
:meth:`FencedTask.run` / :meth:`FencedTask.arun` onto their queue's own verbs:

============================  ============  =============================================
outcome or error              action        what the queue does
============================  ============  =============================================
Committed, Duplicate,         ``ack``       success
Skipped
Stale, Fenced, Contended,     ``ack``       success, the report records the stale result;
Missing                                     never retried (the decision is obsolete)
TransientStoreError,          ``retry``     the queue's own retry, bounded, with backoff
LeaseHeld, ``retry_on``                     and the *same* payload: a retry after the
                                            commit landed reports ``Duplicate``
InvalidIntent (unsigned,      ``refuse``    fail, never retried: the message is bad
tampered, malformed), any
other InvalidInput
any other exception (a bug    ``fail``      fail without retry (the error is re-raised);
in ``decide``); a retryable                 the same when the retries are used up
error on the last attempt
============================  ============  =============================================

Every run emits exactly one :mod:`logging` record on the ``fencing.task`` logger,
whose ``extra`` fields are named ``fencing_*`` (see :meth:`TaskReport.log_fields`).

Recorded effects are not wired yet: a ``Reconcile`` policy's handler receives
``effects=()`` (from the store's ``apply``, which :meth:`FencedTask.run` calls); once
the store records effects per intent, ``apply`` passes them to the handler and the
integrations need no change.
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
import inspect
import logging
import math
import os
import random
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from .._astore import AsyncCollection, AsyncStore, AsyncTable
from .._checks import MAX_OWNER_CHARS
from .._effects import Effect
from .._errors import (
    ConfigurationError,
    InvalidInput,
    InvalidIntent,
    LeaseHeld,
    TransientStoreError,
)
from .._policy import Drop, StalePolicy, check_policy
from .._rules import check_ttl
from .._signing import Signer
from .._store import Collection, Store, Table
from .._values import Intent, Outcome, Record

__all__ = [
    "Action",
    "AsyncTarget",
    "Backoff",
    "FencedTask",
    "LeaseSpec",
    "SyncTarget",
    "TaskReport",
    "aeffect",
    "classify",
    "current_intent",
    "current_target",
    "effect",
    "record_lease_name",
]

logger = logging.getLogger("fencing.task")

SyncTarget = Collection | Table
AsyncTarget = AsyncCollection | AsyncTable
#: A target, or a zero-argument factory called once per process (per event loop for
#: async targets; it may return an awaitable), so a worker opens its own store
#: after fork instead of inheriting the enqueuing process's connection.
TargetSource = SyncTarget | AsyncTarget | Callable[[], Any]
#: ``decide(record)`` returns the new state or ``fencing.SKIP``; with an async
#: store it may be a coroutine function.
Decision = Callable[[Record], Any]
OutcomeHook = Callable[["TaskReport"], Any]

MAX_RETRIES_LIMIT: Final = 1000
_current: contextvars.ContextVar[Intent | None] = contextvars.ContextVar(
    "fencing_current_intent", default=None
)


_target: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "fencing_current_target", default=None
)


def current_intent() -> Intent | None:
    """The intent the running fenced task is applying (None outside one).

    ``decide`` receives only the record; it can read the transition, or derive an
    idempotency key for an external call from ``current_intent().root_id``.
    """
    return _current.get()


def _not_abandoned(report: TaskReport, why: Exception) -> None:
    logger.warning(
        "%s: could not settle the effects of failed intent %s (%s: %s); they stay pending",
        report.task,
        report.intent.id if report.intent is not None else None,
        type(why).__name__,
        why,
    )


def current_target() -> Any:
    """The collection or table the running fenced task commits to (None outside one)."""
    return _target.get()


def _running() -> tuple[Intent, Any]:
    intent, target = _current.get(), _target.get()
    if intent is None or target is None:
        raise RuntimeError("effect() is called inside a fenced task's decide")
    return intent, target


def effect(name: str, *, detail: Any = None) -> Effect:
    """Record external effect ``name`` of the running task's intent, before making it.

    For a sync store, inside ``decide``: ``fx = effect("charge", detail={...})``, then
    call the provider with ``fx.idempotency_key`` unless ``fx.status == "done"`` (a
    retry), then ``current_target().effect_done(fx)``. A stale outcome hands the
    effect to ``Reconcile``'s handler and lists it in ``fencing reconcile``.
    """
    intent, target = _running()
    recorded: Effect = target.effect(intent, name, detail=detail)
    return recorded


async def aeffect(name: str, *, detail: Any = None) -> Effect:
    """:func:`effect` for a task on an async store (arq, or an async ``target``)."""
    intent, target = _running()
    recorded: Effect = await target.effect(intent, name, detail=detail)
    return recorded


class Action(enum.StrEnum):
    """What the queue must do with the message after a run."""

    ACK = "ack"  #: done (committed, duplicate, skipped, or a recorded stale result)
    RETRY = "retry"  #: transient: retry the same payload later, bounded, with backoff
    REFUSE = "refuse"  #: a bad message: fail it, never retry
    FAIL = "fail"  #: decide raised, or retries ran out: fail with the error, no retry


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff between retries: ``base * 2**(n-1)`` capped at ``cap``, jittered.

    The jitter keeps the delay within its upper half, so retries of many tasks
    spread out without ever coming back faster than half the nominal delay.
    """

    base: float = 1.0
    cap: float = 60.0

    def __post_init__(self) -> None:
        for name in ("base", "cap"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidInput(f"Backoff {name} must be a number of seconds")
            if not math.isfinite(value) or value <= 0:
                raise InvalidInput(f"Backoff {name} must be positive and finite, not {value}")
        if self.cap < self.base:
            raise InvalidInput("Backoff cap must not be below its base")

    def delay(self, retry: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (1-based)."""
        ceiling = min(self.cap, self.base * 2 ** min(max(retry, 1) - 1, 32))
        return (rng or random).uniform(ceiling / 2, ceiling)


def record_lease_name(intent: Intent) -> str:
    """The default lease name: ``<collection>/<key>``, one lease per record."""
    return f"{intent.collection}/{intent.key}"


def _default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"[:MAX_OWNER_CHARS]


@dataclass(frozen=True, slots=True)
class LeaseSpec:
    """Run each task under a lease on its record, so a paused worker is fenced.

    ``name(intent)`` names the lease (default ``<collection>/<key>``); ``owner`` is
    informational (default ``<host>:<pid>``); the task waits up to ``wait`` seconds
    for a held lease, then reports ``LeaseHeld``, which the queue retries. With
    ``heartbeat`` the lease is renewed every ``ttl/3`` while ``decide`` runs; a
    worker paused past its TTL still loses it, and its commit comes back ``Fenced``.
    """

    ttl: float
    name: Callable[[Intent], str] = record_lease_name
    owner: str | None = None
    wait: float = 0.0
    heartbeat: bool = True

    def __post_init__(self) -> None:
        check_ttl(self.ttl)
        if not callable(self.name):
            raise InvalidInput("LeaseSpec name must be a function of the intent")
        if self.owner is not None and (
            not isinstance(self.owner, str) or not 0 < len(self.owner) <= MAX_OWNER_CHARS
        ):
            raise InvalidInput(f"LeaseSpec owner must be a string of 1 to {MAX_OWNER_CHARS}")
        wait = self.wait
        if isinstance(wait, bool) or not isinstance(wait, int | float):
            raise InvalidInput("LeaseSpec wait must be a number of seconds")
        if not math.isfinite(wait) or wait < 0:
            raise InvalidInput("LeaseSpec wait must be finite and not negative")

    def owner_name(self) -> str:
        return self.owner if self.owner is not None else _default_owner()


@dataclass(frozen=True, slots=True)
class TaskReport:
    """The result of one run of a fenced task; ``to_dict()`` is its JSON-safe form."""

    task: str
    action: Action
    kind: str  #: the outcome kind, or "transient", "lease_held", "retryable", "invalid", "error"
    attempt: int
    intent: Intent | None = None  #: the intent the message carried
    outcome: Outcome | None = None
    error: Exception | None = None
    token: int | None = None  #: the lease token the commit was made under, if any

    @property
    def judged(self) -> Intent | None:
        """The intent the store judged: a ``Recompute`` attempt's derived one, if any."""
        judged = getattr(self.outcome, "intent", None)
        return judged if isinstance(judged, Intent) else self.intent

    @property
    def current_version(self) -> int | None:
        current = self.outcome.current if self.outcome is not None else None
        return None if current is None else current.version

    def log_fields(self) -> dict[str, Any]:
        """The ``extra`` fields of the ``fencing.task`` log record."""
        judged = self.judged
        return {
            "fencing_task": self.task,
            "fencing_collection": None if judged is None else judged.collection,
            "fencing_key": None if judged is None else judged.key,
            "fencing_intent_id": None if judged is None else judged.id,
            "fencing_root_id": None if judged is None else judged.root_id,
            "fencing_expected_version": None if judged is None else judged.expected_version,
            "fencing_current_version": self.current_version,
            "fencing_outcome": self.kind,
            "fencing_action": self.action.value,
            "fencing_attempt": self.attempt,
            "fencing_token": self.token,
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: what a task returns to its queue's result store."""
        fields = self.log_fields()
        data = {name.removeprefix("fencing_"): value for name, value in fields.items()}
        data["error"] = None if self.error is None else f"{type(self.error).__name__}: {self.error}"
        return data


def classify(error: Exception, retry_on: tuple[type[Exception], ...] = ()) -> tuple[Action, str]:
    """The action for an error raised by a run (outcomes are always ``ack``)."""
    if isinstance(error, InvalidInput):
        return Action.REFUSE, "invalid"  # never retried, whatever retry_on says
    if isinstance(error, TransientStoreError):
        return Action.RETRY, "transient"
    if isinstance(error, LeaseHeld):
        return Action.RETRY, "lease_held"
    if retry_on and isinstance(error, retry_on):
        return Action.RETRY, "retryable"
    return Action.FAIL, "error"


_LEVELS: Final = {
    "committed": logging.INFO,
    "duplicate": logging.INFO,
    "skipped": logging.INFO,
}


def _level(report: TaskReport) -> int:
    if report.action is Action.ACK:
        return _LEVELS.get(report.kind, logging.WARNING)
    return logging.WARNING if report.action is Action.RETRY else logging.ERROR


def _as_intent(what: object, transition: str | None, guard: Any) -> Intent:
    if isinstance(what, Intent):
        if transition is not None or guard is not None:
            raise InvalidIntent("pass an Intent alone, or a Record with a transition")
        return what
    if isinstance(what, Record):
        if not isinstance(transition, str):
            raise InvalidIntent("enqueueing a Record needs a transition name")
        return what.intent(transition, guard=guard)
    raise InvalidIntent(f"expected a Record or an Intent, got {type(what).__name__}")


def _check_match(target: SyncTarget | AsyncTarget, intent: Intent) -> None:
    if intent.collection != target.name or intent.kind != target.kind:
        raise InvalidIntent(
            f"intent for {intent.kind} {intent.collection!r} reached a task that commits to"
            f" {target.kind} {target.name!r}"
        )


class _TargetSlot:
    """Resolves a target source once per process (and per event loop when async)."""

    __slots__ = ("_alock", "_lock", "_loop", "_pid", "_source", "_value")

    def __init__(self, source: TargetSource) -> None:
        if not callable(source) and not isinstance(
            source, Collection | Table | AsyncCollection | AsyncTable
        ):
            raise ConfigurationError(
                "target must be a Collection or Table (an AsyncCollection or AsyncTable for"
                f" async queues), or a function returning one, not {type(source).__name__}"
            )
        self._source = source
        self._lock = threading.Lock()
        self._alock: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid: int | None = None
        self._value: SyncTarget | AsyncTarget | None = None

    @property
    def resolved(self) -> SyncTarget | AsyncTarget | None:
        """The target if known without calling a factory (for checks at enqueue)."""
        if isinstance(self._source, Collection | Table | AsyncCollection | AsyncTable):
            return self._source
        return self._value if self._pid == os.getpid() else None

    def sync(self) -> SyncTarget:
        source = self._source
        if isinstance(source, Collection | Table):
            return source
        if isinstance(source, AsyncCollection | AsyncTable):
            raise ConfigurationError("this task's target is async: run it with arun()")
        with self._lock:
            value = self._value
            if value is None or self._pid != os.getpid():
                value = source()
                if not isinstance(value, Collection | Table):
                    raise ConfigurationError(
                        f"the target factory returned {type(value).__name__}, not a Collection"
                        " or Table of a sync store"
                    )
                self._value, self._pid = value, os.getpid()
            assert isinstance(value, Collection | Table)
            return value

    async def aget(self) -> AsyncTarget:
        source = self._source
        if isinstance(source, AsyncCollection | AsyncTable):
            return source
        if isinstance(source, Collection | Table):
            raise ConfigurationError("this task's target is sync: run it with run()")
        loop = asyncio.get_running_loop()
        if self._alock is None or self._loop is not loop:
            self._alock, self._loop, self._value = asyncio.Lock(), loop, None
        async with self._alock:
            value = self._value
            if value is None or self._pid != os.getpid():
                value = source()
                if inspect.isawaitable(value):
                    value = await value
                if not isinstance(value, AsyncCollection | AsyncTable):
                    raise ConfigurationError(
                        f"the target factory returned {type(value).__name__}, not an"
                        " AsyncCollection or AsyncTable"
                    )
                self._value, self._pid = value, os.getpid()
            assert isinstance(value, AsyncCollection | AsyncTable)
            return value


class FencedTask:
    """The queue-independent half of a fenced task (see the module docstring).

    ``name`` names the task in logs and reports; ``target`` is where it commits;
    ``decide(record)`` computes the new state (or ``fencing.SKIP``); ``on_stale`` is
    the stale policy (default ``Drop()``); ``lease`` runs each task under a lease;
    ``signer`` signs payloads at enqueue and refuses unsigned or tampered ones;
    ``max_retries`` and ``backoff`` bound the retries of transient errors;
    ``retry_on`` adds exception types of ``decide`` to retry the same way;
    ``on_outcome(report)`` is called after each run, before the queue acknowledges.
    """

    __slots__ = (
        "_target",
        "backoff",
        "decide",
        "lease",
        "max_retries",
        "name",
        "on_outcome",
        "on_stale",
        "retry_on",
        "signer",
    )

    def __init__(
        self,
        *,
        name: str,
        target: TargetSource,
        decide: Decision,
        on_stale: StalePolicy | None = None,
        lease: LeaseSpec | None = None,
        signer: Signer | None = None,
        max_retries: int = 5,
        backoff: Backoff | None = None,
        retry_on: tuple[type[Exception], ...] = (),
        on_outcome: OutcomeHook | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigurationError("a fenced task needs a non-empty name")
        if not callable(decide):
            raise ConfigurationError("decide must be a function of the record")
        if lease is not None and not isinstance(lease, LeaseSpec):
            raise ConfigurationError(f"lease must be a LeaseSpec, not {type(lease).__name__}")
        if signer is not None and not isinstance(signer, Signer):
            raise ConfigurationError(f"signer must be a Signer, not {type(signer).__name__}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int):
            raise ConfigurationError("max_retries must be an integer")
        if not 0 <= max_retries <= MAX_RETRIES_LIMIT:
            raise ConfigurationError(f"max_retries must be 0 to {MAX_RETRIES_LIMIT}")
        if backoff is not None and not isinstance(backoff, Backoff):
            raise ConfigurationError(f"backoff must be a Backoff, not {type(backoff).__name__}")
        if not isinstance(retry_on, tuple) or not all(
            isinstance(t, type) and issubclass(t, Exception) for t in retry_on
        ):
            raise ConfigurationError("retry_on must be a tuple of exception classes")
        if on_outcome is not None and not callable(on_outcome):
            raise ConfigurationError("on_outcome must be callable")
        self.name = name
        self._target = _TargetSlot(target)
        self.decide = decide
        self.on_stale: StalePolicy = check_policy(on_stale if on_stale is not None else Drop())
        self.lease = lease
        self.signer = signer
        self.max_retries = max_retries
        self.backoff = backoff if backoff is not None else Backoff()
        self.retry_on = retry_on
        self.on_outcome = on_outcome

    def __repr__(self) -> str:
        return f"<FencedTask {self.name!r}>"

    # -- the message ---------------------------------------------------------------
    def intent_for(
        self, what: Record | Intent, transition: str | None = None, *, guard: Any = None
    ) -> Intent:
        """The intent to send: ``what`` itself, or ``what.intent(transition)`` for a Record."""
        intent = _as_intent(what, transition, guard)
        target = self._target.resolved
        if target is not None:
            _check_match(target, intent)
        return intent

    def encode(
        self, what: Record | Intent, transition: str | None = None, *, guard: Any = None
    ) -> str:
        """The message payload: the intent's JSON, or a signed token with a signer.

        Never pickle: the payload is a plain string any queue serializer carries.
        """
        intent = self.intent_for(what, transition, guard=guard)
        return self.signer.sign(intent) if self.signer is not None else intent.to_json()

    def decode(self, payload: object) -> Intent:
        """The intent in a payload; ``InvalidIntent`` if malformed, unsigned or tampered."""
        if self.signer is not None:
            if not isinstance(payload, str | bytes):
                raise InvalidIntent(f"payload must be a string, not {type(payload).__name__}")
            return self.signer.verify(payload)
        if not isinstance(payload, str | bytes):
            raise InvalidIntent(f"payload must be a JSON string, not {type(payload).__name__}")
        return Intent.from_json(payload)

    # -- running -------------------------------------------------------------------
    def _lease_args(self, intent: Intent) -> dict[str, Any]:
        spec = self.lease
        assert spec is not None
        return {
            "name": spec.name(intent),
            "owner": spec.owner_name(),
            "ttl": spec.ttl,
            "wait": spec.wait,
            "heartbeat": spec.heartbeat,
        }

    def _apply(self, target: SyncTarget, intent: Intent) -> tuple[Outcome, int | None]:
        if self.lease is None:
            return target.apply(intent, self.decide, on_stale=self.on_stale), None
        store: Store = target._store
        with store.acquire(**self._lease_args(intent)) as lease:
            outcome = target.apply(intent, self.decide, on_stale=self.on_stale, lease=lease)
            return outcome, lease.token

    async def _aapply(self, target: AsyncTarget, intent: Intent) -> tuple[Outcome, int | None]:
        if self.lease is None:
            return await target.apply(intent, self.decide, on_stale=self.on_stale), None
        store: AsyncStore = target._store
        async with await store.acquire(**self._lease_args(intent)) as lease:
            outcome = await target.apply(intent, self.decide, on_stale=self.on_stale, lease=lease)
            return outcome, lease.token

    def run(self, payload: object, *, attempt: int = 1) -> TaskReport:
        """Decode, apply (under the lease, if any), log one record, call ``on_outcome``."""
        intent: Intent | None = None
        try:
            intent = self.decode(payload)
            target = self._target.sync()
            _check_match(target, intent)
            token, where = _current.set(intent), _target.set(target)
            try:
                outcome, token_used = self._apply(target, intent)
            finally:
                _target.reset(where)
                _current.reset(token)
        except Exception as exc:
            report = self._failed(intent, exc, attempt)
            if report.action is Action.FAIL and intent is not None:
                try:  # its effects are listed for reconciliation; the task fails anyway
                    self._target.sync().abandon(intent)
                except Exception as why:
                    _not_abandoned(report, why)
        else:
            report = TaskReport(
                self.name, Action.ACK, outcome.kind, attempt, intent, outcome, token=token_used
            )
        self._emit(report)
        if self.on_outcome is not None:
            self.on_outcome(report)
        return report

    async def arun(self, payload: object, *, attempt: int = 1) -> TaskReport:
        """:meth:`run` for an async target (``decide`` and ``on_outcome`` may be async)."""
        intent: Intent | None = None
        try:
            intent = self.decode(payload)
            target = await self._target.aget()
            _check_match(target, intent)
            token, where = _current.set(intent), _target.set(target)
            try:
                outcome, token_used = await self._aapply(target, intent)
            finally:
                _target.reset(where)
                _current.reset(token)
        except Exception as exc:
            report = self._failed(intent, exc, attempt)
            if report.action is Action.FAIL and intent is not None:
                try:
                    await (await self._target.aget()).abandon(intent)
                except Exception as why:
                    _not_abandoned(report, why)
        else:
            report = TaskReport(
                self.name, Action.ACK, outcome.kind, attempt, intent, outcome, token=token_used
            )
        self._emit(report)
        if self.on_outcome is not None:
            result = self.on_outcome(report)
            if inspect.isawaitable(result):
                await result
        return report

    def _failed(self, intent: Intent | None, exc: Exception, attempt: int) -> TaskReport:
        action, kind = classify(exc, self.retry_on)
        if action is Action.RETRY and attempt > self.max_retries:
            # Out of retries: the queue fails the message with the error.
            action, kind = Action.FAIL, f"{kind}_exhausted"
        return TaskReport(self.name, action, kind, attempt, intent, None, exc)

    def retry_delay(self, retry: int) -> float:
        """Seconds before retry number ``retry`` (1-based), from :attr:`backoff`."""
        return self.backoff.delay(retry)

    @staticmethod
    def _emit(report: TaskReport) -> None:
        fields = report.log_fields()
        message = "%s: %s %s/%s intent=%s expected=%s current=%s -> %s"
        args: tuple[object, ...] = (
            report.task,
            report.kind,
            fields["fencing_collection"],
            fields["fencing_key"],
            fields["fencing_intent_id"],
            fields["fencing_expected_version"],
            fields["fencing_current_version"],
            report.action.value,
        )
        if report.error is not None:
            message += " (%s: %s)"
            args += (type(report.error).__name__, report.error)
        logger.log(_level(report), message, *args, extra=fields)
