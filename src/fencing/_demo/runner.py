"""The demo's two runs on one schedule: naive, then fencing (:func:`run_demo`)."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import fencing

from ..testing import HistoryWriter
from .broker import Broker, Pool
from .config import DemoConfig, validate
from .queues import run_queue_demo
from .report import write_report
from .scenario import (
    MODES,
    RunResult,
    TaskSpec,
    capture_intent,
    create_records,
    finish_run,
    make_schedule,
    start_mode,
    task_message,
)
from .worker import WorkerSettings

if TYPE_CHECKING:
    from .._store import Store


def _run_mode(
    mode: str,
    config: DemoConfig,
    specs: list[TaskSpec],
    store: Store,
    url: str,
    history: str,
    run_id: str,
    on_progress: Callable[[int], None],
) -> RunResult:
    collections, keys = create_records(store, specs, run_id, mode)

    def capture(spec: TaskSpec) -> dict[str, Any]:
        return task_message(spec, capture_intent(collections, spec))

    settings = WorkerSettings(mode, url, history)
    result = RunResult(mode, len(specs), history=history)
    with HistoryWriter(history) as writer:
        pool = Pool(config, settings, store, writer)
        try:
            Broker(specs, capture, pool.inbox, config.seed, on_progress).run(pool.outbox, result)
        finally:
            pool.stop()
        finish_run(result, writer, collections, keys, [s for s in specs if s.kind == "accounts"])
    return result


def run_demo(
    config: DemoConfig,
    on_start: Callable[[str, int], None] | None = None,
    on_progress: Callable[[str, int], None] | None = None,
) -> dict[str, RunResult]:
    """Run the schedule naive, then with fencing; returns each run's result.

    With ``config.report``, the histories are kept until the report is written.
    """
    validate(config)
    if config.report is None:
        return _run_both(config, on_start, on_progress)
    keep = config.history_dir or tempfile.mkdtemp(prefix="fencing-report-")
    try:
        results = _run_both(replace(config, history_dir=keep), on_start, on_progress)
        write_report(config.report, config, results)
        if config.history_dir is None:
            for result in results.values():
                result.history = ""
        return results
    finally:
        if config.history_dir is None:
            shutil.rmtree(keep, ignore_errors=True)


def _run_both(
    config: DemoConfig,
    on_start: Callable[[str, int], None] | None,
    on_progress: Callable[[str, int], None] | None,
) -> dict[str, RunResult]:
    if config.queue is not None:
        return run_queue_demo(config, on_start, on_progress)
    specs = make_schedule(config.seed, config.tasks, config.keys)
    temp = tempfile.mkdtemp(prefix="fencing-demo-")
    try:
        url = config.store or f"sqlite:///{os.path.join(temp, 'demo.db')}"
        history_dir = config.history_dir or temp
        os.makedirs(history_dir, exist_ok=True)
        run_id = uuid.uuid4().hex[:8]
        results: dict[str, RunResult] = {}
        with fencing.open(url) as store:
            for mode in MODES:
                history = os.path.join(history_dir, f"{mode}.jsonl")
                if os.path.exists(history):
                    os.remove(history)
                progress = start_mode(mode, len(specs), on_start, on_progress)
                results[mode] = _run_mode(
                    mode, config, specs, store, url, history, run_id, progress
                )
                if config.history_dir is None:
                    results[mode].history = ""
        return results
    finally:
        shutil.rmtree(temp, ignore_errors=True)
