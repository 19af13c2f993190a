"""``fencing bench --scale``: how a commit's cost grows with the work already done.

For each size (10^3, 10^5, 10^6; ``--quick``: 10^2 and 10^3), a fresh store gets that
many records and that many applied intent ids (the retention horizon full: every id is
kept), written in bulk straight into fencing's own tables (``fencing_records``,
``fencing_applied``: the same rows commits would leave). Then commits on random records
are timed one by one (p50, p99). At the largest size, ``store.prune()`` runs (every
applied id is older than the horizon) while a second thread keeps committing: the
prune's time, the rows it removed, and the concurrent commits' latency during the prune
beside the same thread's just before it.

SQLite (a temp WAL file) and PostgreSQL (a scratch schema).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Final

import fencing

from .._values import Intent, new_intent_id
from ._harness import percentile

__all__ = ["QUICK_SIZES", "SIZES", "run_scale"]

SIZES: Final = (1_000, 100_000, 1_000_000)
QUICK_SIZES: Final = (100, 1_000)
COLLECTION: Final = "scale"
DAY: Final = 86_400.0


class _Target:
    """A fresh store of one kind and a raw connection to its database."""

    def __init__(self, url: str | None) -> None:
        self.tmpdir: str | None = None
        self.schema: str | None = None
        if url is None or url.startswith("sqlite"):
            import sqlite3

            self.kind = "sqlite"
            self.tmpdir = tempfile.mkdtemp(prefix="fencing-scale-")
            path = os.path.join(self.tmpdir, "scale.db")
            self.store = fencing.open(f"sqlite:///{path}")
            self.raw: Any = sqlite3.connect(path, timeout=60.0, isolation_level=None)
            self.setting = "WAL file, synchronous=FULL"
        else:
            import psycopg

            from .._url import StoreURL
            from ._postgres import conninfo

            self.kind = "postgresql"
            self.schema = f"fencing_scale_{uuid.uuid4().hex[:8]}"
            self.raw = psycopg.connect(conninfo(StoreURL.parse(url)), autocommit=True)
            self.store = fencing.open(url, schema=self.schema)
            self.setting = "server"
        self.store.collection(COLLECTION).create("probe", {"n": 0})  # makes the tables

    def fill(self, size: int) -> None:
        """``size`` records at version 1 and ``size`` applied ids two days old."""
        old = time.time() - 2 * DAY
        scope = f"c:{COLLECTION}"
        if self.kind == "sqlite":
            seq = "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?)"
            self.raw.execute("BEGIN IMMEDIATE")
            self.raw.execute(
                f"{seq} INSERT INTO fencing_records (collection, key, version, fence, state,"
                " updated_at) SELECT ?, printf('r%08d', i), 1, 0, '{\"n\": 0}', ? FROM n",
                (size, COLLECTION, old),
            )
            self.raw.execute(
                f"{seq} INSERT INTO fencing_applied (scope, intent_id, key, applied_at)"
                " SELECT ?, printf('%012x%020x', i, i), printf('r%08d', i), ? FROM n",
                (size, scope, old),
            )
            self.raw.execute("COMMIT")
        else:
            s = f'"{self.schema}"'
            self.raw.execute(
                f"INSERT INTO {s}.fencing_records (collection, key, version, fence, state,"
                " updated_at) SELECT %s, 'r' || lpad(i::text, 8, '0'), 1, 0, '{\"n\": 0}',"
                " %s FROM generate_series(0, %s - 1) i",
                (COLLECTION, old, size),
            )
            self.raw.execute(
                f"INSERT INTO {s}.fencing_applied (scope, intent_id, key, applied_at)"
                " SELECT %s, lpad(to_hex(i), 12, '0') || md5(i::text),"
                " 'r' || lpad(i::text, 8, '0'), %s FROM generate_series(0, %s - 1) i",
                (scope, old, size),
            )
            self.raw.execute(f"ANALYZE {s}.fencing_records")
            self.raw.execute(f"ANALYZE {s}.fencing_applied")

    def close(self) -> None:
        try:
            self.store.close()
        finally:
            if self.schema is not None:
                self.raw.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')
            self.raw.close()
            if self.tmpdir is not None:
                shutil.rmtree(self.tmpdir, ignore_errors=True)


def _committer(
    store: fencing.Store, size: int, seed: int, versions: dict[str, int]
) -> Callable[[], int]:
    """A function that commits on a random record and returns its time in ns;
    ``versions`` holds every record's version as far as the bench's commits moved it."""
    coll = store.collection(COLLECTION)
    rng = random.Random(seed)

    def one() -> int:
        key = f"r{rng.randrange(size):08d}"
        version = versions.get(key, 1)
        intent = Intent(new_intent_id(), COLLECTION, key, version, "ship")
        t0 = time.perf_counter_ns()
        outcome = coll.commit(intent, {"n": version})
        took = time.perf_counter_ns() - t0
        if not outcome.committed:
            raise RuntimeError(f"a scale commit did not apply: {outcome!r}")
        versions[key] = version + 1
        return took

    return one


def _latency_row(kind: str, setting: str, size: int, lat: list[int]) -> dict[str, Any]:
    lat.sort()
    return {
        "kind": "scale",
        "store": kind,
        "setting": setting,
        "operation": "collection.commit",
        "records": size,
        "applied": size,
        "commits": len(lat),
        "p50_us": percentile(lat, 0.5, ordered=True) / 1e3,
        "p99_us": percentile(lat, 0.99, ordered=True) / 1e3,
        "mean_us": statistics.fmean(lat) / 1e3,
    }


def _prune_row(
    target: _Target, size: int, commits: int, versions: dict[str, int]
) -> dict[str, Any]:
    """prune() at ``size`` applied ids, while another thread commits."""
    one = _committer(target.store, size, 2, versions)
    before = [one() for _ in range(commits)]
    during: list[int] = []
    stop = threading.Event()

    def keep_committing() -> None:
        while not stop.is_set():
            during.append(one())

    worker = threading.Thread(target=keep_committing)
    worker.start()
    try:
        t0 = time.perf_counter()
        removed = target.store.prune(older_than=DAY)
        took = time.perf_counter() - t0
    finally:
        stop.set()
        worker.join()
    row: dict[str, Any] = {
        "kind": "prune",
        "store": target.kind,
        "setting": target.setting,
        "operation": "store.prune() with a committing thread",
        "applied": size,
        "removed": removed,
        "prune_s": took,
        "commits_during": len(during),
        "before_p50_us": percentile(before, 0.5) / 1e3,
        "before_p99_us": percentile(before, 0.99) / 1e3,
    }
    if during:
        row.update(
            during_p50_us=percentile(during, 0.5) / 1e3,
            during_p99_us=percentile(during, 0.99) / 1e3,
            during_max_us=max(during) / 1e3,
        )
    return row


def run_scale(
    urls: list[str | None], quick: bool, say: Callable[[str], None]
) -> list[dict[str, Any]]:
    sizes = QUICK_SIZES if quick else SIZES
    commits = 30 if quick else 2_000
    rows: list[dict[str, Any]] = []
    for url in urls:
        scheme = (url or "sqlite").split(":", 1)[0]
        if scheme not in ("sqlite", "postgresql", "postgres"):
            rows.append(
                {
                    "kind": "skipped",
                    "store": scheme,
                    "setting": "scale",
                    "operation": None,
                    "reason": "--scale measures SQLite and PostgreSQL",
                }
            )
            continue
        for size in sizes:
            try:
                target = _Target(url)
            except Exception as exc:  # a server not running
                rows.append(
                    {
                        "kind": "skipped",
                        "store": (url or "sqlite").split(":", 1)[0],
                        "setting": "scale",
                        "operation": None,
                        "reason": f"unavailable: {type(exc).__name__}: {exc}",
                    }
                )
                break
            try:
                say(f"{target.kind} scale: filling {size:,} records and applied ids")
                target.fill(size)
                versions: dict[str, int] = {}
                one = _committer(target.store, size, 1, versions)
                for _ in range(min(50, commits)):
                    one()  # warm: caches, prepared statements
                lat = [one() for _ in range(commits)]
                rows.append(_latency_row(target.kind, target.setting, size, lat))
                if size == sizes[-1]:
                    say(f"{target.kind} scale: prune at {size:,}")
                    rows.append(_prune_row(target, size, min(commits, 500), versions))
            finally:
                with contextlib.suppress(Exception):
                    target.close()
    return rows
