"""``fencing bench --contention``: the worker pattern under load, beside what users write.

A worker receives an intent decided earlier (in a message: the version it was decided
at is the one this worker last saw) and calls ``apply(intent, decide,
on_stale=Recompute(...))``; ``decide`` takes 0 ms or 2 ms (an external call). Beside
it, doing the same work: the hand-written ``BEGIN; SELECT ... FOR UPDATE; decide;
UPDATE; INSERT applied; COMMIT`` on PostgreSQL, and a redis-py ``Lock`` (acquire; GET;
decide; SET + SADD applied; release) on Redis. Each point of the grid (16 threads or 4
processes, 1 hot key or 64 keys, 0 or 2 ms) runs each side for the same time, the sides
alternating which goes first; goodput is completed work per second (a ``Contended``
outcome is not completed work), client CPU is the workers' ``time.process_time``
(every thread's, or the sum over processes) per completed operation.

One call at a time, the same job through SQLAlchemy's ORM with ``version_id_col``
(load, modify, flush, commit; a ``StaleDataError`` is refused work, not completed) and
through django-concurrency's ``save()`` (in a spawned process with its own Django
settings; a ``RecordModifiedError`` is refused work).
"""

from __future__ import annotations

import json
import multiprocessing
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import fencing

from .._errors import StoreError
from .._url import StoreURL
from .._values import Intent, Record, new_intent_id

__all__ = ["GRID", "QUICK_GRID", "Spec", "run_contention"]

#: (workers, how) x keys x decide milliseconds
WORKERS: Final = (("threads", 16), ("processes", 4))
KEY_COUNTS: Final = (1, 64)
DECIDE_MS: Final = (0.0, 2.0)
GRID: Final = tuple(
    (how, n, keys, ms) for how, n in WORKERS for keys in KEY_COUNTS for ms in DECIDE_MS
)
QUICK_GRID: Final = (("threads", 4, 1, 0.0), ("threads", 4, 64, 2.0), ("processes", 2, 64, 0.0))
RECOMPUTE: Final = fencing.Recompute(attempts=50, backoff=0.0005, max_backoff=0.02)

FENCING: Final = "fencing apply + Recompute"
FOR_UPDATE: Final = "FOR UPDATE txn"
LOCK: Final = "redis-py Lock"
ORM: Final = "SQLAlchemy ORM version_id_col"
DJANGO: Final = "django-concurrency save()"

PG_TABLES: Final = (
    "CREATE TABLE {s}.contention_records (key TEXT PRIMARY KEY, version BIGINT NOT NULL,"
    " state JSONB NOT NULL)",
    "CREATE TABLE {s}.contention_applied (intent_id TEXT PRIMARY KEY, key TEXT NOT NULL)",
)


@dataclass(frozen=True)
class Spec:
    """What a worker (thread or process) needs to open its side: picklable."""

    store: str  # "postgresql" or "redis"
    url: str
    scratch: str  # PostgreSQL schema, or Redis key prefix
    collection: str
    keys: tuple[str, ...]
    decide_ms: float


def _decide_state(state: Any, ms: float) -> dict[str, Any]:
    if ms:
        time.sleep(ms / 1000)
    return {"status": "shipped", "n": int(state["n"]) + 1}


def _fencing_store(spec: Spec, pool: int) -> fencing.Store:
    if spec.store == "postgresql":
        return fencing.open(spec.url, schema=spec.scratch, max_size=pool)
    return fencing.open(spec.url, prefix=f"{spec.scratch}f", table_prefix=f"{spec.scratch}t:")


