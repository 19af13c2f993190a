"""``fencing bench --server-cost``: the server's own time per commit, beside the
hand-written code's.

PostgreSQL: ``pg_stat_statements`` needs ``shared_preload_libraries`` and a restart,
which a shared server may not allow; this measures instead the CPU time of the server
backend process serving each side (``/proc/<pid>/schedstat``, nanoseconds on CPU: the
server must run on this machine), found by ``application_name`` (fencing, one pooled
connection) and ``pg_backend_pid()`` (the baseline). That is parse, plan, execute and
commit, everything the server's backend does for the client; WAL writing by the
background processes is left out on both sides.

Redis: the delta of ``INFO commandstats`` for ``evalsha`` (both sides run their Lua
scripts by EVALSHA) over a block of commits, side by side in alternating blocks: the
script's time per call and per commit. Other clients of the same server running
EVALSHA at the same time would be counted too: run it on a quiet server.
"""

from __future__ import annotations

import os
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any, Final

from .._values import Intent, new_intent_id
from ._common import START, check_committed

__all__ = ["run_server_cost"]

ROUNDS: Final = 3


def _schedstat(pid: int) -> int:
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def _state(i: int) -> dict[str, Any]:
    return {"status": "shipped", "n": i}


def _commits(
    coll: Any, hand: Any, theirs: str, keys: list[str]
) -> tuple[Callable[[int], None], Callable[[int], None]]:
    """The two sides of a server-cost contest: ``n`` commits through fencing's
    collection ``coll``, and ``n`` through the hand-written same-answer statement on
    ``theirs``, each on its own records at their own versions."""
    versions = dict.fromkeys(keys, 1)
    hand_versions = dict.fromkeys(keys, 1)

    def ours(n: int) -> None:
        for i in range(n):
            key = keys[i % len(keys)]
            intent = Intent(new_intent_id(), coll.name, key, versions[key], "ship")
            check_committed(coll.commit(intent, _state(i)))
            versions[key] += 1

    def same_answer(n: int) -> None:
        for i in range(n):
            key = keys[i % len(keys)]
            answer = hand.answer_commit(theirs, key, hand_versions[key], _state(i), new_intent_id())
            assert answer[0] == "committed", answer
            hand_versions[key] += 1

    return ours, same_answer


def _postgres(url: str, ops: int) -> list[dict[str, Any]]:
    from ._postgres import PostgresBench

    app = f"fencing-bench-{uuid.uuid4().hex[:8]}"
    sep = "&" if "?" in url else "?"
    bench = PostgresBench(f"{url}{sep}application_name={app}&min_size=1&max_size=1")
    try:
        hand = bench._hand
        coll = bench.store.collection(f"cost-{app}")
        keys = [f"k{i:02d}" for i in range(100)]
        for key in keys:
            coll.create(key, START)
        coll.get(keys[0])
        theirs = f"cost-{app}/hand"
        hand.create_records(theirs, keys)
        me = hand.conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        pids = [
            r[0]
            for r in hand.conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND pid <> %s",
                (app, me),
            )
        ]
        if len(pids) != 1:
            return [_skip("postgresql", f"found {len(pids)} fencing server backends, not 1")]
        try:
            _schedstat(me)
        except OSError as exc:
            return [_skip("postgresql", f"the server's processes are not visible here: {exc}")]
        ours, same_answer = _commits(coll, hand, theirs, keys)

        sides: list[tuple[str, Callable[[int], None], int]] = [
            ("fencing collection.commit", ours, pids[0]),
            ("same answer (one statement)", same_answer, me),
        ]
        return _alternate("postgresql", sides, ops, _schedstat, "server backend CPU µs per commit")
    finally:
        bench.close()


def _redis(url: str, ops: int) -> list[dict[str, Any]]:
    from ._redis import RedisBench

    bench = RedisBench(url)
    try:
        hand = bench._client
        answering: Any = bench.hand
        coll = bench.store.collection(f"cost-{bench.suffix}")
        keys = [f"k{i:02d}" for i in range(100)]
        for key in keys:
            coll.create(key, START)
        theirs = f"cost-{bench.suffix}/hand"
        answering.answer_records(theirs, keys)
        ours, same_answer = _commits(coll, answering, theirs, keys)

        def evalsha_usec(_: int) -> int:
            stats = hand.info("commandstats").get("cmdstat_evalsha", {})
            return int(stats.get("usec", 0)) * 1000  # ns, as schedstat

        sides: list[tuple[str, Callable[[int], None], int]] = [
            ("fencing collection.commit", ours, 0),
            ("same answer (one Lua script)", same_answer, 0),
        ]
        return _alternate("redis", sides, ops, evalsha_usec, "EVALSHA µs per commit")
    finally:
        bench.close()


def _alternate(
    store: str,
    sides: list[tuple[str, Callable[[int], None], int]],
    ops: int,
    meter: Callable[[int], int],
    what: str,
) -> list[dict[str, Any]]:
    per: dict[str, list[float]] = {name: [] for name, _, _ in sides}
    wall: dict[str, list[float]] = {name: [] for name, _, _ in sides}
    for r in range(ROUNDS):
        order = sides if r % 2 == 0 else list(reversed(sides))
        for name, run, pid in order:
            run(min(ops, 20))  # warm
            before, t0 = meter(pid), time.perf_counter()
            run(ops)
            wall[name].append((time.perf_counter() - t0) * 1e6 / ops)
            per[name].append((meter(pid) - before) / 1e3 / ops)
    (ours_name, _, _), (theirs_name, _, _) = sides
    ours, theirs = statistics.median(per[ours_name]), statistics.median(per[theirs_name])
    return [
        {
            "kind": "server",
            "store": store,
            "setting": what,
            "operation": "collection.commit",
            "fencing_method": ours_name,
            "baseline": theirs_name,
            "ops_per_round": ops,
            "rounds": ROUNDS,
            "fencing_server_us": ours,
            "baseline_server_us": theirs,
            "ratio": ours / theirs if theirs else float("inf"),
            "fencing_wall_us": statistics.median(wall[ours_name]),
            "baseline_wall_us": statistics.median(wall[theirs_name]),
            "loadavg": os.getloadavg()[0],
        }
    ]


def _skip(store: str, reason: str) -> dict[str, Any]:
    return {
        "kind": "skipped",
        "store": store,
        "setting": "server cost",
        "operation": None,
        "reason": reason,
    }


def run_server_cost(urls: list[str], ops: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for url in urls:
        scheme = url.split(":", 1)[0]
        try:
            if scheme in ("postgresql", "postgres"):
                rows += _postgres(url, ops)
            elif scheme in ("redis", "rediss"):
                rows += _redis(url, ops)
            else:
                rows.append(_skip(scheme, "server cost is measured on PostgreSQL and Redis"))
        except Exception as exc:  # a server not running
            rows.append(_skip(scheme, f"unavailable: {type(exc).__name__}: {exc}"))
    return rows
