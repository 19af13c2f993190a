"""The helpers the queue demo's runs share (``fencing._demo.queues.runner``,
``fencing._demo.scenario``), without a broker: the schedule with its held takeovers, a
mode's callbacks, the committed roots, and stopping a run's processes whatever fails."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from fencing._demo.queues import runner
from fencing._demo.queues.runner import HOLD_LIMIT, _Processes, _Takeovers, committed_roots
from fencing._demo.scenario import TaskSpec, make_schedule, start_mode


def _spec(task: int, at: float, takes_over: int | None = None) -> TaskSpec:
    spec = make_schedule(1, 1, 1)[0]
    return dataclasses.replace(spec, task=task, enqueue_at=at, takes_over=takes_over)


def test_the_schedule_comes_due_in_order() -> None:
    specs = [_spec(1, 0.0), _spec(2, 0.5), _spec(3, 2.0)]
    schedule: _Takeovers[TaskSpec] = _Takeovers(specs)
    assert schedule.next_due(-1.0) is None
    assert schedule.next_due(1.0) is specs[0]
    assert schedule.next_due(1.0) is specs[1]
    assert schedule.next_due(1.0) is None
    assert schedule.upcoming is specs[2]
    assert schedule.next_due(2.0) is specs[2]
    assert schedule.upcoming is None and schedule.next_due(99.0) is None


def test_a_takeover_is_held_until_the_task_it_takes_over_is_released() -> None:
    plain, takeover, again = _spec(1, 0.0), _spec(2, 0.0, takes_over=1), _spec(3, 0.0, 1)
    schedule: _Takeovers[str] = _Takeovers([plain, takeover, again])
    assert not schedule.hold(plain, "plain", 0.0)  # takes nothing over: goes now
    assert schedule.hold(takeover, "two", 1.0)
    assert schedule.hold(again, "three", 1.5)
    assert schedule.held == {1: ["two", "three"]}
    assert schedule.overdue(1.5 + HOLD_LIMIT) == []  # (not longer than the limit)
    assert schedule.overdue(1.6 + HOLD_LIMIT) == [1]  # since the last one held
    assert schedule.release(1) == ["two", "three"]
    assert schedule.held == {} and schedule.overdue(1e9) == []
    assert schedule.release(1) == []
    assert not schedule.hold(takeover, "late", 2.0)  # released: it goes now


def test_start_mode_says_the_start_and_advances_that_mode() -> None:
    seen: list[tuple[str, str, int]] = []
    advance = start_mode(
        "naive",
        7,
        lambda mode, total: seen.append(("start", mode, total)),
        lambda mode, n: seen.append(("advance", mode, n)),
    )
    advance(1)
    advance(2)
    assert seen == [("start", "naive", 7), ("advance", "naive", 1), ("advance", "naive", 2)]
    start_mode("fencing", 3, None, None)(1)  # no callbacks: nothing to say


def test_committed_roots_count_each_intents_commits() -> None:
    events = [
        {"outcome": "committed", "root_id": "a"},
        {"outcome": "duplicate", "root_id": "a"},
        {"outcome": "committed", "root_id": "a"},
        {"outcome": "committed", "root_id": "b"},
        {"outcome": "stale", "root_id": "c"},
        {"root_id": "d"},
    ]
    assert committed_roots(events) == {"a": 2, "b": 1}


class _Part:
    def __init__(self, log: list[str], name: str, fail: str = "") -> None:
        self.log, self.name, self.fail = log, name, fail

    def __getattr__(self, action: str) -> Any:
        def act(*args: Any) -> None:
            self.log.append(f"{self.name}.{action}")
            if action == self.fail:
                raise RuntimeError(f"{self.name}.{action} failed")

        return act


def test_stopping_the_processes_cleans_up_whatever_fails() -> None:
    log: list[str] = []
    started = _Processes()
    started.sender = _Part(log, "sender", fail="cleanup")
    started.workers = _Part(log, "workers", fail="stop")  # type: ignore[assignment]
    started.relays = _Part(log, "relays")  # type: ignore[assignment]

    def cleanup() -> None:
        log.append("cleanup")
        raise RuntimeError("the broker is gone")

    with pytest.raises(RuntimeError, match=r"workers\.stop failed"):
        started.stop(cleanup)
    assert log == ["relays.stop", "workers.stop", "sender.cleanup", "cleanup", "sender.close"]
    _Processes().stop()  # nothing started: nothing to stop


def test_the_processes_context_stops_them_and_removes_the_run_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log: list[str] = []
    monkeypatch.setattr(runner, "_exit_on_sigterm", lambda: lambda: log.append("restored"))
    temp = tmp_path / "run"
    (temp / "control").mkdir(parents=True)

    def interrupted() -> None:
        with runner.processes(temp, lambda: log.append("jobs")) as started:
            started.sender = _Part(log, "sender")
            started.workers = _Part(log, "workers")  # type: ignore[assignment]
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        interrupted()
    assert log == ["workers.stop", "sender.cleanup", "jobs", "sender.close", "restored"]
    assert not temp.exists()