def make_op(
    spec: Spec, side: str, store: fencing.Store | None
) -> tuple[Callable[[str], bool], Callable[[], None]]:
    """One worker's ``op(key) -> completed`` for ``side``, and its cleanup."""
    ms = spec.decide_ms
    if side == FENCING:
        assert store is not None
        coll = store.collection(spec.collection)
        seen = dict.fromkeys(spec.keys, 1)  # the version this worker's messages were decided at

        def decide(record: Record) -> dict[str, Any]:
            return _decide_state(record.state, ms)

        def apply(key: str) -> bool:
            intent = Intent(new_intent_id(), spec.collection, key, seen[key], "ship")
            outcome = coll.apply(intent, decide, on_stale=RECOMPUTE)
            current = outcome.current
            if current is not None:
                seen[key] = current.version
            return outcome.committed

        return apply, lambda: None
    if side == FOR_UPDATE:
        import psycopg

        conn = psycopg.connect(spec.url.split("?", 1)[0], autocommit=True)
        s = f'"{spec.scratch}"'
        lock = f"SELECT version, state FROM {s}.contention_records WHERE key = %s FOR UPDATE"
        write = f"UPDATE {s}.contention_records SET state = %s::jsonb, version = %s WHERE key = %s"
        insert = f"INSERT INTO {s}.contention_applied (intent_id, key) VALUES (%s, %s)"

        def for_update(key: str) -> bool:
            with conn.transaction():
                version, state = conn.execute(lock, (key,)).fetchone()  # type: ignore[misc]
                new = _decide_state(state, ms)
                conn.execute(write, (json.dumps(new), version + 1, key))
                conn.execute(insert, (new_intent_id(), key))
            return True

        return for_update, conn.close
    if side == LOCK:
        import redis

        r = redis.Redis.from_url(spec.url.split("?", 1)[0], socket_timeout=30)

        def with_lock(key: str) -> bool:
            doc_key = f"{spec.scratch}lock-side:{key}"
            lock = r.lock(doc_key + ":lock", timeout=10.0, blocking_timeout=30.0, sleep=0.001)
            if not lock.acquire():
                return False
            try:
                doc = json.loads(r.get(doc_key))  # type: ignore[arg-type]
                new = _decide_state(doc["s"], ms)
                pipe = r.pipeline(transaction=True)
                pipe.set(doc_key, json.dumps({"v": doc["v"] + 1, "s": new}))
                pipe.sadd(doc_key + ":applied", new_intent_id())
                pipe.execute()
            finally:
                lock.release()
            return True

        return with_lock, r.close
    raise ValueError(side)


def _loop(
    op: Callable[[str], bool], keys: tuple[str, ...], offset: int, until: float
) -> tuple[int, int]:
    """Call ``op`` until ``until``: (completed, calls)."""
    done, i, size, clock = 0, offset, len(keys), time.monotonic
    while clock() < until:
        if op(keys[i % size]):
            done += 1
        i += 1
    return done, i - offset


def _child(spec: Spec, side: str, offset: int, start_at: float, seconds: float, out: Any) -> None:
    """One worker process: open its side, wait for the common start, loop, report."""
    store = _fencing_store(spec, 1) if side == FENCING else None
    op, close = make_op(spec, side, store)
    try:
        delay = start_at - time.time()
        if delay > 0:
            time.sleep(delay)
        cpu0 = time.process_time()
        done, calls = _loop(op, spec.keys, offset, time.monotonic() + seconds)
        out.put((done, time.process_time() - cpu0, calls))
    finally:
        close()
        if store is not None:
            store.close()


def run_point(spec: Spec, side: str, how: str, workers: int, seconds: float) -> dict[str, float]:
    """One side at one grid point: goodput and client CPU per completed operation."""
    if how == "threads":
        store = _fencing_store(spec, workers) if side == FENCING else None
        ops = [make_op(spec, side, store) for _ in range(workers)]
        counts = [(0, 0)] * workers
        start = threading.Barrier(workers + 1)

        def worker(w: int) -> None:
            start.wait()
            counts[w] = _loop(ops[w][0], spec.keys, w, until)

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(workers)]
        for t in threads:
            t.start()
        until = time.monotonic() + seconds
        cpu0, wall0 = time.process_time(), time.monotonic()
        start.wait()
        for t in threads:
            t.join()
        wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
        for _, close in ops:
            close()
        if store is not None:
            store.close()
        done, calls = sum(c[0] for c in counts), sum(c[1] for c in counts)
    else:
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        start_at = time.time() + 2.0 + 0.5 * workers  # spawn and connect first
        procs = [
            ctx.Process(target=_child, args=(spec, side, w, start_at, seconds, queue))
            for w in range(workers)
        ]
        for p in procs:
            p.start()
        results = [queue.get(timeout=120 + seconds) for _ in procs]
        for p in procs:
            p.join()
        done = sum(r[0] for r in results)
        cpu = sum(r[1] for r in results)
        calls = sum(r[2] for r in results)
        wall = seconds
    return {
        "completed": float(done),
        "gave_up": float(calls - done),  # fencing: Contended after every Recompute attempt
        "goodput": done / wall if wall > 0 else 0.0,
        "cpu_us_per_op": cpu * 1e6 / done if done else float("inf"),
    }


