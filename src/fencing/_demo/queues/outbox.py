"""``fencing demo --queue Q --outbox``: the send after the commit, naive and through the outbox.

The queue demo's schedule again, with the same worker processes (every task through
the fenced task of the ``fencing.contrib`` integration), but the question is the
*send*. This process is the application deciding: each decision is one SQLite
transaction on its own ``sqlite3`` connection that writes the business change (a row
of ``demo_decisions``) and then:

- naive: commits, then enqueues directly. For some tasks (chosen by the seed) the
  application "crashes" between the commit and the enqueue: the decision is committed,
  the task never reaches the queue, and it is lost.
- outbox: writes the task's outbox row in the same transaction
  (``store.using(conn).outbox.send``), never enqueueing; a relay process
  (``relay.py``) publishes the rows. It is SIGKILLed mid-run, right after a publish and
  before marking the row sent, and restarted (``relay.Relays``), twice per run at publish
  counts chosen by the seed: the next relay publishes the killed relay's unmarked rows
  again, and the worker answers ``Duplicate`` (arq drops a re-publish of a job id it
  still knows itself).

Each run counts, from what really happened: the tasks decided (rows of
``demo_decisions``), delivered (reached a worker), applied (committed), applied twice,
the duplicates refused, and the tasks lost (decided, never delivered); the history
checker judges each run as in the queue demo. The takeover of a paused task is decided
once that task's worker paused, as in the queue demo; the schedule's own duplicate sends
and delivery delays are not used here (the re-publishes are the duplicates).
"""

from __future__ import annotations

import dataclasses
import random
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import fencing

from ..._errors import ConfigurationError
from ..config import DemoConfig
from ..scenario import (
    RunResult,
    TaskSpec,
    capture_intent,
    collection_name,
    make_schedule,
    start_mode,
)
from ._broker import broker_url
from ._tasks import Settings, intent_id
from .modules import preflight
from .processes import Workers
from .relay import Relays
from .runner import (
    POLL,
    RUN_TIMEOUT,
    _broker_failures,
    _merge,
    _Progress,
    _Takeovers,
    committed_roots,
    finish_from_events,
    processes,
    run_setup,
    tally,
)

MODES: Final = ("naive", "outbox")
#: The share of the naive run's decisions whose application crashes before the enqueue.
LOSS_RATE: Final = 0.1
#: Relay processes SIGKILLed per outbox run (each after a publish, before its mark).
RELAY_KILLS: Final = 2
#: A run also ends once nothing happened for this long with every task delivered.
QUIET: Final = 3.0
DECISIONS: Final = (
    "CREATE TABLE IF NOT EXISTS demo_decisions (run TEXT NOT NULL, mode TEXT NOT NULL,"
    " task INTEGER NOT NULL, kind TEXT NOT NULL, key TEXT NOT NULL, intent TEXT NOT NULL,"
    " PRIMARY KEY (run, mode, task))"
)


@dataclasses.dataclass
class OutboxResult:
    """One run of the outbox demo: what was decided, delivered, applied, lost."""

    run: RunResult
    decided: int = 0
    enqueue_crashes: int = 0
    delivered: int = 0
    applied: int = 0
    applied_twice: int = 0
    duplicates_refused: int = 0
    lost: int = 0
    lost_tasks: list[int] = dataclasses.field(default_factory=list)
    published: int = 0
    republished: int = 0
    republished_tasks: list[int] = dataclasses.field(default_factory=list)
    relay_kills: int = 0

    @property
    def ok(self) -> bool:
        report = self.run.report
        return bool(report and report.ok) and self.lost == 0 and self.applied_twice == 0

    def to_dict(self) -> dict[str, Any]:
        out = self.run.to_dict()
        out.update(
            (f.name, getattr(self, f.name)) for f in dataclasses.fields(self) if f.name != "run"
        )
        out["ok"] = self.ok
        return out


def losses(seed: int, specs: list[TaskSpec]) -> set[int]:
    """The naive run's tasks whose application crashes between commit and enqueue (seeded;
    never a paused task or its takeover; at least one)."""
    rng = random.Random(f"fencing-demo-enqueue-crash-{seed}")
    paused = {s.takes_over for s in specs if s.takes_over is not None}
    candidates = [s.task for s in specs if s.takes_over is None and s.task not in paused]
    lost = {t for t in candidates if rng.random() < LOSS_RATE}
    return lost or {rng.choice(candidates)}


