"""The in-process demo's delivery: a broker in this process, and the pool of workers.

The :class:`Broker` delivers each task when its seeded delay is due (so tasks arrive
out of order), delivers some twice, holds a takeover back until the paused task's
worker has paused, and redelivers what was given back or crashed. The :class:`Pool`
runs the workers: threads sharing the store, or (``--processes``) processes with a
store connection of their own.
"""

from __future__ import annotations

import heapq
import multiprocessing
import queue
import random
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from .config import DemoConfig
from .scenario import MAX_DELIVERIES, RunResult, TaskSpec
from .worker import Outbox, Worker, WorkerSettings, process_main

if TYPE_CHECKING:
    from .._store import Store
    from ..testing import HistoryWriter

RUN_TIMEOUT: Final = 600.0


class Broker:
    """Delivers messages when due (out of order), duplicates and redelivers them."""

    def __init__(
        self,
        specs: list[TaskSpec],
        capture: Callable[[TaskSpec], dict[str, Any]],
        inbox: Outbox,
        seed: int,
        on_progress: Callable[[int], None],
    ) -> None:
        self.specs = specs
        self.capture = capture
        self.inbox = inbox
        self.rng = random.Random(seed ^ 0x5EED)
        self.on_progress = on_progress
        self.heap: list[tuple[float, int, dict[str, Any]]] = []
        self.seq = 0
        self.messages: dict[int, dict[str, Any]] = {}
        self.outstanding: dict[int, int] = {}
        self.delivered: dict[int, int] = {}
        self.completed = 0
        # takeover tasks held until the paused task's worker has paused (or answered)
        self.held: dict[int, list[tuple[float, dict[str, Any]]]] = {}
        self.released: set[int] = set()

    def _release(self, task: int, now: float) -> None:
        self.released.add(task)
        for delay, message in self.held.pop(task, []):
            self._push(now + delay, message)

    def _push(self, at: float, message: dict[str, Any]) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (at, self.seq, message))
        task = message["task"]
        self.outstanding[task] = self.outstanding.get(task, 0) + 1

    def run(self, outbox: queue.Queue[Any] | Any, result: RunResult) -> None:
        start = time.monotonic()
        pending = iter(self.specs)
        upcoming = next(pending, None)
        while self.completed < len(self.specs):
            now = time.monotonic() - start
            if now > RUN_TIMEOUT:
                raise TimeoutError(f"the {result.mode} run did not finish in {RUN_TIMEOUT:.0f}s")
            while upcoming is not None and upcoming.enqueue_at <= now:
                message = self.capture(upcoming)
                self.messages[upcoming.task] = message
                first = {**message, "first": True}
                paused = upcoming.takes_over
                if paused is not None and paused not in self.released:
                    self.held.setdefault(paused, []).append((upcoming.delay, first))
                else:
                    self._push(now + upcoming.delay, first)
                if upcoming.duplicate is not None:
                    result.duplicates += 1
                    self._push(
                        now + upcoming.delay + upcoming.duplicate, {**message, "first": False}
                    )
                upcoming = next(pending, None)
            while self.heap and self.heap[0][0] <= now:
                _, _, message = heapq.heappop(self.heap)
                task = message["task"]
                self.delivered[task] = self.delivered.get(task, 0) + 1
                result.deliveries += 1
                self.inbox.put(message)
            due = [self.heap[0][0]] if self.heap else []
            if upcoming is not None:
                due.append(upcoming.enqueue_at)
            wait = min([0.02, *(d - now for d in due)])
            try:
                answer = outbox.get(timeout=max(0.001, wait))
            except queue.Empty:
                continue
            self._answer(answer, time.monotonic() - start, result)
            while True:
                try:
                    answer = outbox.get_nowait()
                except queue.Empty:
                    break
                self._answer(answer, time.monotonic() - start, result)
        result.seconds = time.monotonic() - start

    def _answer(self, answer: tuple[int, str, str], now: float, result: RunResult) -> None:
        task, verdict, detail = answer
        if task < 0:
            return
        self._release(task, now)
        if verdict == "paused":
            return
        self.outstanding[task] -= 1
        if verdict == "error":
            result.errors.append(detail)
        if verdict in ("crash", "retry", "error"):
            if verdict == "crash":
                result.crashes += 1
            if self.delivered[task] + self.outstanding[task] < MAX_DELIVERIES:
                result.retries += 1
                later = self.rng.uniform(0.05, 0.3 if verdict == "crash" else 0.15)
                self._push(now + later, {**self.messages[task], "first": False})
            else:
                result.gave_up += 1
        if self.outstanding[task] == 0:
            self.completed += 1
            self.on_progress(1)


class Pool:
    """The workers of one run: threads sharing the store, or processes of their own."""

    def __init__(
        self, config: DemoConfig, settings: WorkerSettings, store: Store, writer: HistoryWriter
    ) -> None:
        self.size = config.workers
        self.threads: list[threading.Thread] = []
        self.procs: list[Any] = []
        self.shared = config.processes
        self.inbox: Any
        self.outbox: Any
        if not config.processes:
            self.inbox, self.outbox = queue.Queue(), queue.Queue()
            for n in range(self.size):
                worker = Worker(f"{settings.mode}-t{n + 1}", settings, store, writer)
                thread = threading.Thread(
                    target=worker.loop,
                    args=(self.inbox, self.outbox),
                    name=f"fencing-demo-{settings.mode}-{n + 1}",
                    daemon=True,
                )
                thread.start()
                self.threads.append(thread)
            return
        ctx = multiprocessing.get_context("spawn")
        self.inbox, self.outbox = ctx.Queue(), ctx.Queue()
        try:
            for n in range(self.size):
                proc = ctx.Process(
                    target=process_main,
                    args=(f"{settings.mode}-p{n + 1}", settings, self.inbox, self.outbox),
                    name=f"fencing-demo-{settings.mode}-{n + 1}",
                    daemon=True,
                )
                proc.start()
                self.procs.append(proc)
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        ready = 0
        deadline = time.monotonic() + 60.0
        while ready < self.size:
            try:
                task, verdict, _ = self.outbox.get(timeout=0.5)
            except queue.Empty:
                if time.monotonic() > deadline or not all(p.is_alive() for p in self.procs):
                    raise RuntimeError("the demo's worker processes failed to start") from None
                continue
            if task < 0 and verdict == "ready":
                ready += 1

    def stop(self) -> None:
        for _ in range(self.size):
            self.inbox.put(None)
        for thread in self.threads:
            thread.join(timeout=30.0)
        for proc in self.procs:
            proc.join(timeout=30.0)
            if proc.is_alive():  # pragma: no cover - a stuck worker process of ours
                proc.terminate()
                proc.join()
        if self.shared:
            for q in (self.inbox, self.outbox):
                q.close()
                q.join_thread()
