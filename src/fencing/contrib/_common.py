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
Stale, Fenced (newer owner),  ``ack``       success, the report records the stale result;
Contended, Missing                          never retried (the decision is obsolete)
TransientStoreError,          ``retry``     the queue's own retry, bounded, with backoff
LeaseHeld, LeaseLost (from                  and the *same* payload: a retry after the
``decide``), ``retry_on``,
Fenced (expired: the lease                  commit landed reports ``Duplicate``
kept running out, nobody
took over; LeaseExpired)
InvalidIntent (unsigned,      ``refuse``    fail, never retried: the message is bad
tampered, malformed), any
other InvalidInput
any other exception (a bug    ``fail``      fail without retry (the error is re-raised);
in ``decide``); a retryable                 the same when the retries are used up
error on the last attempt
============================  ============  =============================================

Every run emits exactly one :mod:`logging` record on the ``fencing.task`` logger,
whose ``extra`` fields are named ``fencing_*`` (see :meth:`TaskReport.log_fields`);
a run that fails also logs a warning there if it cannot settle its intent's effects.

Recorded effects (:func:`effect`, :func:`aeffect`): the store's ``apply``, which
:meth:`FencedTask.run` calls, settles the intent's recorded effects when the outcome
ends it uncommitted (stale, fenced, contended, missing), and a ``Reconcile``
policy's handler receives the effects recorded for the intent. A run whose action is
``fail`` abandons its intent (``abandon``): its effects not yet settled are settled
as ``"abandoned"``. Settled effects are listed by ``fencing reconcile`` until
someone marks them reconciled.

The parts, one job each: ``_options`` (:class:`Backoff`, :class:`LeaseSpec`),
``_outcomes`` (:class:`Action`, :class:`TaskReport`, :func:`classify`, the log
record), ``_target`` (where a task commits, resolved once per process),
``_context`` (:func:`current_intent`, :func:`current_target`, :func:`effect`);
this module re-exports what the integrations import.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable
from typing import Any, Final, cast

from .._astore import AsyncLease, AsyncStore
from .._errors import ConfigurationError, InvalidInput, InvalidIntent, LeaseExpired
from .._outbox import OutboxMessage, OutboxRow, check_message, check_supersede
from .._policy import Drop, StalePolicy, check_policy
from .._signing import Signer
from .._store import Lease, Store
from .._values import Committed, Fenced, FenceReason, Intent, Outcome, Record
from ._context import (
    aeffect,
    current_intent,
    current_lease,
    current_target,
    effect,
    holding,
    running_task,
)
from ._options import Backoff, LeaseSpec, record_lease_name
from ._outcomes import Action, TaskReport, classify, emit, not_abandoned
from ._target import AsyncTarget, SyncTarget, TargetSlot, check_match
from ._target import TargetSource as TargetSource  # the integrations' argument type
from ._worktx import (
    Refused,
    Step,
    TransactionSource,
    check_joinable,
    entered,
    maybe_await,
    opener,
    sends,
)

__all__ = [
    "Action",
    "AsyncTarget",
    "Backoff",
    "FencedTask",
    "LeaseSpec",
    "Step",
    "SyncTarget",
    "TaskReport",
    "TransactionSource",
    "aeffect",
    "classify",
    "current_intent",
    "current_lease",
    "current_target",
    "effect",
    "outbox_key",
    "publish_id",
    "record_lease_name",
]

#: ``decide(record)`` returns the new state or ``fencing.SKIP``; with an async
#: store it may be a coroutine function.
Decision = Callable[[Record], Any]
OutcomeHook = Callable[[TaskReport], Any]
#: How an integration names its task for the outbox: ``route(task, options)`` returns
#: the queue kind, the task's publish name, its queue (None: the default) and the send
#: options to store (JSON values), refusing options its queue does not take.
OutboxRoute = Callable[[Any, dict[str, Any]], tuple[str, str, str | None, dict[str, Any]]]

MAX_RETRIES_LIMIT: Final = 1000


def outbox_key(intent: Intent) -> str:
    """The ordering key of an outbox row: the record the intent is about
    (``collection:orders:o-1``); a relay publishes one key's rows in order."""
    return f"{intent.kind}:{intent.collection}:{intent.key}"


