"""The apply flow driven step by step (no store): its answer to an expired lease, the
outcomes it ends with, its sleeps between recomputes; the policies' own checks."""

from __future__ import annotations

import random
import re
from typing import Any

import pytest

from fencing import (
    SKIP,
    Committed,
    Fenced,
    FenceReason,
    InvalidInput,
    Recompute,
    Reconcile,
    Record,
    Skipped,
    Stale,
)
from fencing._flow import Sleep
from fencing._policy import (
    MAX_RETAKES,
    AcquireStep,
    CommitStep,
    DecideStep,
    Drop,
    ProbeStep,
    ReconcileStep,
    RenewStep,
    RetakeStep,
    SettleStep,
    StalePolicy,
    apply_flow,
    check_policy,
    heartbeat_flow,
    lease_wait_flow,
)
from fencing._request import CommitResult, LeaseAnswer
from fencing._rules import LeaseRow, Status

REC = Record("orders", "o-1", 1, 0, {"status": "paid"})
DONE = Record("orders", "o-1", 2, 7, {"status": "shipped"})
EXPIRED = CommitResult(Status.FENCED_EXPIRED, REC)


INTENT = REC.intent("ship")


def _run(
    answers: dict[type, list[Any]],
    policy: StalePolicy | None = None,
    rng: random.Random | None = None,
) -> tuple[Any, list[Any]]:
    """Drive ``apply_flow`` of ``INTENT``, answering each step kind from its list; return
    the outcome and the steps asked for."""
    flow = apply_flow(INTENT, policy or Drop(), rng)
    steps: list[Any] = []
    try:
        step = next(flow)
        while True:
            steps.append(step)
            step = flow.send(answers[type(step)].pop(0))
    except StopIteration as stop:
        return stop.value, steps


def test_an_expired_commit_is_made_again_under_the_lease_taken_again() -> None:
    outcome, steps = _run(
        {
            ProbeStep: [CommitResult(Status.OK, REC)],
            DecideStep: [{"status": "shipped"}],
            CommitStep: [EXPIRED, CommitResult(Status.APPLIED, DONE)],
            RetakeStep: [True],
        }
    )
    assert isinstance(outcome, Committed) and outcome.record is DONE
    kinds = [type(s) for s in steps]
    assert kinds == [ProbeStep, DecideStep, CommitStep, RetakeStep, CommitStep]
    assert steps[2] == steps[4]  # the same intent and state, decide not run again


def test_an_expired_probe_probes_again() -> None:
    outcome, steps = _run(
        {
            ProbeStep: [EXPIRED, CommitResult(Status.OK, REC)],
            DecideStep: [{"status": "shipped"}],
            CommitStep: [CommitResult(Status.APPLIED, DONE)],
            RetakeStep: [True],
        }
    )
    assert isinstance(outcome, Committed)
    assert [type(s) for s in steps] == [ProbeStep, RetakeStep, ProbeStep, DecideStep, CommitStep]


def test_retakes_are_bounded_then_the_answer_is_fenced_expired() -> None:
    outcome, steps = _run(
        {
            ProbeStep: [CommitResult(Status.OK, REC)],
            DecideStep: [{"status": "shipped"}],
            CommitStep: [EXPIRED] * (MAX_RETAKES + 1),
            RetakeStep: [True] * MAX_RETAKES,
        }
    )
    assert isinstance(outcome, Fenced) and outcome.reason is FenceReason.EXPIRED
    assert [type(s) for s in steps].count(RetakeStep) == MAX_RETAKES == 3
    assert not any(isinstance(s, SettleStep) for s in steps)  # not final: no settling


def test_a_lease_someone_else_holds_now_is_fenced_newer_and_settles() -> None:
    outcome, steps = _run(
        {
            ProbeStep: [CommitResult(Status.OK, REC)],
            DecideStep: [{"status": "shipped"}],
            CommitStep: [EXPIRED],
            RetakeStep: [False],
            SettleStep: [[]],
        }
    )
    assert isinstance(outcome, Fenced) and outcome.reason is FenceReason.NEWER_OWNER
    assert outcome.current is REC and outcome.intent is INTENT
    assert isinstance(steps[-1], SettleStep) and steps[-1].outcome == "fenced"


def test_a_released_lease_is_not_taken_again() -> None:
    outcome, steps = _run(
        {
            ProbeStep: [CommitResult(Status.OK, REC)],
            DecideStep: [{"status": "shipped"}],
            CommitStep: [EXPIRED],
            RetakeStep: [None],
        }
    )
    assert isinstance(outcome, Fenced) and outcome.reason is FenceReason.EXPIRED
    assert [type(s) for s in steps].count(RetakeStep) == 1


NEWER = Record("orders", "o-1", 5, 0, {"status": "cancelled"})
STALE = CommitResult(Status.STALE, NEWER)