def relay_hangs(seed: int, tasks: int) -> list[int]:
    """After how many publishes each successive relay hangs (and is killed), seeded."""
    rng = random.Random(f"fencing-demo-relay-kill-{seed}")
    low, high = max(2, tasks // 6), max(3, tasks // 3)
    return [rng.randint(low, high) for _ in range(RELAY_KILLS)]


class _Application:
    """The deciding side: one transaction per decision on its own ``sqlite3`` connection."""

    def __init__(
        self, store: fencing.Store, path: str, mode: str, settings: Settings, send: Any
    ) -> None:
        self.store = store
        self.mode = mode
        self.settings = settings
        self.send = send
        self.conn = sqlite3.connect(path, timeout=30)
        self.conn.execute(DECISIONS)
        self.conn.commit()

    def decide(self, collections: dict[str, Any], spec: TaskSpec, lose: bool) -> None:
        intent = capture_intent(collections, spec)
        intent = dataclasses.replace(
            intent, id=intent_id(self.settings.run_id, self.mode, spec.task)
        )
        self.conn.execute(
            "INSERT INTO demo_decisions VALUES (?, ?, ?, ?, ?, ?)",
            (self.settings.run_id, self.mode, spec.task, spec.kind, spec.key, intent.to_json()),
        )
        if self.mode == "outbox":  # the task's message, in the same transaction
            task, options = self.send(spec.kind, spec.leased)
            self.store.using(self.conn).outbox.send(task, intent, **options)
            self.conn.commit()
            return
        self.conn.commit()
        if lose:  # the application dies here: committed, never enqueued
            return
        self.send(spec.kind, spec.leased, intent)

    def decided(self) -> int:
        row = self.conn.execute(
            "SELECT COUNT(*) FROM demo_decisions WHERE run = ? AND mode = ?",
            (self.settings.run_id, self.mode),
        ).fetchone()
        return int(row[0])

    def close(self) -> None:
        self.conn.close()


@dataclasses.dataclass
class _Run:
    """The application's decisions on the schedule's clock, and the bookkeeping of a run."""

    mode: str
    specs: list[TaskSpec]
    lose: set[int]
    app: _Application
    collections: dict[str, Any]
    workers: Workers
    relays: Relays | None
    progress: _Progress
    on_progress: Callable[[int], None]

    def __post_init__(self) -> None:
        self.schedule: _Takeovers[TaskSpec] = _Takeovers(self.specs)
        self.seen: set[int] = set()
        self.ended: dict[int, int] = {}
        self.last_event = time.monotonic()

    def _decide(self, spec: TaskSpec) -> None:
        self.app.decide(self.collections, spec, spec.task in self.lose)

    def _release(self, task: int) -> None:
        for spec in self.schedule.release(task):
            self._decide(spec)

    def run(self, result: OutboxResult) -> None:
        start = time.monotonic()
        while True:
            now = time.monotonic() - start
            if now > RUN_TIMEOUT:
                raise ConfigurationError(
                    f"the {self.mode} run did not finish in {RUN_TIMEOUT:.0f}s"
                    f" ({len(self.ended)} of {len(self.specs)} tasks done)"
                )
            while (spec := self.schedule.next_due(now)) is not None:
                if not self.schedule.hold(spec, spec, now):
                    self._decide(spec)
            for paused in self.schedule.overdue(now):
                self._release(paused)
            for event in self.progress.of(self.mode):
                self._note(event, result.run)
            self.workers.check()
            if self.relays is not None:
                self.relays.check()
            if self.schedule.upcoming is None and not self.schedule.held and self._done():
                break
            time.sleep(POLL)
        result.run.seconds = time.monotonic() - start

    def _done(self) -> bool:
        expected = [s.task for s in self.specs if s.task not in self.lose]
        if any(task not in self.ended for task in expected):
            return False
        if self.relays is None:
            return True
        if self.app.store.outbox.stats().pending:
            return False
        published = self.relays.published()
        roots = {s.task: intent_id(self.app.settings.run_id, self.mode, s.task) for s in self.specs}
        if all(self.ended.get(t, 0) >= published.get(root, 1) for t, root in roots.items()):
            return True
        return time.monotonic() - self.last_event > QUIET  # a re-publish the queue dropped

    def _note(self, event: dict[str, Any], result: RunResult) -> None:
        self.last_event = time.monotonic()
        task = int(event["task"])
        self.seen.add(task)
        self._release(task)
        if not tally(event, result):
            return
        self.ended[task] = self.ended.get(task, 0) + 1
        if self.ended[task] == 1:
            self.on_progress(1)


def _senders(queue: str, module: Any, sender: Any, settings: Settings) -> tuple[Any, Any]:
    """Direct enqueue (naive) and the fenced task with its send options (outbox)."""

    def direct(kind: str, leased: bool, intent: Any) -> None:
        sender.send("fencing", kind, leased, intent)  # the fenced task's own enqueue

    fenced = getattr(sender, "fenced", None) or module.FENCED
    options = {"_queue_name": settings.queue} if queue == "arq" else {}

    def outbox(kind: str, leased: bool) -> tuple[Any, dict[str, Any]]:
        return fenced[(kind, leased)], options

    return direct, outbox


def _judge(run: _Run, result: OutboxResult, control: Path, history: Path, run_id: str) -> None:
    mode = run.mode
    events = _merge(control, mode)
    committed = committed_roots(events)
    result.duplicates_refused += sum(e.get("outcome") == "duplicate" for e in events)
    result.decided = run.app.decided()
    result.enqueue_crashes = 0 if run.relays else len(run.lose)
    result.delivered = len(run.seen)
    result.applied = sum(1 for n in committed.values() if n)
    result.applied_twice = sum(1 for n in committed.values() if n > 1)
    result.lost_tasks = sorted(s.task for s in run.specs if s.task not in run.seen)
    result.lost = len(result.lost_tasks)
    if run.relays is not None:
        published = run.relays.published()
        mine = {s.task: published.get(intent_id(run_id, mode, s.task), 0) for s in run.specs}
        result.published = sum(mine.values())
        result.republished = sum(n - 1 for n in mine.values() if n > 1)
        result.republished_tasks = sorted(task for task, n in mine.items() if n > 1)
        result.relay_kills = run.relays.kills
    keys = {kind: sorted({s.key for s in run.specs if s.kind == kind}) for kind in run.collections}
    finish_from_events(result.run, history, events, run.collections, keys, run.specs, committed)


def _records(store: fencing.Store, specs: list[TaskSpec], run_id: str) -> dict[str, Any]:
    """The fenced tasks' collections (the workers write there), with the run's keys."""
    collections = {
        kind: store.collection(collection_name(run_id, "fencing", kind))
        for kind in ("accounts", "orders")
    }
    initial: dict[str, dict[str, Any]] = {
        "accounts": {"balance": 0, "credits": 0},
        "orders": {"status": "open", "cycle": 0},
    }
    for kind in collections:
        for key in sorted({s.key for s in specs if s.kind == kind}):
            collections[kind].create(key, initial[kind])
    return collections


def _cleanup_outbox_jobs(url: str, control: Path) -> None:
    """Delete the broker keys named by the relays' job ids (RQ's and arq's jobs)."""
    import json

    import redis

    path = control / "relay-published.jsonl"
    if not url.startswith("redis") or not path.exists():
        return
    ids = {json.loads(line)["id"] for line in path.read_bytes().splitlines() if line.strip()}
    client = redis.Redis.from_url(url, socket_connect_timeout=2.0)
    try:
        found = [
            k
            for k in client.scan_iter(match="*fencing-outbox-*", count=1000)
            if any(i in k.decode(errors="replace") for i in ids)
        ]
        for start in range(0, len(found), 500):
            client.delete(*found[start : start + 500])
    finally:
        client.close()


def run_outbox_demo(
    config: DemoConfig,
    on_start: Callable[[str, int], None] | None = None,
    on_progress: Callable[[str, int], None] | None = None,
) -> dict[str, OutboxResult]:
    """Run the schedule through ``config.queue``: naive send, then the outbox; each run."""
    assert config.queue is not None
    queue = config.queue
    module = preflight(config)
    url = broker_url(config)
    specs = make_schedule(config.seed, config.tasks, config.keys)
    lose = losses(config.seed, specs)
    temp, settings, history_dir = run_setup(config, url, None)
    control, run_id, db = Path(settings.control), settings.run_id, temp / "demo.db"
    results: dict[str, OutboxResult] = {}
    with (
        processes(temp, lambda: _cleanup_outbox_jobs(url, control)) as started,
        fencing.open(settings.store) as store,
        _broker_failures(queue, module),
    ):
        restarts = 2 * sum(s.crash for s in specs) if settings.crash else 0
        sender = module.Sender(settings)
        workers = started.start(sender, settings, config.workers, restarts)
        progress = _Progress(control / "progress.jsonl")
        direct, outbox = _senders(queue, module, sender, settings)
        relays: Relays | None = None
        for mode in MODES:
            history = history_dir / f"{mode}.jsonl"
            history.unlink(missing_ok=True)
            advance = start_mode(mode, len(specs), on_start, on_progress)
            run_specs = [dataclasses.replace(s, key=f"{mode}-{s.key}") for s in specs]
            collections = _records(store, run_specs, run_id)
            app = _Application(store, str(db), mode, settings, direct)
            if mode == "outbox":
                app.send = outbox
                relays = started.start_relays(
                    queue, control, relay_hangs(config.seed, config.tasks)
                )
            result = OutboxResult(RunResult(mode, len(specs), history=str(history), run_id=run_id))
            run = _Run(
                mode,
                run_specs,
                lose if mode == "naive" else set(),
                app,
                collections,
                workers,
                relays if mode == "outbox" else None,
                progress,
                advance,
            )
            try:
                run.run(result)
            finally:
                if relays is not None:
                    relays.stop()
            _judge(run, result, control, history, run_id)
            app.close()
            if config.history_dir is None:
                result.run.history = ""
            results[mode] = result
    return results
