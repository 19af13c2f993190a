"""One queue demo: this process is the producer, the queue's worker processes run the tasks.

:func:`run_queue_demo` starts the workers, then runs the schedule twice (naive, then
fencing): :class:`_Run` captures each task's intent when it is decided and sends it
when its delay is due, and follows ``progress.jsonl`` for the end of each delivery;
afterwards the processes' histories are merged and judged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
import json
import os
import shutil
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, Final, Protocol

import fencing

from ..._errors import ConfigurationError
from ...testing import HistoryWriter
from ..config import DemoConfig
from ..scenario import (
    RunResult,
    TaskSpec,
    capture_intent,
    create_records,
    finish_run,
    make_schedule,
)
from ._broker import broker_url
from ._tasks import ENV_PREFIX, Settings, intent_id
from .modules import crashes, preflight
from .processes import Workers

START_TIMEOUT: Final = 60.0
RUN_TIMEOUT: Final = 300.0
HOLD_LIMIT: Final = 5.0  # a takeover is sent at the latest this long after it was decided
POLL: Final = 0.01


class _Sender(Protocol):
    def commands(self, workers: int) -> list[list[str]]: ...
    def send(self, mode: str, kind: str, leased: bool, intent: Any) -> None: ...
    def ping(self, token: str) -> None: ...
    def close(self) -> None: ...
    def cleanup(self) -> None: ...


class _Progress:
    """Follows ``progress.jsonl``, the lines the workers append as deliveries end."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        data = self.partial + data
        *lines, self.partial = data.split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]


# -- one run -------------------------------------------------------------------------------------
@dataclasses.dataclass
class _Run:
    """Producer and bookkeeping of one mode's run through the queue."""

    mode: str
    specs: list[TaskSpec]
    settings: Settings
    sender: _Sender
    workers: Workers
    progress: _Progress
    on_progress: Callable[[int], None]

    def __post_init__(self) -> None:
        self.heap: list[tuple[float, int, TaskSpec, Any]] = []
        self.seq = 0
        self.intents: dict[int, Any] = {}
        self.held: dict[int, list[tuple[float, TaskSpec]]] = {}
        self.released: set[int] = set()
        self.ended: dict[int, int] = {}
        self.expected = {s.task: 1 + (s.duplicate is not None) for s in self.specs}
        self.completed = 0

    def _push(self, at: float, spec: TaskSpec) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (at, self.seq, spec, self.intents[spec.task]))

    def _release(self, task: int, now: float) -> None:
        self.released.add(task)
        for delay, spec in self.held.pop(task, []):
            self._push(now + delay, spec)

    def run(self, collections: Any, result: RunResult) -> None:
        start = time.monotonic()
        pending = iter(self.specs)
        upcoming = next(pending, None)
        decided: dict[int, float] = {}
        while self.completed < len(self.specs):
            now = time.monotonic() - start
            if now > RUN_TIMEOUT:
                raise ConfigurationError(
                    f"the {result.mode} run through {self.settings.queue} did not finish in"
                    f" {RUN_TIMEOUT:.0f}s ({self.completed} of {len(self.specs)} tasks done)"
                )
            while upcoming is not None and upcoming.enqueue_at <= now:
                spec = upcoming
                intent = capture_intent(collections, spec)
                intent = dataclasses.replace(
                    intent, id=intent_id(self.settings.run_id, self.mode, spec.task)
                )
                self.intents[spec.task] = intent
                paused = spec.takes_over
                if paused is not None and paused not in self.released:
                    self.held.setdefault(paused, []).append((spec.delay, spec))
                    decided[paused] = now
                else:
                    self._push(now + spec.delay, spec)
                if spec.duplicate is not None:
                    result.duplicates += 1
                    self._push(now + spec.delay + spec.duplicate, spec)
                upcoming = next(pending, None)
            for paused, since in list(decided.items()):
                if paused in self.held and now - since > HOLD_LIMIT:
                    self._release(paused, now)
            while self.heap and self.heap[0][0] <= now:
                _, _, spec, intent = heapq.heappop(self.heap)
                self.sender.send(self.mode, spec.kind, spec.leased, intent)
            for event in self.progress.read():
                if event.get("mode") == self.mode:
                    self._note(event, time.monotonic() - start, result)
            self.workers.check()
            time.sleep(POLL)
        result.seconds = time.monotonic() - start

    def _note(self, event: dict[str, Any], now: float, result: RunResult) -> None:
        task = int(event["task"])
        self._release(task, now)  # paused, or over without pausing: the takeover may go
        if not tally(event, result):
            return
        self.ended[task] = self.ended.get(task, 0) + 1
        if self.ended[task] == self.expected[task]:
            self.completed += 1
            self.on_progress(1)


def tally(event: dict[str, Any], result: RunResult) -> bool:
    """Count one worker event (a delivery's verdict) into ``result``; True when the
    delivery ended its task (not paused, crashed or retried)."""
    verdict = str(event["verdict"])
    if verdict == "paused":
        return False
    result.deliveries += 1
    if verdict in ("crash", "retry"):
        result.retries += 1
        result.crashes += verdict == "crash"
        return False
    if verdict == "error":
        result.errors.append(str(event.get("detail", "")))
    if verdict == "gave_up":
        result.gave_up += 1
    return True


