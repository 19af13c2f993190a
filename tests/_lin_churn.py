"""The churn workload of ``test_linearizability``: record every operation, judge the history.

A worker is a *plan*: a generator that yields :class:`Call` s and is sent back each
call's recorded result (``UNKNOWN`` when it raised ``TransientStoreError``), so the
same plan drives the sync API (threads, processes) and the async API (tasks). Each
call is recorded as one ``lin`` event of ``fencing.testing`` with its invocation and
response times (``time.monotonic_ns()``, shared by the processes of one machine).
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from typing import Any

import fencing
from fencing import (
    AlreadyExists,
    Committed,
    Duplicate,
    Fenced,
    Intent,
    LeaseHeld,
    LeaseLost,
    Missing,
    Outcome,
    Record,
    Stale,
    TransientStoreError,
)
from fencing.testing import HistoryWriter, Operation, lin_event

COLLECTION = "hot"
TABLE = "lin_t"
UNKNOWN: Any = object()


class Unrecorded(Exception):
    """Raised by a driver's ``_do``: the operation certainly had no effect (its
    transaction was rolled back) and is left out of the history, which then claims so."""


#: per backend: histories and operations judged, outcomes unknown, connections killed
STATS: dict[str, dict[str, int]] = {}


def count(
    backend: str, *, histories: int = 0, ops: int = 0, unknown: int = 0, kills: int = 0
) -> None:
    row = STATS.setdefault(backend, {"histories": 0, "operations": 0, "unknown": 0, "kills": 0})
    row["histories"] += histories
    row["operations"] += ops
    row["unknown"] += unknown
    row["kills"] += kills


@dataclass
class Config:
    ops: int = 150  # plan steps per worker (a step may record several operations)
    keys: int = 4  # hot keys of the collection (batches join k0 with k1, k2 with k3)
    rows: int = 2  # rows of the guarded table (0: no table)
    batch_atomic: bool = True  # False on Redis: a batch's items are separate operations
    cross_key: bool = False  # also commit one intent id to two keys
    seed: int = 0
    text_columns: bool = False  # Redis keeps a table's values as text: "0", not 0


def table_rows(config: Config) -> list[dict[str, Any]]:
    total = "0" if config.text_columns else 0
    return [
        {"id": i, "status": "new", "total": total, "note": "n"} for i in range(1, config.rows + 1)
    ]


def init_events(config: Config) -> list[dict[str, Any]]:
    return [
        {
            "event": "init",
            "key": f"t:{TABLE}/{row['id']}",
            "version": 1,
            "state": {c: v for c, v in row.items() if c != "id"},
        }
        for row in table_rows(config)
    ]


@dataclass
class Call:
    op: str  # create get delete commit commit_many acquire release sleep
    kind: str = "collection"
    key: str | int = ""
    state: Mapping[str, Any] | None = None
    intent: Intent | None = None
    items: list[tuple[Intent, Mapping[str, Any]]] = field(default_factory=list)
    lease: str | None = None  # a lease name (held by the driver)
    ttl: float = 0.0


def key_id(kind: str, key: str | int) -> str:
    if kind == "collection":
        return f"c:{COLLECTION}/{key}"
    return f"t:{TABLE}/{key}"


def _commit_args(intent: Intent, state: Mapping[str, Any], lease: Any) -> dict[str, Any]:
    return {
        "key": key_id(intent.kind, intent.key),
        "expected": intent.expected_version,
        "root": intent.root_id,
        "state": dict(state),
        "guard": None if intent.guard is None else dict(intent.guard),
        "lease": None if lease is None else lease.name,
        "token": None if lease is None else lease.token,
        "merge": intent.kind == "table",
    }


def outcome_result(outcome: Outcome) -> dict[str, Any]:
    if isinstance(outcome, Committed | Duplicate):
        return {"outcome": outcome.kind, "version": outcome.record.version}
    if isinstance(outcome, Fenced):
        return {
            "outcome": "fenced",
            "version": outcome.current.version,
            "reason": outcome.reason.value,
        }
    if isinstance(outcome, Stale):
        return {"outcome": "stale", "version": outcome.current.version}
    if isinstance(outcome, Missing):
        return {"outcome": "missing", "version": None}
    raise AssertionError(f"a commit answered {outcome!r}")


def record_result(record: Record | None) -> Any:
    return None if record is None else {"version": record.version, "state": dict(record.state)}


class Driver:
    """What the sync and async drivers share: the history sink and the held leases."""

    def __init__(
        self, store: Any, sink: HistoryWriter, process: str, thread: str, batch_atomic: bool
    ) -> None:
        self.store = store
        self.sink = sink
        self.process = process
        self.thread = thread
        self.batch_atomic = batch_atomic
        self.leases: dict[str, Any] = {}
        self.owner = f"{process}.{thread}"
        self.clock = time.monotonic_ns  # a test may count instead

    def target(self, kind: str) -> Any:
        if kind == "collection":
            return self.store.collection(COLLECTION)
        return self.store.table(TABLE, columns=["status", "total", "note"])

    def args(self, call: Call) -> dict[str, Any]:
        if call.op in ("create", "get", "delete"):
            args: dict[str, Any] = {"key": key_id(call.kind, call.key)}
            if call.op == "create":
                args["state"] = dict(call.state or {})
            return args
        if call.op == "commit":
            assert call.intent is not None and call.state is not None
            return _commit_args(call.intent, call.state, self.leases.get(call.lease or ""))
        if call.op == "commit_many":
            return {"items": [_commit_args(i, s, None) for i, s in call.items]}
        if call.op == "acquire":
            return {"name": call.lease}
        lease = self.leases[call.lease or ""]
        return {"name": lease.name, "token": lease.token}

    def result(self, call: Call, value: Any) -> Any:
        if call.op == "get":
            return record_result(value)
        if call.op == "create":
            return value if value == "exists" else {"version": value.version}
        if call.op in ("delete", "release"):
            return bool(value)
        if call.op == "commit":
            return outcome_result(value)
        if call.op == "commit_many":
            return [outcome_result(o) for o in value]
        if value == "held":
            return "held"
        self.leases[value.name] = value
        return {"token": value.token}

    def write(self, call: Call, args: dict[str, Any], result: Any, t0: int, t1: int | None) -> None:
        if call.op == "commit_many" and not self.batch_atomic:
            # Redis: each item of a batch is its own atomic step
            results = [UNKNOWN] * len(args["items"]) if result is UNKNOWN else result
            for item, res in zip(args["items"], results, strict=True):
                self._write("commit", item, res, t0, t1)
            return
        self._write(call.op, args, result, t0, t1)

    def _write(self, op: str, args: dict[str, Any], result: Any, t0: int, t1: int | None) -> None:
        res = None if result is UNKNOWN else result
        operation = Operation(op, args, res, t0, t1, self.process, self.thread)
        self.sink.write(lin_event(operation))


class SyncDriver(Driver):
    def run(self, plan: Generator[Call, Any, None]) -> None:
        try:
            call = next(plan)
            while True:
                call = plan.send(self.call(call))
        except StopIteration:
            return

    def call(self, call: Call) -> Any:
        if call.op == "sleep":
            time.sleep(call.ttl)
            return None
        args = self.args(call)
        t0 = self.clock()
        try:
            value = self._do(call)
        except Unrecorded:
            return UNKNOWN
        except TransientStoreError:
            self.write(call, args, UNKNOWN, t0, None)
            return UNKNOWN
        t1 = self.clock()
        result = self.result(call, value)
        self.write(call, args, result, t0, t1)
        return result

    def _do(self, call: Call) -> Any:
        if call.op == "get":
            return self.target(call.kind).get(call.key)
        if call.op == "create":
            try:
                return self.target(call.kind).create(call.key, call.state)
            except AlreadyExists:
                return "exists"
        if call.op == "delete":
            return self.target(call.kind).delete(call.key)
        if call.op == "commit":
            assert call.intent is not None
            lease = self.leases.get(call.lease or "")
            return self.target(call.intent.kind).commit(call.intent, call.state, lease=lease)
        if call.op == "commit_many":
            return self.target(call.items[0][0].kind).commit_many(call.items)
        if call.op == "acquire":
            try:
                return self.store.acquire(call.lease, owner=self.owner, ttl=call.ttl)
            except LeaseHeld:
                return "held"
        try:
            self.leases.pop(call.lease or "").release()
        except LeaseLost:
            return False
        return True


class AsyncDriver(Driver):
    async def run(self, plan: Generator[Call, Any, None]) -> None:
        try:
            call = next(plan)
            while True:
                call = plan.send(await self.call(call))
        except StopIteration:
            return

    async def call(self, call: Call) -> Any:
        if call.op == "sleep":
            await asyncio.sleep(call.ttl)
            return None
        args = self.args(call)
        t0 = self.clock()
        try:
            value = await self._do(call)
        except Unrecorded:
            return UNKNOWN
        except TransientStoreError:
            self.write(call, args, UNKNOWN, t0, None)
            return UNKNOWN
        t1 = self.clock()
        result = self.result(call, value)
        self.write(call, args, result, t0, t1)
        return result

    async def _do(self, call: Call) -> Any:
        if call.op == "get":
            return await self.target(call.kind).get(call.key)
        if call.op == "create":
            try:
                return await self.target(call.kind).create(call.key, call.state)
            except AlreadyExists:
                return "exists"
        if call.op == "delete":
            return await self.target(call.kind).delete(call.key)
        if call.op == "commit":
            assert call.intent is not None
            lease = self.leases.get(call.lease or "")
            return await self.target(call.intent.kind).commit(call.intent, call.state, lease=lease)
        if call.op == "commit_many":
            return await self.target(call.items[0][0].kind).commit_many(call.items)
        if call.op == "acquire":
            try:
                return await self.store.acquire(call.lease, owner=self.owner, ttl=call.ttl)
            except LeaseHeld:
                return "held"
        try:
            await self.leases.pop(call.lease or "").release()
        except LeaseLost:
            return False
        return True


# -- the plan -------------------------------------------------------------------------
def _intent(kind: str, key: str | int, version: int | None, guard: Any = None) -> Intent:
    name = COLLECTION if kind == "collection" else TABLE
    return Intent.new(name, key, version, "churn", guard=guard, kind=kind)  # type: ignore[arg-type]


def _version(found: Any, rng: random.Random) -> int:
    if found is None or found is UNKNOWN:
        return rng.randint(1, 6)  # decided against a record seen earlier, or never
    v: int = found["version"]
    return v - 1 if v > 1 and rng.random() < 0.2 else v  # sometimes already stale


def plan(config: Config, worker: str) -> Generator[Call, Any, None]:
    """One worker's churn: creates overlapping deletes on a few hot keys, commits (with
    retries of unknown outcomes), batches, guarded table commits, leases with short TTLs."""
    rng = random.Random(f"{config.seed}-{worker}")
    keys = [f"k{i}" for i in range(config.keys)]
    uid = 0

    def state() -> dict[str, Any]:
        nonlocal uid
        uid += 1
        return {"by": worker, "n": uid}

    for _ in range(config.ops):
        key = rng.choice(keys)
        r = rng.random()
        if r < 0.16:
            yield Call("create", key=key, state=state())
        elif r < 0.30:
            yield Call("delete", key=key)
        elif r < 0.38:
            yield Call("get", key=key)
        elif r < 0.62:
            found = yield Call("get", key=key)
            intent = _intent("collection", key, _version(found, rng))
            body = state()
            answer = yield Call("commit", intent=intent, state=body)
            if answer is UNKNOWN or rng.random() < 0.1:  # a retry, or a redelivery
                yield Call("commit", intent=intent, state=body)
            if config.cross_key and rng.random() < 0.5:
                other = rng.choice([k for k in keys if k != key])
                seen = yield Call("get", key=other)
                again = Intent(intent.id, COLLECTION, other, _version(seen, rng), "churn")
                yield Call("commit", intent=again, state=body)
        elif r < 0.72:
            pair = rng.randrange(len(keys) // 2)
            a, b = keys[2 * pair], keys[2 * pair + 1]
            fa = yield Call("get", key=a)
            fb = yield Call("get", key=b)
            items = [
                (_intent("collection", a, _version(fa, rng)), state()),
                (_intent("collection", b, _version(fb, rng)), state()),
            ]
            yield Call("commit_many", items=items)
        elif r < 0.84 and config.rows:
            row = rng.randint(1, config.rows)
            found = yield Call("get", kind="table", key=row)
            if found is None or found is UNKNOWN:
                continue
            guard = {"status": found["state"]["status"]}
            expected = _version(found, rng)
            intent = _intent("table", row, expected, guard)
            body = {"status": f"s{rng.randint(0, 3)}", "note": f"{worker}-{uid}"}
            uid += 1
            answer = yield Call("commit", intent=intent, state=body)
            if answer is UNKNOWN:
                yield Call("commit", intent=intent, state=body)
        else:
            name = f"{COLLECTION}/{key}"  # the record's own lease (one hash slot on Cluster)
            got = yield Call("acquire", lease=name, ttl=rng.choice([0.002, 0.02, 0.2]))
            if got is UNKNOWN or got == "held":
                continue
            found = yield Call("get", key=key)
            if rng.random() < 0.3:
                yield Call("sleep", ttl=rng.choice([0.001, 0.01, 0.03]))
            intent = _intent("collection", key, _version(found, rng))
            yield Call("commit", intent=intent, state=state(), lease=name)
            if rng.random() < 0.8:
                yield Call("release", lease=name)


# -- processes ----------------------------------------------------------------------
def run_process(
    url: str, path: str, config: Config, process: str, threads: int, ready: Any, start: Any
) -> None:
    """A spawned worker process: ``threads`` threads churning the shared store. It opens
    the store before ``ready`` (the connection killer starts after), and exits non-zero
    if a worker raised anything but ``TransientStoreError``."""
    import sys
    import threading
    import traceback

    store = fencing.open(url)
    sink = HistoryWriter(path)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        driver = SyncDriver(store, sink, process, f"t{i}", config.batch_atomic)
        try:
            driver.run(plan(config, f"{process}.t{i}"))
        except BaseException as exc:
            traceback.print_exc()
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    ready.release()
    start.wait(120)
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    sink.close()
    store.close()
    if errors:
        sys.exit(1)


def new_name() -> str:
    return "lin-" + uuid.uuid4().hex[:10]
