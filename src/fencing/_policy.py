"""Stale policies and the apply state machine, free of I/O.

``apply_flow`` is a generator that yields the steps it needs (probe, decide,
commit, sleep, reconcile) and receives their results; the sync and async stores
only drive it (``drive`` / ``adrive``), so the logic exists once.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ._effects import Effect, settles
from ._errors import InvalidInput
from ._flow import Flow, Sleep
from ._request import CommitResult, outcome_for
from ._rules import Status
from ._values import (
    SKIP,
    Contended,
    Intent,
    Outcome,
    Record,
    Skipped,
    Stale,
)

__all__ = [
    "MAX_RETAKES",
    "Drop",
    "Recompute",
    "Reconcile",
    "StalePolicy",
    "apply_flow",
    "heartbeat_flow",
    "lease_wait_flow",
    "settle_flow",
]

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Drop:
    """On ``Stale``: stop and report the ``Stale`` outcome. The default."""


@dataclass(frozen=True, slots=True)
class Recompute:
    """On ``Stale``: re-run ``decide`` against the current record, at most ``attempts`` times.

    ``attempts`` counts calls of ``decide``; between attempts it sleeps a full-jitter
    exponential backoff (``backoff * 2**n``, capped at ``max_backoff``). When the
    attempts run out the outcome is ``Contended``.
    """

    attempts: int = 3
    backoff: float = 0.005
    max_backoff: float = 0.5

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int):
            raise InvalidInput(f"Recompute attempts must be an integer, not {self.attempts!r}")
        if not 1 <= self.attempts <= 1000:
            raise InvalidInput(f"Recompute attempts must be 1 to 1000, not {self.attempts}")
        for name in ("backoff", "max_backoff"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value < 0
            ):
                raise InvalidInput(f"Recompute {name} must be a non-negative number")

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """The jittered sleep before recompute number ``attempt`` (1-based)."""
        cap = min(self.max_backoff, self.backoff * 2 ** min(attempt - 1, 32))
        return (rng or random).uniform(0.0, cap)


#: ``handler(intent, current, effects)``; may return an awaitable in async stores.
ReconcileHandler = Callable[[Intent, Record, Sequence[Any]], Any]


@dataclass(frozen=True, slots=True)
class Reconcile:
    """On ``Stale``: an external effect already happened; call ``handler`` once.

    The handler gets the intent, the current record, and the effects recorded for
    the intent; the outcome stays ``Stale``.
    """

    handler: ReconcileHandler

    def __post_init__(self) -> None:
        if not callable(self.handler):
            raise InvalidInput("Reconcile needs a callable handler(intent, current, effects)")


StalePolicy = Drop | Recompute | Reconcile


def check_policy(policy: object) -> StalePolicy:
    if not isinstance(policy, Drop | Recompute | Reconcile):
        raise InvalidInput(
            f"on_stale must be Drop(), Recompute(...) or Reconcile(...), not {policy!r}"
        )
    return policy


# -- the steps a flow asks its driver to carry out -----------------------------------
@dataclass(frozen=True, slots=True)
class ProbeStep:
    intent: Intent


@dataclass(frozen=True, slots=True)
class DecideStep:
    record: Record


@dataclass(frozen=True, slots=True)
class CommitStep:
    intent: Intent
    state: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ReconcileStep:
    intent: Intent
    record: Record
    effects: tuple[Effect, ...] = ()


@dataclass(frozen=True, slots=True)
class SettleStep:
    """Mark the intent's recorded effects with the outcome that ended it uncommitted."""

    intent: Intent
    outcome: str


@dataclass(frozen=True, slots=True)
class RetakeStep:
    """Take the commit's lease again under a new token, without waiting: it ran out by the
    store's clock and nobody took over. The driver answers True if it did (the lease
    object now holds the new token), False if someone else holds the lease now, None if
    the lease cannot be taken again (it was released)."""


Step = ProbeStep | DecideStep | CommitStep | Sleep | ReconcileStep | SettleStep | RetakeStep

#: How many times one ``apply`` takes an expired lease again (the worker was paused past
#: its TTL and nobody took over) before it answers ``Fenced(EXPIRED)``.
MAX_RETAKES = 3


def _recompute_intent(intent: Intent, current: Record, attempt: int) -> Intent:
    if intent.expected_version is not None:
        return intent.derive(current.version, attempt)
    # A guard-only intent (a table with no version column) re-guards the same
    # fields at their current values: decide() has judged the current state.
    guard = {f: current.state.get(f) for f in intent.guard or ()}
    return intent.derive(None, attempt, guard=guard)