def publish_id(row: OutboxRow) -> str:
    """A message/job id for an outbox row, the same on every publish of that row: a
    queue that de-duplicates by id (arq) drops a re-publish after a relay crash; on
    the others it names the row in the broker (the worker's ``Duplicate`` is the
    guarantee either way). The payload's hash keeps rows of two stores apart."""
    digest = hashlib.sha256(row.payload.encode("utf-8")).hexdigest()[:16]
    return f"fencing-outbox-{row.id}-{digest}"


def _unfinished(outcome: Outcome) -> bool:
    """``Fenced(EXPIRED)``: the lease kept running out (``apply`` took it again, bounded)
    and nobody took over; the work can still commit, so the run is retried, not acked."""
    return isinstance(outcome, Fenced) and outcome.reason is FenceReason.EXPIRED


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


class FencedTask:
    """The queue-independent half of a fenced task (see the module docstring).

    ``name`` names the task in logs and reports; ``target`` is where it commits;
    ``decide(record)`` computes the new state (or ``fencing.SKIP``); ``on_stale`` is
    the stale policy (default ``Drop()``); ``lease`` runs each task under a lease;
    ``signer`` signs payloads at enqueue and refuses unsigned or tampered ones;
    ``max_retries`` and ``backoff`` bound the retries of transient errors;
    ``retry_on`` adds exception types of ``decide`` to retry the same way;
    ``on_outcome(report)`` is called after each run, before the queue acknowledges;
    ``transaction`` runs each delivery in a transaction of the worker's own, and
    ``then(step)`` runs in it after a fenced commit (see ``_worktx``).
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
        "outbox_route",
        "outbox_supersede",
        "retry_on",
        "signer",
        "then",
        "transaction",
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
        transaction: TransactionSource | None = None,
        then: Callable[[Step], Any] | None = None,
        supersede: bool | None = None,
        debounce: float | None = None,
        max_wait: float | None = None,
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
        self._target = TargetSlot(target)
        self.decide = decide
        self.on_stale: StalePolicy = check_policy(on_stale if on_stale is not None else Drop())
        self.lease = lease
        self.signer = signer
        self.max_retries = max_retries
        self.backoff = backoff if backoff is not None else Backoff()
        self.retry_on = retry_on
        self.on_outcome = on_outcome
        self.transaction = None if transaction is None else opener(transaction)
        self.then = sends(then)
        if self.then is not None and self.transaction is None:
            raise ConfigurationError(
                "then runs inside the worker's transaction: give transaction= too"
            )
        resolved = self._target.resolved
        if self.transaction is not None and resolved is not None:
            check_joinable(resolved)
        #: set by the queue integration (``fenced_task``, ``fenced_job``, ...)
        self.outbox_route: OutboxRoute | None = None
        try:  # the default of an outbox.send that says none (``_outbox.message_from``)
            self.outbox_supersede = check_supersede(supersede, debounce, max_wait)
        except InvalidInput as exc:
            raise ConfigurationError(str(exc)) from None

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
            check_match(target, intent)
        return intent

    def encode(
        self, what: Record | Intent, transition: str | None = None, *, guard: Any = None
    ) -> str:
        """The message payload: the intent's JSON, or a signed token with a signer.

        Never pickle: the payload is a plain string any queue serializer carries.
        """
        intent = self.intent_for(what, transition, guard=guard)
        return self.signer.sign(intent) if self.signer is not None else intent.to_json()

    def outbox_message(
        self,
        task: object,
        what: Record | Intent,
        transition: str | None = None,
        *,
        guard: Any = None,
        options: dict[str, Any] | None = None,
    ) -> OutboxMessage:
        """The outbox row ``store.outbox.send(task, what, ...)`` writes: the payload
        :meth:`encode` gives (signed with a signer), the task's publish name and queue,
        the record's ordering key, and the send options (JSON values, checked before
        anything is written)."""
        route = self.outbox_route
        if route is None:
            raise InvalidInput(f"fenced task {self.name!r} was not made by a queue integration")
        kind, name, queue, opts = route(task, dict(options or {}))
        intent = self.intent_for(what, transition, guard=guard)
        payload = self.signer.sign(intent) if self.signer is not None else intent.to_json()
        return check_message(OutboxMessage(kind, name, payload, outbox_key(intent), queue, opts))

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
    def _lease_args(self, intent: Intent, target: SyncTarget | AsyncTarget) -> dict[str, Any]:
        spec = self.lease
        assert spec is not None
        # the default names the record's own lease as its store does (Redis: in the
        # record's hash slot, a table row's own key)
        own = spec.name is record_lease_name
        return {
            "name": target.lease_name(intent.key) if own else spec.name(intent),
            "owner": spec.owner_name(),
            "ttl": spec.ttl,
            "wait": spec.wait,
            "heartbeat": spec.heartbeat,
        }

    def _apply(self, target: SyncTarget, intent: Intent) -> tuple[Outcome, int | None]:
        if self.lease is None:
            return self._commit(target, intent, None), None
        store: Store = target._store
        with store.acquire(**self._lease_args(intent, target)) as lease, holding(lease):
            return self._commit(target, intent, lease), lease.token

    def _commit(self, target: SyncTarget, intent: Intent, lease: Lease | None) -> Outcome:
        if self.transaction is None:
            return target.apply(intent, self.decide, on_stale=self.on_stale, lease=lease)
        try:
            with entered(self.transaction(), want_async=False) as tx:
                bound = target.using(tx)
                outcome = bound.apply(intent, self.decide, on_stale=self.on_stale, lease=lease)
                if not isinstance(outcome, Committed):
                    raise Refused(outcome)  # leaves the transaction rolled back
                if self.then is not None:
                    self.then(Step(intent, outcome, outcome.record, tx, bound._store, bound))
                return outcome
        except Refused as refused:
            return refused.outcome

    async def _aapply(self, target: AsyncTarget, intent: Intent) -> tuple[Outcome, int | None]:
        if self.lease is None:
            return await self._acommit(target, intent, None), None
        store: AsyncStore = target._store
        async with await store.acquire(**self._lease_args(intent, target)) as lease:
            with holding(lease):
                return await self._acommit(target, intent, lease), lease.token

    async def _acommit(
        self, target: AsyncTarget, intent: Intent, lease: AsyncLease | None
    ) -> Outcome:
        if self.transaction is None:
            return await target.apply(intent, self.decide, on_stale=self.on_stale, lease=lease)
        try:
            async with entered(self.transaction(), want_async=True) as tx:
                bound = target.using(tx)
                outcome = await bound.apply(
                    intent, self.decide, on_stale=self.on_stale, lease=lease
                )
                if not isinstance(outcome, Committed):
                    raise Refused(outcome)
                if self.then is not None:
                    step = Step(intent, outcome, outcome.record, tx, bound._store, bound)
                    await maybe_await(self.then(step))
                return outcome
        except Refused as refused:
            return refused.outcome

    def run(self, payload: object, *, attempt: int = 1) -> TaskReport:
        """Decode, apply (under the lease, if any), log one record, call ``on_outcome``."""
        intent: Intent | None = None
        try:
            intent = self.decode(payload)
            target = self._target.sync()
            check_match(target, intent)
            with running_task(intent, target):
                outcome, token_used = self._apply(target, intent)
            if _unfinished(outcome):
                raise LeaseExpired(outcome)
        except Exception as exc:
            report = self._failed(intent, exc, attempt)
            if report.action is Action.FAIL and intent is not None:
                try:  # its effects are listed for reconciliation; the task fails anyway
                    self._target.sync().abandon(intent)
                except Exception as why:
                    not_abandoned(report, why)
        else:
            report = TaskReport(
                self.name, Action.ACK, outcome.kind, attempt, intent, outcome, token=token_used
            )
        emit(report)
        if self.on_outcome is not None:
            self.on_outcome(report)
        return report

    async def arun(self, payload: object, *, attempt: int = 1) -> TaskReport:
        """:meth:`run` for an async target (``decide`` and ``on_outcome`` may be async)."""
        intent: Intent | None = None
        try:
            intent = self.decode(payload)
            target = await self._target.aget()
            check_match(target, intent)
            with running_task(intent, target):
                outcome, token_used = await self._aapply(target, intent)
            if _unfinished(outcome):
                raise LeaseExpired(outcome)
        except Exception as exc:
            report = self._failed(intent, exc, attempt)
            if report.action is Action.FAIL and intent is not None:
                try:
                    await (await self._target.aget()).abandon(intent)
                except Exception as why:
                    not_abandoned(report, why)
        else:
            report = TaskReport(
                self.name, Action.ACK, outcome.kind, attempt, intent, outcome, token=token_used
            )
        emit(report)
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
        outcome = cast(Outcome, exc.outcome) if isinstance(exc, LeaseExpired) else None
        return TaskReport(self.name, action, kind, attempt, intent, outcome, exc)

    def retry_delay(self, retry: int) -> float:
        """Seconds before retry number ``retry`` (1-based), from :attr:`backoff`."""
        return self.backoff.delay(retry)
