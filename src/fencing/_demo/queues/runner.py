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
from typing import Any, Final, Generic, Protocol, TypeVar

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
    start_mode,
)
from ._broker import broker_url
from ._tasks import ENV_PREFIX, Settings, intent_id
from .modules import crashes, preflight
from .processes import Workers
from .relay import Relays

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

    def of(self, mode: str) -> list[dict[str, Any]]:
        """The new lines of ``mode``'s run."""
        return [event for event in self.read() if event.get("mode") == mode]


_T = TypeVar("_T")


class _Takeovers(Generic[_T]):
    """The schedule's tasks as they come due, each takeover held (as ``_T``: what its run
    does with it later) until the task it takes over paused or ended (``release``), or
    for ``HOLD_LIMIT`` at most (``overdue``)."""

    def __init__(self, specs: list[TaskSpec]) -> None:
        self._pending = iter(specs)
        self.upcoming = next(self._pending, None)
        self.held: dict[int, list[_T]] = {}
        self.released: set[int] = set()
        self._since: dict[int, float] = {}

    def next_due(self, now: float) -> TaskSpec | None:
        """The next task decided by ``now`` (None: none yet)."""
        spec = self.upcoming
        if spec is None or spec.enqueue_at > now:
            return None
        self.upcoming = next(self._pending, None)
        return spec

    def hold(self, spec: TaskSpec, item: _T, now: float) -> bool:
        """Hold ``item`` when ``spec`` takes over a task not released yet (False: it may go)."""
        paused = spec.takes_over
        if paused is None or paused in self.released:
            return False
        self.held.setdefault(paused, []).append(item)
        self._since[paused] = now
        return True

    def release(self, task: int) -> list[_T]:
        """``task`` paused or ended: what was held for it (from now on nothing is)."""
        self.released.add(task)
        return self.held.pop(task, [])

    def overdue(self, now: float) -> list[int]:
        """The tasks whose takeovers were held longer than ``HOLD_LIMIT``."""
        return [
            p for p, at in list(self._since.items()) if p in self.held and now - at > HOLD_LIMIT
        ]


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
        self.schedule: _Takeovers[tuple[float, TaskSpec]] = _Takeovers(self.specs)
        self.ended: dict[int, int] = {}
        self.expected = {s.task: 1 + (s.duplicate is not None) for s in self.specs}
        self.completed = 0

    def _push(self, at: float, spec: TaskSpec) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (at, self.seq, spec, self.intents[spec.task]))

    def _release(self, task: int, now: float) -> None:
        for delay, spec in self.schedule.release(task):
            self._push(now + delay, spec)

    def run(self, collections: Any, result: RunResult) -> None:
        start = time.monotonic()
        while self.completed < len(self.specs):
            now = time.monotonic() - start
            if now > RUN_TIMEOUT:
                raise ConfigurationError(
                    f"the {result.mode} run through {self.settings.queue} did not finish in"
                    f" {RUN_TIMEOUT:.0f}s ({self.completed} of {len(self.specs)} tasks done)"
                )
            while (spec := self.schedule.next_due(now)) is not None:
                intent = capture_intent(collections, spec)
                intent = dataclasses.replace(
                    intent, id=intent_id(self.settings.run_id, self.mode, spec.task)
                )
                self.intents[spec.task] = intent
                if not self.schedule.hold(spec, (spec.delay, spec), now):
                    self._push(now + spec.delay, spec)
                if spec.duplicate is not None:
                    result.duplicates += 1
                    self._push(now + spec.delay + spec.duplicate, spec)
            for paused in self.schedule.overdue(now):
                self._release(paused, now)
            while self.heap and self.heap[0][0] <= now:
                _, _, spec, intent = heapq.heappop(self.heap)
                self.sender.send(self.mode, spec.kind, spec.leased, intent)
            for event in self.progress.of(self.mode):
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


