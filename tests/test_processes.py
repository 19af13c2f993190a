"""Real processes (spawned) and threads hammering one key on a store shared between them.

Each worker records its outcomes as JSON lines (the ``fencing.testing`` history format);
the history is judged directly (every committed version appears once, contiguous from 2
to the final version, each applied over the version it was decided against, no intent
applied twice) and by ``fencing.testing.check_history`` when it is available. A naive
read-modify-write on the same schedule must show anomalies under the same judge, or the
test would prove nothing.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

import fencing
from fencing import Recompute
from fencing.testing import final_event, outcome_event

SPAWN = multiprocessing.get_context("spawn")
COLLECTION, KEY = "hot", "counter"
JOIN_TIMEOUT = 240.0


def hammer(
    url: str, rounds: int, threads: int, out_path: str, worker: str, start: Any | None
) -> None:
    """A worker process: ``threads`` threads, each applying ``rounds`` increments."""
    store = fencing.open(url)
    orders = store.collection(COLLECTION)
    policy = Recompute(attempts=500, backoff=0.001, max_backoff=0.02)
    lock = threading.Lock()
    fd = os.open(out_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def run(tid: int) -> None:
        for _ in range(rounds):
            intent = orders.intent(KEY, "inc")
            out = orders.apply(intent, lambda r: {"n": r.state["n"] + 1}, on_stale=policy)
            line = json.dumps(outcome_event(out, intent, worker=f"{worker}.t{tid}")) + "\n"
            with lock:
                os.write(fd, line.encode())

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    if start is not None:
        start.wait(60)  # every process starts hammering at once
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    os.close(fd)
    store.close()


def naive_hammer(path: str, rounds: int, out_path: str, worker: str, start: Any) -> None:
    """The control: read, work, write back without any condition (a plain ``save()``)."""
    conn = sqlite3.connect(path, timeout=60, isolation_level=None)
    where = "WHERE collection = ? AND key = ?"
    fd = os.open(out_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    start.wait(60)
    for _ in range(rounds):
        read = conn.execute(
            f"SELECT version, state FROM fencing_records {where}", (COLLECTION, KEY)
        )
        version, state = read.fetchone()
        n = json.loads(state)["n"]
        time.sleep(0.002)  # the task's work, between its read and its write
        conn.execute("BEGIN IMMEDIATE")
        (actual,) = conn.execute(
            f"SELECT version FROM fencing_records {where}", (COLLECTION, KEY)
        ).fetchone()
        conn.execute(
            f"UPDATE fencing_records SET state = ?, version = ? {where}",
            (json.dumps({"n": n + 1}), version + 1, COLLECTION, KEY),
        )
        conn.execute("COMMIT")
        intent_id = uuid.uuid4().hex
        event = {
            "event": "outcome",
            "t": time.time(),
            "worker": worker,
            "collection": COLLECTION,
            "key": KEY,
            "intent_id": intent_id,
            "root_id": intent_id,
            "transition": "inc",
            "expected_version": version,
            "outcome": "committed",
            "version": version + 1,
            "applied_over": actual,
            "token": None,
            "fence": 0,
        }
        os.write(fd, (json.dumps(event) + "\n").encode())
    os.close(fd)
    conn.close()


def run_processes(target: Callable[..., None], args: Iterable[tuple[Any, ...]]) -> None:
    procs = [SPAWN.Process(target=target, args=a) for a in args]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(JOIN_TIMEOUT)
        assert [p.exitcode for p in procs] == [0] * len(procs)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()


def read_history(paths: Iterable[Path]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for path in paths:
        if path.exists():
            events += [json.loads(line) for line in path.read_text().splitlines() if line]
    return events


def problems(events: list[dict[str, Any]], final: Mapping[str, Any]) -> list[str]:
    """The version chain judged directly: what is wrong with this history, if anything."""
    found: list[str] = []
    committed = [e for e in events if e["outcome"] == "committed"]
    versions = sorted(e["version"] for e in committed)
    if versions != list(range(2, 2 + len(committed))):
        seen: dict[int, int] = {}
        for v in versions:
            seen[v] = seen.get(v, 0) + 1
        twice = sorted(v for v, n in seen.items() if n > 1)
        found.append(f"committed versions are not 2..{1 + len(committed)}: repeated {twice[:10]}")
    if final["version"] != 1 + len(committed):
        found.append(f"final version {final['version']} != 1 + {len(committed)} committed")
    if final["state"] != {"n": len(committed)}:
        found.append(f"final state {final['state']} after {len(committed)} committed increments")
    over = [e for e in committed if e["applied_over"] != e["expected_version"]]
    if over:
        found.append(f"{len(over)} writes applied over a version they were not decided against")
    if any(e["version"] != e["expected_version"] + 1 for e in committed):
        found.append("a committed version is not its expected version + 1")
    roots = [e["root_id"] for e in committed]
    if len(set(roots)) != len(roots):
        found.append("an intent was applied twice")
    return found


def checker_report(events: list[dict[str, Any]], final: Mapping[str, Any]) -> Any:
    """``fencing.testing.check_history``'s report, or None if the checker is not there."""
    try:
        from fencing.testing import check_history
    except ImportError:  # pragma: no cover - the checker is written alongside this suite
        return None
    return check_history([*events, dict(final)])