def test_a_skip_answers_skipped_with_the_record_and_the_intent() -> None:
    outcome, steps = _run({ProbeStep: [CommitResult(Status.OK, REC)], DecideStep: [SKIP]})
    assert isinstance(outcome, Skipped)
    assert outcome.current is REC and outcome.intent is INTENT
    assert [type(s) for s in steps] == [ProbeStep, DecideStep]


def test_reconcile_gets_the_settled_effects_and_answers_stale_with_the_intent() -> None:
    effects = ["effect-1", "effect-2"]
    outcome, steps = _run(
        {
            ProbeStep: [CommitResult(Status.OK, REC)],
            DecideStep: [{"status": "shipped"}],
            CommitStep: [STALE],
            SettleStep: [effects],
            ReconcileStep: [None],
        },
        Reconcile(print),
    )
    assert isinstance(outcome, Stale)
    assert outcome.current is NEWER and outcome.intent is INTENT
    assert steps[-2] == SettleStep(INTENT, "stale")
    assert steps[-1] == ReconcileStep(INTENT, NEWER, ("effect-1", "effect-2"))  # type: ignore[arg-type]


class Ceiling(random.Random):
    """A "random" source whose ``uniform(a, b)`` is always ``b``: the jitter's ceiling."""

    def uniform(self, a: float, b: float) -> float:
        return b


def test_a_stale_probe_recomputes_at_once_and_later_recomputes_sleep_under_the_rng() -> None:
    """The first decide against a record found stale by the probe needs no pause; each
    later one sleeps, drawn from the flow's ``rng`` (never the module's random)."""
    policy = Recompute(attempts=3, backoff=0.5, max_backoff=100.0)
    outcome, steps = _run(
        {
            ProbeStep: [STALE],
            DecideStep: [{"a": 1}, {"a": 2}, {"a": 3}],
            CommitStep: [STALE, STALE, STALE],
            Sleep: [None, None],
            SettleStep: [[]],
        },
        policy,
        Ceiling(),
    )
    kinds = [type(s).__name__ for s in steps]
    assert kinds == [
        "ProbeStep",
        "DecideStep",
        "CommitStep",
        "Sleep",
        "DecideStep",
        "CommitStep",
        "Sleep",
        "DecideStep",
        "CommitStep",
        "SettleStep",
    ]
    assert [s.seconds for s in steps if isinstance(s, Sleep)] == [0.5, 1.0]
    assert outcome.attempts == 3 and outcome.intent.expected_version == NEWER.version


@pytest.mark.parametrize(
    ("attempt", "ceiling"), [(1, 0.01), (2, 0.02), (3, 0.04), (4, 0.05), (40, 0.05)]
)
def test_recompute_delay_doubles_from_backoff_up_to_max_backoff(
    attempt: int, ceiling: float
) -> None:
    policy = Recompute(attempts=50, backoff=0.01, max_backoff=0.05)
    assert policy.delay(attempt, Ceiling()) == pytest.approx(ceiling)


def test_recompute_delay_stops_doubling_after_32_doublings() -> None:
    policy = Recompute(attempts=1000, backoff=1.0, max_backoff=1e300)
    assert policy.delay(33, Ceiling()) == 2.0**32
    assert policy.delay(1000, Ceiling()) == 2.0**32


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: Recompute(attempts="3"),  # type: ignore[arg-type]
            "Recompute attempts must be an integer, not '3'",
        ),
        (lambda: Recompute(attempts=True), "Recompute attempts must be an integer, not True"),
        (lambda: Recompute(attempts=0), "Recompute attempts must be 1 to 1000, not 0"),
        (lambda: Recompute(attempts=1001), "Recompute attempts must be 1 to 1000, not 1001"),
        (lambda: Recompute(backoff=-1), "Recompute backoff must be a non-negative number"),
        (
            lambda: Recompute(max_backoff=float("nan")),
            "Recompute max_backoff must be a non-negative number",
        ),
        (
            lambda: Reconcile("handler"),  # type: ignore[arg-type]
            "Reconcile needs a callable handler(intent, current, effects)",
        ),
        (
            lambda: check_policy("drop"),
            "on_stale must be Drop(), Recompute(...) or Reconcile(...), not 'drop'",
        ),
    ],
)
def test_a_policy_refused_says_why(make: Any, message: str) -> None:
    with pytest.raises(InvalidInput, match=f"^{re.escape(message)}$"):
        make()


# -- waiting for a held lease, and the heartbeat ------------------------------------------
class Bounds(random.Random):
    """A "random" source that answers the ceiling of ``uniform(a, b)`` and keeps each
    ``(a, b)`` it was asked for."""

    def __init__(self) -> None:
        super().__init__(0)
        self.asked: list[tuple[float, float]] = []

    def uniform(self, a: float, b: float) -> float:
        self.asked.append((a, b))
        return b


