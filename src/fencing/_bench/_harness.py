"""Measure fencing beside hand-written baselines, alternately, and summarise as rows.

A :class:`Contest` holds one operation measured several ways: ``sides[0]`` is fencing,
the others are hand-written baselines that give the same guarantee. Every round runs
one block of ``n`` calls per side, in an order that rotates and reverses from round to
round (A B, B A, B A, A B, ...), so machine noise and drift hit every side alike. Time
per call (and ops/s) is the median over rounds of each block's mean; the ratio is the
median over rounds of fencing's block time over the baseline's block time in the same
round; p50 and p99 come from every call of every round. Peak memory is measured in a
separate, untimed block per side with ``tracemalloc`` on (tracing slows Python code
several-fold, and would slow fencing's Python more than the driver's C: it must not run
during timed blocks).
"""

from __future__ import annotations

import gc
import math
import statistics
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from .._errors import FencingError

__all__ = [
    "BenchFailed",
    "Block",
    "Contest",
    "ContestResult",
    "Plan",
    "Side",
    "Skip",
    "measure",
    "rows_for",
]

#: One call of a stage: ``op(i)`` for ``i`` in ``range(n)``.
Op = Callable[[int], object]


class BenchFailed(FencingError):
    """A measured call did not do what it must (a commit that did not commit)."""


@dataclass
class Block:
    """What one side runs in one measured block; prepared outside the timing.

    ``stages`` run in order for every ``i`` and are timed separately (the lease cycle
    acquire, renew, release is one block of three stages). ``close`` runs after the
    block, untimed.
    """

    stages: Sequence[Op]
    close: Callable[[], None] | None = None


#: Issue 21's targets: fencing's time per operation over the same-answer baseline's.
SINGLE_TARGET: Final = 1.10  # single commits, apply, fenced commits, leases
NORMAL_TARGET: Final = 1.25  # the same on SQLite at synchronous=NORMAL (a ~40 us commit)
MANY_TARGET: Final = 1.15  # commit_many beside the store's hand-written batch


@dataclass(frozen=True)
class Side:
    """One way of doing the operation: ``prepare(n)`` returns a block of ``n`` calls."""

    label: str  # "fencing" or "hand-written"
    method: str  # what it runs, for the reader
    prepare: Callable[[int], Block]


@dataclass(frozen=True)
class Contest:
    """One operation (or a cycle of stages), fencing (``sides[0]``) beside baselines."""

    stages: tuple[str, ...]
    sides: tuple[Side, ...]
    per_call: int = 1  # commits per call: 100 for commit_many
    target: float | None = None  # the most fencing/baseline time ratio the target allows


@dataclass(frozen=True)
class Skip:
    """An operation a store cannot run here, and why."""

    operation: str
    reason: str


@dataclass(frozen=True)
class Plan:
    """How much to measure: ``ops`` calls per block, or calibrated to ``seconds``."""

    rounds: int = 10
    ops: int | None = None
    seconds: float = 5.0  # per contest: all sides, all rounds
    warmup: int = 20
    min_ops: int = 20
    max_ops: int = 20_000
    memory: bool = True


@dataclass
class Sample:
    """One side's numbers for one stage."""

    per_round: list[float] = field(default_factory=list)  # mean ns per call, per round
    latencies: list[int] = field(default_factory=list)  # ns per call, every round
    peak_bytes: int = 0


@dataclass
class ContestResult:
    contest: Contest
    ops: int
    rounds: int
    samples: list[list[Sample]]  # [side][stage]


def _run(block: Block, n: int) -> list[list[int]]:
    stages = block.stages
    clock = time.perf_counter_ns
    out = [[0] * n for _ in stages]
    try:
        if len(stages) == 1:
            op, lat = stages[0], out[0]
            for i in range(n):
                t0 = clock()
                op(i)
                lat[i] = clock() - t0
        else:
            for i in range(n):
                for s, op in enumerate(stages):
                    t0 = clock()
                    op(i)
                    out[s][i] = clock() - t0
    finally:
        if block.close is not None:
            block.close()
    return out


def _peak(side: Side, n: int) -> int:
    """The tracemalloc peak of one block, untimed (no latency lists to skew it)."""
    block = side.prepare(n)
    stages = block.stages
    gc.collect()
    tracemalloc.start()
    try:
        for i in range(n):
            for op in stages:
                op(i)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        if block.close is not None:
            block.close()


