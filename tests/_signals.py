"""The process's signal state, the same before and after every test (an autouse fixture
of ``tests/conftest.py``; also a pytest plugin, ``-p tests._signals``).

A test, or a worker it runs in this process (RQ's ``Worker.work`` installs SIGINT and
SIGTERM handlers and leaves them), that leaves a signal handler, the signal mask, the
wakeup fd or the real-time interval timer changed fails in its teardown, naming what it
left; the state is put back, so the tests after it start from what was there. Without
this, a handler left behind fires in some later test (an RQ worker's ``request_stop``
raised ``StopRequested`` inside a property test once), far from the test that leaked.

The timer is left behind when it is armed, after the test, other than it was (counting
down, from no more than it was, at the same interval): it would fire in a later test. A
timer disarmed is nothing left behind (pytest-timeout arms it around every test, and a
test's own timer, or RQ's job timeout, disarms it when done).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

_SIGNALS = sorted(set(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP})


def _name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


@dataclass(frozen=True)
class Snapshot:
    handlers: dict[int, Any]
    mask: frozenset[int]
    wakeup_fd: int
    timer: tuple[float, float]
    taken: float


def take() -> Snapshot:
    wakeup_fd = signal.set_wakeup_fd(-1)
    if wakeup_fd != -1:
        signal.set_wakeup_fd(wakeup_fd)
    return Snapshot(
        handlers={s: signal.getsignal(s) for s in _SIGNALS},
        mask=frozenset(signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        wakeup_fd=wakeup_fd,
        timer=signal.getitimer(signal.ITIMER_REAL),
        taken=time.monotonic(),
    )


def _timeout_cancelled(signum: int, handler: Any, now: Any) -> bool:
    """pytest-timeout's own cancel (it runs as a test fails, before the teardown):
    its SIGALRM handler back to the default, its timer disarmed."""
    return (
        signum == signal.SIGALRM
        and getattr(handler, "__module__", None) == "pytest_timeout"
        and now == signal.SIG_DFL
        and signal.getitimer(signal.ITIMER_REAL)[0] == 0
    )


def put_back(before: Snapshot) -> list[str]:
    """Restore what changed since ``before``; what it was, one line each."""
    left: list[str] = []
    # the timer first: a timer left armed must not fire into a handler being put back
    value, interval = signal.getitimer(signal.ITIMER_REAL)
    was_value, was_interval = before.timer
    if value != 0 and not (interval == was_interval and value <= was_value):
        if was_value == 0:
            signal.setitimer(signal.ITIMER_REAL, 0)
        else:
            remaining = max(was_value - (time.monotonic() - before.taken), 0.001)
            signal.setitimer(signal.ITIMER_REAL, remaining, was_interval)
        left.append(
            f"ITIMER_REAL armed ({value:.6f} s, interval {interval} s;"
            f" was {was_value:.3f} s, interval {was_interval} s)"
        )
    mask = frozenset(signal.pthread_sigmask(signal.SIG_SETMASK, before.mask))
    if mask != before.mask:
        names = sorted(_name(s) for s in mask ^ before.mask)
        left.append(f"signal mask changed ({', '.join(names)})")
    wakeup_fd = signal.set_wakeup_fd(before.wakeup_fd)
    if wakeup_fd != before.wakeup_fd:
        left.append(f"wakeup fd {wakeup_fd} (was {before.wakeup_fd})")
    for signum, handler in before.handlers.items():
        now = signal.getsignal(signum)
        if now != handler and not _timeout_cancelled(signum, handler, now):
            signal.signal(signum, handler)
            left.append(f"{_name(signum)} handler {now!r} (was {handler!r})")
    return left


@pytest.fixture(autouse=True)
def _signals_as_they_were() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield  # (signals are the main thread's; a test run elsewhere cannot touch them)
        return
    before = take()
    yield
    left = put_back(before)
    if left:
        pytest.fail("this test left behind: " + "; ".join(left), pytrace=False)