def _held(expires_in: float, owner: str | None = "x") -> LeaseAnswer:
    """Held by ``owner`` until ``expires_in`` from now, by the store's clock (at 4)."""
    return LeaseAnswer(False, LeaseRow("l", owner, 1, 4.0 + expires_in), 4.0)


def _wait(
    wait: float | None, answers: list[LeaseAnswer], times: list[float]
) -> tuple[LeaseAnswer, list[float], list[tuple[float, float]]]:
    """Drive ``lease_wait_flow``: each acquire answered from ``answers``; the clock reads
    ``times``. Returns the answer it ended with, its sleeps, the jitter's bounds."""
    clock = iter(times)
    rng = Bounds()
    flow = lease_wait_flow(wait, lambda: next(clock), rng)
    sleeps: list[float] = []
    try:
        step = next(flow)
        while True:
            if isinstance(step, AcquireStep):
                step = flow.send(answers.pop(0))
            else:
                assert isinstance(step, Sleep)
                sleeps.append(step.seconds)
                step = flow.send(None)
    except StopIteration as stop:
        assert not answers  # every answer was asked for
        return stop.value, sleeps, rng.asked


def test_waiting_for_a_lease_sleeps_until_its_expiry_doubling_up_to_a_quarter_second() -> None:
    """Each pause is the shortest of: the time left to wait, the holder's expiry (by the
    store's clock; a released or unknown row: no expiry), and a delay that doubles from
    5 ms up to 0.25 s; never under 1 ms; jittered over its upper half. Waiting ends when
    no time is left (exactly 0 too), with the last answer."""
    answers = [
        _held(0.003),  # expiry in 3 ms, before the 5 ms delay
        LeaseAnswer(False, None, 0.0),  # no row: the delay, 10 ms
        _held(0.0, owner=None),  # released: the delay, 20 ms
        _held(10.0),  # far: the delay, 40 ms
        _held(0.0005),  # in 0.5 ms: at least 1 ms
        _held(10.0),  # 160 ms
        _held(10.0),  # 250 ms (not 320)
        _held(10.0),  # 250 ms, but 125 ms are left
        _held(10.0),  # nothing left: the end
    ]
    last = answers[-1]
    times = [100.0, 100.0, 100.5, 100.5, 100.5, 100.5, 100.5, 100.5, 101.875, 102.0]
    out, sleeps, asked = _wait(2.0, answers, times)
    assert out is last
    expected = [0.003, 0.01, 0.02, 0.04, 0.001, 0.16, 0.25, 0.125]
    assert sleeps == pytest.approx(expected)
    assert [low for low, _ in asked] == pytest.approx([s / 2 for s in expected])
    assert [high for _, high in asked] == sleeps


def test_a_granted_lease_or_no_wait_ends_at_the_first_answer() -> None:
    granted = LeaseAnswer(True, LeaseRow("l", "me", 2, 30.0), 0.0)
    assert _wait(5.0, [granted], [100.0]) == (granted, [], [])
    held = _held(10.0)
    assert _wait(None, [held], []) == (held, [], [])
    assert _wait(0.0, [held], [100.0, 100.0]) == (held, [], [])


def _beat(
    ttl: float, interval: float, results: list[object], times: list[float]
) -> tuple[str | None, list[float]]:
    clock = iter(times)
    flow = heartbeat_flow(ttl, interval, lambda: next(clock))
    sleeps: list[float] = []
    try:
        step = next(flow)
        while True:
            if isinstance(step, RenewStep):
                step = flow.send(results.pop(0))
            else:
                sleeps.append(step.seconds)
                step = flow.send(None)
    except StopIteration as stop:
        assert not results
        return stop.value, sleeps


def test_the_heartbeat_retries_errors_for_one_ttl_from_its_last_renewal() -> None:
    """Renewed at 3 (the last success), errors at 12.9 (9.9 s since: retried) and at 13
    (a whole TTL: lost, with the error); a refusal ends it with None at once; with no
    renewal yet, the TTL counts from the start."""
    errors = [True, OSError("down"), OSError("still down")]
    assert _beat(10.0, 3.0, errors, [0.0, 3.0, 12.9, 13.0]) == (
        "renewal failed: still down",
        [3.0, 3.0, 3.0],
    )
    assert _beat(10.0, 2.0, [True, False], [0.0, 2.0]) == (None, [2.0, 2.0])
    # never renewed: a TTL from the start
    errors = [OSError("a"), OSError("b")]
    assert _beat(10.0, 5.0, errors, [0.0, 9.9, 10.0]) == ("renewal failed: b", [5.0, 5.0])