def order(sides: int, round_no: int) -> list[int]:
    """The order of the sides in a round: rotated each round, reversed every other cycle."""
    shift = round_no % sides
    seq = list(range(shift, sides)) + list(range(shift))
    if (round_no // sides) % 2 == 1:
        seq.reverse()
    return seq


def calls_per_block(plan: Plan, warm_ns: Sequence[float]) -> int:
    """``plan.ops``, or as many calls as fit ``plan.seconds`` given the warm-up's pace."""
    if plan.ops is not None:
        return plan.ops
    per_round = plan.seconds * 1e9 / plan.rounds
    n = int(per_round / max(1.0, sum(warm_ns)))
    return max(plan.min_ops, min(plan.max_ops, n))


def measure(contest: Contest, plan: Plan, tick: Callable[[], None] | None = None) -> ContestResult:
    """Warm up, then ``plan.rounds`` rounds of one block per side, then peak memory.

    With a time budget (no ``plan.ops``), a machine that slows down after the warm-up
    ends the contest early, after whole rounds only and at least half of them, once
    twice the budget is spent: every side keeps the same number of blocks.
    """
    sides = contest.sides
    warm_ns: list[float] = []
    for side in sides:
        w = max(1, plan.warmup)
        warm = _run(side.prepare(w), w)
        warm_ns.append(sum(sum(stage) for stage in warm) / w)
    n = calls_per_block(plan, warm_ns)
    samples = [[Sample() for _ in contest.stages] for _ in sides]
    started, rounds = time.monotonic(), 0
    for r in range(plan.rounds):
        for idx in order(len(sides), r):
            block = sides[idx].prepare(n)
            gc.collect()
            for stage, lat in enumerate(_run(block, n)):
                sample = samples[idx][stage]
                sample.per_round.append(sum(lat) / n)
                sample.latencies.extend(lat)
        rounds += 1
        if tick is not None:
            tick()
        overdue = time.monotonic() - started > 2 * plan.seconds
        if plan.ops is None and overdue and 2 * rounds >= plan.rounds:
            break
    if plan.memory:
        for idx in order(len(sides), rounds):
            peak = _peak(sides[idx], n)
            for sample in samples[idx]:
                sample.peak_bytes = peak
    return ContestResult(contest, n, rounds, samples)


def percentile(values: Sequence[int], q: float, *, ordered: bool = False) -> float:
    """The nearest-rank percentile (``q`` in 0..1) of ``values`` (already sorted if
    ``ordered``)."""
    if not ordered:
        values = sorted(values)
    return float(values[max(0, math.ceil(q * len(values)) - 1)])


#: The latency percentiles each side reports (``<side>_p<N>_us``): the report's box plots.
PERCENTILES: Final = (10, 25, 50, 75, 90, 99)


def _side_numbers(prefix: str, sample: Sample, per_call: int) -> dict[str, Any]:
    median_ns = statistics.median(sample.per_round)
    ordered = sorted(sample.latencies)
    return {
        f"{prefix}_ops_per_s": per_call * 1e9 / median_ns,
        f"{prefix}_us_per_call": median_ns / 1e3,
        **{
            f"{prefix}_p{q}_us": percentile(ordered, q / 100, ordered=True) / 1e3
            for q in PERCENTILES
        },
        f"{prefix}_peak_kib": sample.peak_bytes / 1024,
    }


def rows_for(result: ContestResult, store: str, setting: str) -> list[dict[str, Any]]:
    """One row per stage and baseline: fencing's numbers, the baseline's, their ratio."""
    contest = result.contest
    fencing_side = contest.sides[0]
    rows: list[dict[str, Any]] = []
    for b, baseline in enumerate(contest.sides[1:], start=1):
        for stage, operation in enumerate(contest.stages):
            ours, theirs = result.samples[0][stage], result.samples[b][stage]
            paired = [f / h for f, h in zip(ours.per_round, theirs.per_round, strict=True) if h > 0]
            # Each round's pair ran back to back: the median of their ratios cancels
            # the machine's drift better than a ratio of two medians.
            ratio = statistics.median(paired)
            of_medians = statistics.median(ours.per_round) / statistics.median(theirs.per_round)
            target = contest.target if b == 1 else None  # the same-answer baseline
            rows.append(
                {
                    "kind": "pair",
                    "store": store,
                    "setting": setting,
                    "operation": operation,
                    "fencing_method": fencing_side.method,
                    "baseline": baseline.label,
                    "baseline_method": baseline.method,
                    "commits_per_call": contest.per_call,
                    "rounds": result.rounds,
                    "calls_per_round": result.ops,
                    **_side_numbers("fencing", ours, contest.per_call),
                    **_side_numbers("baseline", theirs, contest.per_call),
                    "ratio": ratio,
                    "ratio_of_medians": of_medians,
                    "ratio_low": min(paired),
                    "ratio_high": max(paired),
                    "target_ratio": target,
                    "target_met": None if target is None else ratio <= target,
                }
            )
    return rows