# -- set-up per store ---------------------------------------------------------------------
class _Setup:
    def __init__(self, url: str) -> None:
        self.url = url
        parsed = StoreURL.parse(url)
        self.kind = "postgresql" if parsed.scheme in ("postgresql", "postgres") else parsed.scheme
        suffix = uuid.uuid4().hex[:8]
        self.scratch = (
            f"fencing_contention_{suffix}"
            if self.kind == "postgresql"
            else f"fencing_cont:{suffix}:"
        )
        self.collection = f"contention-{suffix}"
        if self.kind == "postgresql":
            import psycopg

            from ._postgres import conninfo

            self.admin: Any = psycopg.connect(conninfo(parsed), autocommit=True)
            self.admin.execute(f'CREATE SCHEMA "{self.scratch}"')
            for ddl in PG_TABLES:
                self.admin.execute(ddl.format(s=f'"{self.scratch}"'))
        elif self.kind == "redis":
            import redis

            self.admin = redis.Redis.from_url(url.split("?", 1)[0])
        else:
            raise StoreError(
                f"fencing bench --contention measures postgresql and redis, not {self.kind}"
            )
        self.store = _fencing_store(self.spec((), 0.0), 2)

    def spec(self, keys: tuple[str, ...], ms: float) -> Spec:
        return Spec(self.kind, self.url, self.scratch, self.collection, keys, ms)

    def records(self, keys: tuple[str, ...]) -> None:
        coll = self.store.collection(self.collection)
        start = {"status": "new", "n": 0}
        for key in keys:
            coll.create(key, start)
        if self.kind == "postgresql":
            s = f'"{self.scratch}"'
            self.admin.execute(
                f"INSERT INTO {s}.contention_records (key, version, state)"
                " SELECT k, 1, %s::jsonb FROM unnest(%s::text[]) k",
                (json.dumps(start), list(keys)),
            )
        else:
            for key in keys:
                self.admin.set(f"{self.scratch}lock-side:{key}", json.dumps({"v": 1, "s": start}))

    def baseline(self) -> str:
        return FOR_UPDATE if self.kind == "postgresql" else LOCK

    def close(self) -> None:
        try:
            self.store.close()
        finally:
            if self.kind == "postgresql":
                self.admin.execute(f'DROP SCHEMA IF EXISTS "{self.scratch}" CASCADE')
            else:
                batch = list(self.admin.scan_iter(match=f"{self.scratch}*", count=1000))
                for i in range(0, len(batch), 500):
                    self.admin.delete(*batch[i : i + 500])
            self.admin.close()