def committed_roots(events: list[dict[str, Any]]) -> dict[str, int]:
    """How many times each intent (by its root id) was committed, from the run's events."""
    committed: dict[str, int] = {}
    for event in events:
        if event.get("outcome") == "committed":
            root = str(event.get("root_id"))
            committed[root] = committed.get(root, 0) + 1
    return committed


def finish_from_events(
    result: RunResult,
    history: Path,
    events: list[dict[str, Any]],
    collections: Any,
    keys: dict[str, list[str]],
    specs: list[TaskSpec],
    committed: dict[str, int],
) -> None:
    """Write the run's events to its history and judge it (``finish_run``); the balance
    expected is the credits of the accounts tasks committed."""
    credited = [
        s
        for s in specs
        if s.kind == "accounts" and intent_id(result.run_id, result.mode, s.task) in committed
    ]
    writer = HistoryWriter(history)
    for event in events:
        writer.write(event)
    finish_run(result, writer, collections, keys, credited)


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


class _Processes:
    """A run's sender and processes: the workers (``start``) and the relays of an outbox
    run (``start_relays``); ``stop`` stops them and cleans the broker up."""

    def __init__(self) -> None:
        self.sender: Any = None
        self.env: dict[str, str] = {}
        self.workers: Workers | None = None
        self.relays: Relays | None = None

    def start(self, sender: Any, settings: Settings, count: int, restarts: int) -> Workers:
        """Start ``count`` worker processes for ``sender``'s queue, and wait until they answer."""
        self.sender = sender
        control = Path(settings.control)
        self.env = worker_env(settings, sender)
        workers = Workers(settings.run_id, sender.commands(count), self.env, control, restarts)
        self.workers = workers
        workers.start()
        _wait_ready(sender, workers, control)
        return workers

    def start_relays(self, queue: str, control: Path, hangs: list[int]) -> Relays:
        self.relays = Relays(queue, self.env, control, hangs)
        self.relays.start()
        return self.relays

    def stop(self, cleanup: Callable[[], None] | None = None) -> None:
        """Stop the processes; then the sender cleans up (and ``cleanup``), and closes,
        whatever their errors."""
        try:
            if self.relays is not None:
                self.relays.stop()
            if self.workers is not None:
                self.workers.stop()
        finally:
            if self.sender is not None:
                with contextlib.suppress(Exception):
                    self.sender.cleanup()
                if cleanup is not None:
                    with contextlib.suppress(Exception):
                        cleanup()
                with contextlib.suppress(Exception):
                    self.sender.close()


@contextlib.contextmanager
def processes(temp: Path, cleanup: Callable[[], None] | None = None) -> Iterator[_Processes]:
    """A run's processes, stopped at the end whatever happens (SIGTERM unwinds like
    Ctrl-C meanwhile); then its temporary directory goes."""
    restore = _exit_on_sigterm()
    started = _Processes()
    try:
        yield started
    finally:
        try:
            started.stop(cleanup)
        finally:
            shutil.rmtree(temp, ignore_errors=True)
            restore()


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
    results: dict[str, RunResult] = {}
    with (
        processes(temp) as started,
        fencing.open(store_url) as store,
        _broker_failures(queue, module),
    ):
        # one SIGKILLed process per crashing task and run, at most (the first delivery)
        restarts = 2 * sum(s.crash for s in specs) if settings.crash else 0
        sender = module.Sender(settings)
        workers = started.start(sender, settings, config.workers, restarts)
        progress = _Progress(control / "progress.jsonl")
        for mode in ("naive", "fencing"):
            history = history_dir / f"{mode}.jsonl"
            history.unlink(missing_ok=True)
            advance = start_mode(mode, len(specs), on_start, on_progress)
            collections, keys = create_records(store, specs, run_id, mode)
            result = RunResult(mode, len(specs), history=str(history), run_id=run_id)
            _Run(mode, specs, settings, sender, workers, progress, advance).run(collections, result)
            events = _merge(control, mode)
            committed = committed_roots(events)
            finish_from_events(result, history, events, collections, keys, specs, committed)
            if config.history_dir is None:
                result.history = ""
            results[mode] = result
    return results