def apply_flow(
    intent: Intent, policy: StalePolicy, rng: random.Random | None = None
) -> Flow[Outcome]:
    """Probe, decide, commit; on Stale follow the policy. Never more than N decides.

    A lease that ran out with nobody taking over is not an obsolete decision: the
    lease is taken again (``RetakeStep``) and the same state committed, at most
    ``MAX_RETAKES`` times; the store still judges that commit (a record that moved on
    meanwhile answers ``Stale``). If someone else holds the lease by then, the answer
    is ``Fenced(NEWER_OWNER)``. An outcome that ends the work uncommitted for good
    (stale, fenced by a newer owner, contended, missing) settles the intent's recorded
    effects; ``Reconcile``'s handler gets them.
    """
    result: CommitResult = yield ProbeStep(intent)
    current = intent
    calls = 0
    retakes = 0
    pending: Mapping[str, Any] | None = None  # the state of the commit just answered
    while True:
        if result.status is Status.FENCED_EXPIRED and retakes < MAX_RETAKES:
            retakes += 1
            taken = yield RetakeStep()
            if taken:
                step = ProbeStep(current) if pending is None else CommitStep(current, pending)
                result = yield step
                continue
            if taken is False:  # someone holds the lease now
                result = CommitResult(Status.FENCED_NEWER, result.record)
            else:  # None: this lease cannot be taken again (released)
                retakes = MAX_RETAKES
        if result.status is Status.OK and result.record is not None:
            calls += 1
            state = yield DecideStep(result.record)
            if state is SKIP:
                return Skipped(result.record, current)
            pending = state
            result = yield CommitStep(current, state)
            continue
        if result.status is not Status.STALE or result.record is None:
            outcome = outcome_for(result, current)
            if outcome.committed:  # nothing to settle
                return outcome
            return (yield from settle_flow(outcome, result.unsettled))
        record = result.record
        pending = None
        if isinstance(policy, Recompute):
            if calls >= policy.attempts:
                return (yield from settle_flow(Contended(record, calls, current), result.unsettled))
            if calls > 0:
                yield Sleep(policy.delay(calls, rng))
            current = _recompute_intent(intent, record, calls + 1)
            result = CommitResult(Status.OK, record)
            continue
        if isinstance(policy, Reconcile):
            effects: list[Effect] = yield SettleStep(current, "stale")
            yield ReconcileStep(current, record, tuple(effects))
            return Stale(record, current)
        return (yield from settle_flow(Stale(record, current), result.unsettled))


def settle_flow(outcome: Outcome, unsettled: bool) -> Flow[Outcome]:
    """Settle the intent's effects if ``outcome`` ended it uncommitted; return ``outcome``.
    ``unsettled=False``: the store answered, with the refusal, that the intent has no
    effect left to settle (``CommitResult.unsettled``): nothing to ask it."""
    kind = settles(outcome)
    intent = getattr(outcome, "intent", None)
    if unsettled and kind is not None and intent is not None:
        yield SettleStep(intent, kind)
    return outcome


# -- leases: waiting for a held lease, and the heartbeat ------------------------------
@dataclass(frozen=True, slots=True)
class AcquireStep:
    pass


@dataclass(frozen=True, slots=True)
class RenewStep:
    pass


def lease_wait_flow(
    wait: float | None,
    clock: Callable[[], float] = time.monotonic,
    rng: random.Random | None = None,
) -> Flow[Any]:
    """Try to acquire; while held, sleep (jittered, at most until the holder's expiry)."""
    deadline = None if wait is None else clock() + wait
    delay = 0.005
    while True:
        answer = yield AcquireStep()
        if answer.granted or deadline is None:
            return answer
        left = deadline - clock()
        if left <= 0:
            return answer
        row = answer.row
        until_expiry = row.expires_at - answer.now if row is not None and row.owner else delay
        pause = min(left, max(0.001, min(until_expiry, delay)))
        yield Sleep((rng or random).uniform(pause / 2, pause))
        delay = min(delay * 2, 0.25)


def heartbeat_flow(
    ttl: float, interval: float, clock: Callable[[], float] = time.monotonic
) -> Flow[str | None]:
    """Renew every ``interval``; end with the reason the lease was lost.

    A renewal answers True (renewed), False (the store says the token lost the
    lease) or an exception (the store could not be reached): those are retried
    until a whole TTL has passed since the last successful renewal.
    """
    last_ok = clock()
    while True:
        yield Sleep(interval)
        result = yield RenewStep()
        if result is True:
            last_ok = clock()
        elif result is False:
            return None
        elif clock() - last_ok >= ttl:
            return f"renewal failed: {result}"
