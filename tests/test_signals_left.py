"""``tests/_signals.py``, the autouse fixture every test runs under: a test that leaves a
signal handler, the real-time timer or the signal mask behind fails in its own teardown,
naming what it left, and the tests after it start from what was there (issue 18: an RQ
worker's SIGTERM handler, left in the pytest process, raised ``StopRequested`` inside a
later property test). Judged on a pytest run of its own, under pytest-timeout as
``make test`` runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

LEAKY = """
import signal


def test_leaves_a_handler():
    signal.signal(signal.SIGTERM, lambda *_: None)


def test_leaves_the_timer_armed():
    signal.setitimer(signal.ITIMER_REAL, 1000)


def test_leaves_a_signal_blocked():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})


def test_after_them_all_is_as_it_was():
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    assert signal.getitimer(signal.ITIMER_REAL)[0] <= 300
    assert signal.SIGUSR2 not in signal.pthread_sigmask(signal.SIG_BLOCK, [])


def test_puts_back_what_it_changes():
    old = signal.signal(signal.SIGTERM, lambda *_: None)
    previous = signal.setitimer(signal.ITIMER_REAL, 1000)
    signal.setitimer(signal.ITIMER_REAL, *previous)
    signal.signal(signal.SIGTERM, old)


def test_fails_with_the_timeout_cancelled():
    assert False, "a failing test: pytest-timeout cancels its own timer as it fails"
"""


def test_a_test_that_leaves_a_signal_behind_fails_naming_it(tmp_path: Path) -> None:
    (tmp_path / "test_leaky.py").write_text(LEAKY)
    plugins = ["-p", "tests._signals", "-p", "no:cacheprovider"]
    argv = [sys.executable, "-m", "pytest", *plugins, "--timeout", "300", "-q", "-rfE"]
    done = subprocess.run(
        [*argv, str(tmp_path / "test_leaky.py")],
        cwd=REPO,
        env={**os.environ, "COLUMNS": "1000"},  # the summary's lines whole
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 1, out
    summary = [line for line in out.splitlines() if line.startswith(("ERROR ", "FAILED "))]
    errors = {line.split("::")[1].split()[0]: line for line in summary if line[0] == "E"}
    assert set(errors) == {
        "test_leaves_a_handler",
        "test_leaves_the_timer_armed",
        "test_leaves_a_signal_blocked",
    }, out
    assert "SIGTERM handler" in errors["test_leaves_a_handler"]
    assert "ITIMER_REAL armed" in errors["test_leaves_the_timer_armed"]
    assert "signal mask changed (SIGUSR2)" in errors["test_leaves_a_signal_blocked"]
    failed = [line for line in summary if line[0] == "F"]
    assert len(failed) == 1 and "test_fails_with_the_timeout_cancelled" in failed[0], out
    assert "5 passed" in out, out
