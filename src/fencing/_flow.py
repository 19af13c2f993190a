"""Flows and their drivers: the bottom layer under the policy and every backend.

A *flow* is a generator that yields the steps it needs carried out (a statement, a
script call, a sleep, ...) and receives each step's result; it holds the logic and does
no I/O. A *driver* carries the steps out: ``drive`` synchronously, ``adrive`` on an
event loop. The same flow therefore runs on both, and on any connection its driver
chooses (the store's pool, or a connection the caller gives).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from ._errors import FencingError

__all__ = ["Flow", "Sleep", "adrive", "drive"]

R = TypeVar("R")

#: A flow: yields steps, receives their results, returns ``R``.
Flow = Generator[Any, Any, R]


@dataclass(frozen=True, slots=True)
class Sleep:
    """A step: pause for ``seconds`` (the driver's own sleep: blocking or awaited)."""

    seconds: float


def drive(flow: Flow[R], handle: Callable[[Any], Any]) -> R:
    """Run a flow synchronously: ``handle(step)`` carries out each step.

    A ``FencingError`` raised by a step is thrown back into the flow at that step, so
    a flow may handle it (a backend re-runs a statement); otherwise it propagates.
    This is the one way a retry happens: the flow decides, at the step that failed.
    """
    try:
        step = next(flow)
        while True:
            try:
                result = handle(step)
            except FencingError as exc:
                step = flow.throw(exc)
            else:
                step = flow.send(result)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


async def adrive(flow: Flow[R], handle: Callable[[Any], Awaitable[Any]]) -> R:
    """Run a flow on an event loop: ``await handle(step)`` carries out each step."""
    try:
        step = next(flow)
        while True:
            try:
                result = await handle(step)
            except FencingError as exc:
                step = flow.throw(exc)
            else:
                step = flow.send(result)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