def orm_rows(url: str, seconds: float) -> list[dict[str, Any]]:
    """One call at a time on PostgreSQL: SQLAlchemy's ORM with ``version_id_col`` beside
    fencing's ``apply`` and the ``FOR UPDATE`` transaction, the same job each."""
    try:
        import sqlalchemy as sa
        from sqlalchemy import orm
    except ImportError:
        return [
            {
                "kind": "skipped",
                "store": "postgresql",
                "setting": "contention",
                "operation": ORM,
                "reason": "SQLAlchemy is not installed",
            }
        ]
    setup = _Setup(url)
    try:
        keys = tuple(f"k{i:02d}" for i in range(64))
        setup.records(keys)
        spec = setup.spec(keys, 0.0)

        meta = sa.MetaData(schema=setup.scratch)
        rows_table = sa.Table(
            "contention_records",
            meta,
            sa.Column("key", sa.Text, primary_key=True),
            sa.Column("version", sa.BigInteger, nullable=False),
            sa.Column("state", sa.JSON, nullable=False),
        )
        applied_table = sa.Table(
            "contention_applied",
            meta,
            sa.Column("intent_id", sa.Text, primary_key=True),
            sa.Column("key", sa.Text, nullable=False),
        )

        class Row:
            key: str
            version: int
            state: dict[str, Any]

        class Applied:
            def __init__(self, intent_id: str, key: str) -> None:
                self.intent_id = intent_id
                self.key = key

        registry = orm.registry()
        registry.map_imperatively(Row, rows_table, version_id_col=rows_table.c.version)
        registry.map_imperatively(Applied, applied_table)

        sa_url = url.split("?", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
        engine = sa.create_engine(sa_url)
        make = orm.sessionmaker(engine)

        def orm_op(key: str) -> bool:
            with make() as session:
                row = session.get(Row, key)
                assert row is not None
                row.state = _decide_state(row.state, 0.0)
                session.add(Applied(intent_id=new_intent_id(), key=key))
                try:
                    session.commit()
                except orm.exc.StaleDataError:
                    return False
            return True

        sides: dict[str, tuple[Callable[[str], bool], Callable[[], None]]] = {
            FENCING: make_op(spec, FENCING, setup.store),
            FOR_UPDATE: make_op(spec, FOR_UPDATE, None),
            ORM: (orm_op, engine.dispose),
        }
        rounds = 3

        def measure(op: Callable[[str], bool]) -> Callable[[int], tuple[float, float]]:
            def one_round(r: int) -> tuple[float, float]:
                return _timed(op, keys, r, seconds / rounds)

            return one_round

        measures = {name: measure(op) for name, (op, _) in sides.items()}
        closers = [close for _, close in sides.values()]
        rows: list[dict[str, Any]] = []
        from ._djangoside import DjangoSide

        try:
            django = DjangoSide.start(
                setup.url, setup.admin, setup.scratch, keys, seconds / rounds, _decide_state, _timed
            )
        except BaseException:
            for close in closers:
                close()
            raise
        if isinstance(django, DjangoSide):
            measures[DJANGO] = django.round
            closers.append(django.close)
        else:
            rows.append(
                {
                    "kind": "skipped",
                    "store": "postgresql",
                    "setting": "contention",
                    "operation": DJANGO,
                    "reason": django,
                }
            )
        out: dict[str, list[tuple[float, float]]] = {name: [] for name in measures}
        try:
            for r in range(rounds):
                names = list(measures) if r % 2 == 0 else list(reversed(measures))
                for name in names:
                    out[name].append(measures[name](r))
        finally:
            for close in closers:
                close()
        single = [
            {
                "kind": "single",
                "store": "postgresql",
                "setting": "one call at a time, 64 keys, 0 ms decide",
                "operation": name,
                "wall_us_per_op": statistics.median(s[0] for s in samples),
                "cpu_us_per_op": statistics.median(s[1] for s in samples),
            }
            for name, samples in out.items()
        ]
        return single + rows
    finally:
        setup.close()


def _timed(
    op: Callable[[str], bool], keys: tuple[str, ...], offset: int, seconds: float
) -> tuple[float, float]:
    """Call ``op`` for ``seconds``: wall and client CPU microseconds per completed call."""
    cpu0, wall0 = time.process_time(), time.monotonic()
    done, _ = _loop(op, keys, offset, time.monotonic() + seconds)
    wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
    return wall * 1e6 / max(done, 1), cpu * 1e6 / max(done, 1)


def goodput_target(store: str, keys: int, decide_ms: float) -> float:
    """Issue 21's least goodput over the baseline's at a grid point: ``FOR UPDATE`` at
    least matched, but 0.8x on one hot key with nothing to decide (optimistic retries
    are wasted work there) and 1.2x on many keys with a slow decide (two round trips
    against four, and no lock held while deciding); a redis-py ``Lock`` beaten 3x on one
    hot key and 1.5x on many."""
    if store == "redis":
        return 3.0 if keys == 1 else 1.5
    if keys == 1:
        return 0.8 if decide_ms == 0 else 1.0
    return 1.2 if decide_ms > 0 else 1.0


def run_contention(
    urls: list[str], seconds: float, say: Callable[[str], None], grid: tuple[Any, ...] = GRID
) -> list[dict[str, Any]]:
    """Every grid point on every store: one row per point, fencing beside the baseline."""
    rows: list[dict[str, Any]] = []
    for url in urls:
        try:
            setup = _Setup(url)
        except Exception as exc:  # a server not running, a store without a baseline
            rows.append(
                {
                    "kind": "skipped",
                    "store": url.split(":", 1)[0],
                    "setting": "contention",
                    "operation": None,
                    "reason": f"unavailable: {type(exc).__name__}: {exc}",
                }
            )
            continue
        try:
            baseline = setup.baseline()
            for n, (how, workers, key_count, ms) in enumerate(grid):
                keys = tuple(f"p{n}-{i:02d}" for i in range(key_count))
                setup.records(keys)
                spec = setup.spec(keys, ms)
                order = [FENCING, baseline] if n % 2 == 0 else [baseline, FENCING]
                got = {}
                for side in order:
                    where = f"{workers} {how}, {key_count} keys, {ms:g} ms"
                    say(f"{setup.kind} contention: {where}, {side}")
                    got[side] = run_point(spec, side, how, workers, seconds)
                ours, theirs = got[FENCING], got[baseline]
                ratio = ours["goodput"] / theirs["goodput"] if theirs["goodput"] else float("inf")
                target = goodput_target(setup.kind, key_count, ms)
                plural = "keys" if key_count > 1 else "key"
                rows.append(
                    {
                        "kind": "contention",
                        "store": setup.kind,
                        "setting": f"{workers} {how}",
                        "operation": f"{key_count} {plural}, decide {ms:g} ms",
                        "workers": workers,
                        "how": how,
                        "keys": key_count,
                        "decide_ms": ms,
                        "seconds": seconds,
                        "baseline": baseline,
                        "fencing_goodput": ours["goodput"],
                        "baseline_goodput": theirs["goodput"],
                        "goodput_ratio": ratio,
                        "goodput_target": target,
                        "goodput_met": ratio >= target,
                        "fencing_cpu_us_per_op": ours["cpu_us_per_op"],
                        "baseline_cpu_us_per_op": theirs["cpu_us_per_op"],
                        "cpu_ratio": ours["cpu_us_per_op"] / theirs["cpu_us_per_op"],
                        "fencing_completed": ours["completed"],
                        "fencing_gave_up": ours["gave_up"],
                    }
                )
        finally:
            setup.close()
        if setup.kind == "postgresql":
            rows += orm_rows(url, max(0.3, seconds))
    return rows
