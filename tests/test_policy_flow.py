"""The apply flow's answer to an expired lease, driven step by step (no store)."""

from __future__ import annotations

from typing import Any

from fencing import Committed, Fenced, FenceReason, Record
from fencing._policy import (
    MAX_RETAKES,
    CommitStep,
    DecideStep,
    Drop,
    ProbeStep,
    RetakeStep,
    SettleStep,
    apply_flow,
)
from fencing._request import CommitResult
from fencing._rules import Status

REC = Record("orders", "o-1", 1, 0, {"status": "paid"})
DONE = Record("orders", "o-1", 2, 7, {"status": "shipped"})
EXPIRED = CommitResult(Status.FENCED_EXPIRED, REC)


def _run(answers: dict[type, list[Any]]) -> tuple[Any, list[Any]]:
    """Drive ``apply_flow``, answering each step kind from its list; return the outcome
    and the steps asked for."""
    intent = REC.intent("ship")
    flow = apply_flow(intent, Drop())
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