def _merge(control: Path, mode: str) -> list[dict[str, Any]]:
    """Every process's history of the run, in the order the events happened."""
    events: list[dict[str, Any]] = []
    for path in sorted(control.glob(f"history-{mode}-*.jsonl")):
        for line in path.read_bytes().splitlines():
            if line.strip():
                events.append(json.loads(line))
    events.sort(key=lambda e: float(e.get("t") or 0.0))
    return events


@contextlib.contextmanager
def _broker_failures(queue: str, module: ModuleType) -> Iterator[None]:
    """A broker that fails mid-run is a clear error (exit 2), not a traceback."""
    errors: tuple[type[Exception], ...] = module.broker_errors()
    try:
        yield
    except errors as exc:
        raise ConfigurationError(
            f"the {queue} broker failed: {type(exc).__name__}: {exc}"
        ) from None


def _exit_on_sigterm() -> Callable[[], None]:
    """Let SIGTERM unwind like Ctrl-C, so the workers are stopped; returns the undo."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def terminate(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, terminate)

    def restore() -> None:
        signal.signal(signal.SIGTERM, previous)

    return restore


def _wait_ready(sender: _Sender, workers: Workers, control: Path) -> None:
    token = uuid.uuid4().hex
    sender.ping(token)
    deadline = time.monotonic() + START_TIMEOUT
    while not (control / f"pong-{token}").exists():
        workers.check()
        if time.monotonic() > deadline:
            raise ConfigurationError(
                f"the workers did not start in {START_TIMEOUT:.0f}s:\n{workers.tail(0)}"
            )
        time.sleep(0.05)


def worker_env(settings: Settings, sender: _Sender) -> dict[str, str]:
    """The environment of the run's processes: its settings, this fencing importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    package_root = str(Path(fencing.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    env.update(settings.env(), PYTHONUNBUFFERED="1")
    env.update(getattr(sender, "env", dict)())
    return env


def run_setup(config: DemoConfig, broker: str, store: str | None) -> tuple[Path, Settings, Path]:
    """A run's temporary directory (its control directory and, without ``store``, its
    SQLite store ``demo.db``), the settings its processes share, and where the
    histories go."""
    assert config.queue is not None
    temp = Path(tempfile.mkdtemp(prefix="fencing-demo-"))
    control = temp / "control"
    control.mkdir()
    run_id = uuid.uuid4().hex[:10]
    settings = Settings(
        run_id=run_id,
        store=store or f"sqlite:///{temp / 'demo.db'}",
        control=str(control),
        broker=broker,
        queue=f"fencing-demo-{run_id}",
        seed=config.seed,
        tasks=config.tasks,
        keys=config.keys,
        crash=crashes(config.queue),
    )
    history_dir = Path(config.history_dir) if config.history_dir else temp
    history_dir.mkdir(parents=True, exist_ok=True)
    return temp, settings, history_dir


def run_queue_demo(
    config: DemoConfig,
    on_start: Callable[[str, int], None] | None = None,
    on_progress: Callable[[str, int], None] | None = None,
) -> dict[str, RunResult]:
    """Run the schedule through ``config.queue``: naive, then fencing; each run's result."""
    assert config.queue is not None
    queue = config.queue
    module = preflight(config)
    url = broker_url(config)
    specs = make_schedule(config.seed, config.tasks, config.keys)
    temp, settings, history_dir = run_setup(config, url, config.store)
    store_url, control, run_id = settings.store, Path(settings.control), settings.run_id
    sender: _Sender | None = None
    workers: Workers | None = None
    results: dict[str, RunResult] = {}
    restore = _exit_on_sigterm()
    try:
        with fencing.open(store_url) as store, _broker_failures(queue, module):
            sender = module.Sender(settings)
            env = worker_env(settings, sender)
            # one SIGKILLed process per crashing task and run, at most (the first delivery)
            restarts = 2 * sum(s.crash for s in specs) if settings.crash else 0
            workers = Workers(run_id, sender.commands(config.workers), env, control, restarts)
            workers.start()
            _wait_ready(sender, workers, control)
            progress = _Progress(control / "progress.jsonl")
            for mode in ("naive", "fencing"):
                history = history_dir / f"{mode}.jsonl"
                history.unlink(missing_ok=True)
                if on_start is not None:
                    on_start(mode, len(specs))

                def advance(n: int, mode: str = mode) -> None:
                    if on_progress is not None:
                        on_progress(mode, n)

                collections, keys = create_records(store, specs, run_id, mode)
                result = RunResult(mode, len(specs), history=str(history), run_id=run_id)
                _Run(mode, specs, settings, sender, workers, progress, advance).run(
                    collections, result
                )
                events = _merge(control, mode)
                committed = {e.get("root_id") for e in events if e.get("outcome") == "committed"}
                credited = [
                    s
                    for s in specs
                    if s.kind == "accounts" and intent_id(run_id, mode, s.task) in committed
                ]
                writer = HistoryWriter(history)
                for event in events:
                    writer.write(event)
                finish_run(result, writer, collections, keys, credited)
                if config.history_dir is None:
                    result.history = ""
                results[mode] = result
        return results
    finally:
        try:
            if workers is not None:
                workers.stop()
        finally:
            if sender is not None:
                with contextlib.suppress(Exception):
                    sender.cleanup()
                with contextlib.suppress(Exception):
                    sender.close()
            shutil.rmtree(temp, ignore_errors=True)
            restore()
