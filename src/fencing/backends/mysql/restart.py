"""A MySQL flow's transaction started again after a deadlock.

InnoDB resolves a deadlock by rolling one transaction back whole (error 1213, translated
to ``errors.Deadlock``). The error is thrown back into the flow at the step that failed;
a flow marked ``@restarts_on_deadlock`` then sleeps a little (jittered, doubling) and runs
again from its start, at most ``ATTEMPTS`` times in all, and then lets it propagate (a
``TransientStoreError``). Nothing of the rolled-back attempt remains to undo.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from typing import Final, ParamSpec, TypeVar

from ..._flow import Flow, Sleep
from .errors import Deadlock

__all__ = ["ATTEMPTS", "restarts_on_deadlock"]

P = ParamSpec("P")
R = TypeVar("R")

ATTEMPTS: Final = 4


def _backoff(attempt: int) -> float:
    return random.uniform(0.0, 0.005 * 2**attempt)


def restarts_on_deadlock(make: Callable[P, Flow[R]]) -> Callable[P, Flow[R]]:
    """The flow ``make`` makes, run again from its start after a deadlock."""

    @functools.wraps(make)
    def flow(*args: P.args, **kwargs: P.kwargs) -> Flow[R]:
        attempt = 1
        while True:
            try:
                return (yield from make(*args, **kwargs))
            except Deadlock:
                if attempt >= ATTEMPTS:
                    raise
            yield Sleep(_backoff(attempt))
            attempt += 1

    return flow