def judge_fencing_run(events: list[dict[str, Any]], store_url: str, expected: int) -> int:
    store = fencing.open(store_url)
    try:
        final = final_event(COLLECTION, KEY, store.collection(COLLECTION).get(KEY))
    finally:
        store.close()
    assert len(events) == expected, "every apply is recorded once"
    kinds = {e["outcome"] for e in events}
    assert kinds <= {"committed", "contended"}, kinds
    assert problems(events, final) == []
    report = checker_report(events, final)
    if report is not None:
        assert report.ok, report.summary()
        assert report.outcomes["committed"] == sum(e["outcome"] == "committed" for e in events)
    committed = sum(e["outcome"] == "committed" for e in events)
    assert committed > 0
    return committed


def create_counter(store_url: str) -> None:
    store = fencing.open(store_url)
    try:
        store.collection(COLLECTION).create(KEY, {"n": 0})
    finally:
        store.close()


@pytest.mark.slow
def test_four_processes_hammer_one_key(
    shared_backend_name: str, store_url: str, tmp_path: Path
) -> None:
    create_counter(store_url)
    processes, rounds = 4, 25
    start = SPAWN.Barrier(processes)
    paths = [tmp_path / f"history-{i}.jsonl" for i in range(processes)]
    run_processes(
        hammer, [(store_url, rounds, 1, str(p), f"p{i}", start) for i, p in enumerate(paths)]
    )
    judge_fencing_run(read_history(paths), store_url, processes * rounds)


@pytest.mark.slow
def test_processes_times_threads_hammer_one_key(
    shared_backend_name: str, store_url: str, tmp_path: Path
) -> None:
    create_counter(store_url)
    processes, threads, rounds = 2, 4, 10
    start = SPAWN.Barrier(processes)
    path = tmp_path / "history.jsonl"  # one file shared by every process and thread
    run_processes(
        hammer, [(store_url, rounds, threads, str(path), f"p{i}", start) for i in range(processes)]
    )
    judge_fencing_run(read_history([path]), store_url, processes * threads * rounds)


def test_eight_threads_on_the_file_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'threads.sqlite'}"
    create_counter(url)
    path = tmp_path / "history.jsonl"
    hammer(url, 10, 8, str(path), "main", None)
    judge_fencing_run(read_history([path]), url, 80)


@pytest.mark.slow
def test_naive_read_modify_write_fails_the_same_judge(tmp_path: Path) -> None:
    db = tmp_path / "naive.sqlite"
    url = f"sqlite:///{db}"
    create_counter(url)
    processes, rounds = 4, 25
    start = SPAWN.Barrier(processes)
    paths = [tmp_path / f"naive-{i}.jsonl" for i in range(processes)]
    run_processes(
        naive_hammer, [(str(db), rounds, str(p), f"n{i}", start) for i, p in enumerate(paths)]
    )
    events = read_history(paths)
    assert len(events) == processes * rounds
    store = fencing.open(url)
    try:
        final = final_event(COLLECTION, KEY, store.collection(COLLECTION).get(KEY))
    finally:
        store.close()
    found = problems(events, final)
    assert found, "the naive run lost no update: the schedule has no contention"
    assert final["state"]["n"] < processes * rounds  # acknowledged increments were lost
    report = checker_report(events, final)
    if report is not None:
        assert not report.ok
        assert report.counts["lost_update"] > 0


def record_effect(url: str, intent_json: str, out_path: str, start: Any) -> None:
    """A worker process: records the same effect of the same intent as the others."""
    store = fencing.open(url)
    orders = store.collection(COLLECTION)
    intent = fencing.Intent.from_json(intent_json)
    start.wait(60)
    effect = orders.effect(intent, "charge", detail={"pid": os.getpid()})
    with open(out_path, "w") as out:
        json.dump(effect.to_dict(), out)
    store.close()


@pytest.mark.slow
def test_processes_recording_one_effect_make_one(
    shared_backend_name: str, store_url: str, tmp_path: Path
) -> None:
    create_counter(store_url)
    with fencing.open(store_url) as store:
        intent = store.collection(COLLECTION).intent(KEY, "charge")
    processes = 4
    start = SPAWN.Barrier(processes)
    paths = [tmp_path / f"effect-{i}.json" for i in range(processes)]
    run_processes(record_effect, [(store_url, intent.to_json(), str(p), start) for p in paths])
    seen = [json.loads(p.read_text()) for p in paths]
    assert all(s == seen[0] for s in seen), seen  # the first recording won, for everyone
    with fencing.open(store_url) as store:
        counter = store.collection(COLLECTION)
        (effect,) = counter.effects(intent)
        assert effect.to_dict() == seen[0]
        counter.commit(counter.intent(KEY, "move"), {"n": 1})
        assert isinstance(counter.commit(intent, {"n": 2}), fencing.Stale)
        (listed,) = store.effects_to_reconcile()
        assert listed.idempotency_key == effect.idempotency_key and listed.outcome == "stale"
