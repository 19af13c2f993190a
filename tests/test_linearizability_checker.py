"""The linearizability checker of ``fencing.testing``, proven on hand-built histories.

Each scenario is a linearizable history with real overlap (it must pass), and the
same history with ONE planted wrong answer (it must fail, naming the partition and
the operation that could not be placed). Then property tests: a random workload run
one operation at a time on a memory store is linearizable, however its intervals are
stretched to overlap; with one version or token answer changed, it is not.
"""

from __future__ import annotations

import itertools
import json
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import fencing
from fencing.testing import (
    HistoryError,
    HistoryWriter,
    Operation,
    check_linearizable,
    lin_event,
    read_lin_file,
)

from ._lin_churn import Config, SyncDriver, plan

A, B = "c:orders/a", "c:orders/b"


def op(
    kind: str, args: dict[str, Any], result: Any, t0: int, t1: int | None, who: str = ""
) -> Operation:
    return Operation(kind, args, result, t0, t1, "p", who)


def commit(key: str, expected: int | None, root: str, state: Any, **extra: Any) -> dict[str, Any]:
    return {"key": key, "expected": expected, "root": root, "state": state, **extra}


def ok(outcome: str, version: int | None, **extra: Any) -> dict[str, Any]:
    return {"outcome": outcome, "version": version, **extra}


def planted(history: list[Operation], index: int, result: Any) -> list[Operation]:
    """The same history with operation ``index`` answering ``result`` instead."""
    out = list(history)
    o = out[index]
    out[index] = Operation(o.op, o.args, result, o.invoke, o.ret, o.process, o.thread)
    return out


def assert_linearizable(history: list[Operation]) -> None:
    report = check_linearizable(history)
    assert report.ok is True, report.summary()


def assert_caught(history: list[Operation], culprit: int) -> str:
    report = check_linearizable(history)
    assert report.ok is False, report.summary()
    text = report.summary()
    assert "NOT linearizable" in text
    bad = report.failures()[0]
    # the explanation names operations by their index in the history
    shown = {o.index for o in bad.stuck} | {o.index for o in bad.order}
    assert culprit in shown, text
    return text


# -- scenarios: (history, index of the answer to plant, the wrong answer) ---------------
def recreate() -> tuple[list[Operation], int, Any]:
    """A delete overlapping a create and a re-create: versions continue after the tombstone."""
    h = [
        op("create", {"key": A, "state": {"n": 0}}, {"version": 1}, 0, 10),
        op("commit", commit(A, 1, "r1", {"n": 1}), ok("committed", 2), 5, 30),
        op("delete", {"key": A}, True, 20, 50),  # overlaps the commit
        op("create", {"key": A, "state": {"n": 9}}, {"version": 3}, 40, 70),  # overlaps the delete
        op("get", {"key": A}, {"version": 3, "state": {"n": 9}}, 60, 80),
        op("commit", commit(A, 2, "r2", {"n": 3}), ok("stale", 3), 75, 90),
    ]
    return h, 3, {"version": 1}  # the bug: the re-created record reuses version 1


def stale_committed() -> tuple[list[Operation], int, Any]:
    """Two commits decided against version 1, overlapping: one commits, one is stale."""
    h = [
        op("create", {"key": A, "state": {"n": 0}}, {"version": 1}, 0, 5),
        op("commit", commit(A, 1, "r1", {"n": 1}), ok("committed", 2), 10, 40, "t1"),
        op("commit", commit(A, 1, "r2", {"n": 2}), ok("stale", 2), 20, 50, "t2"),
        op("get", {"key": A}, {"version": 2, "state": {"n": 1}}, 45, 60),
    ]
    return h, 2, ok("committed", 2)


def duplicate_other_key() -> tuple[list[Operation], int, Any]:
    """One intent id committed to a and to b commits both; a retry on a is Duplicate."""
    h = [
        op("create", {"key": A, "state": {}}, {"version": 1}, 0, 5),
        op("create", {"key": B, "state": {}}, {"version": 1}, 1, 6),
        op("commit", commit(A, 1, "same", {"x": 1}), ok("committed", 2), 10, 30),
        op("commit", commit(B, 1, "same", {"x": 1}), ok("committed", 2), 20, 40),
        op("commit", commit(A, 1, "same", {"x": 1}), ok("duplicate", 2), 35, 50),
    ]
    return h, 3, ok("duplicate", 1)  # "already applied" where it never was


def batch_two_moments() -> tuple[list[Operation], int, Any]:
    """A batch over a and b, overlapping a commit to each: it answers from one moment."""
    items = [commit(A, 1, "ba", {"n": 1}), commit(B, 2, "bb", {"n": 1})]
    h = [
        op("create", {"key": A, "state": {}}, {"version": 1}, 0, 5),
        op("create", {"key": B, "state": {}}, {"version": 1}, 1, 6),
        op("commit_many", {"items": items}, [ok("stale", 2), ok("committed", 3)], 10, 100),
        op("commit", commit(A, 1, "ca", {"n": 2}), ok("committed", 2), 20, 40, "t2"),
        op("commit", commit(B, 1, "cb", {"n": 2}), ok("committed", 2), 50, 70, "t3"),
        op("get", {"key": A}, {"version": 2, "state": {"n": 2}}, 110, 120),
    ]
    # planted: a as it was before the commit to a, b as it is after the commit to b
    return h, 2, [ok("committed", 2), ok("committed", 3)]


def fenced_token() -> tuple[list[Operation], int, Any]:
    """Token 1's commit overlapping token 2's grant is fenced; it may not land after."""
    lease = {"lease": "orders/a"}
    h = [
        op("create", {"key": A, "state": {}}, {"version": 1}, 0, 5),
        op("acquire", {"name": "orders/a"}, {"token": 1}, 6, 8, "t1"),
        op("acquire", {"name": "orders/a"}, {"token": 2}, 20, 30, "t2"),  # t1's TTL ran out
        op(
            "commit",
            commit(A, 1, "z", {"by": 1}, **lease, token=1),
            ok("fenced", 1, reason="newer_owner"),
            25,
            60,
            "t1",
        ),
        op(
            "commit",
            commit(A, 1, "w", {"by": 2}, **lease, token=2),
            ok("committed", 2),
            40,
            50,
            "t2",
        ),
        op("get", {"key": A}, {"version": 2, "state": {"by": 2}}, 65, 70),
    ]
    # planted: the zombie (token 1) also commits, *after* token 2 was granted and wrote
    wrong = [*h[:5], op("get", {"key": A}, {"version": 3, "state": {"by": 1}}, 65, 70)]
    return wrong, 3, ok("committed", 3)


def read_never_written() -> tuple[list[Operation], int, Any]:
    h = [
        op("create", {"key": A, "state": {"n": 0}}, {"version": 1}, 0, 5),
        op("commit", commit(A, 1, "r1", {"n": 1}), ok("committed", 2), 10, 30),
        op("get", {"key": A}, {"version": 1, "state": {"n": 0}}, 15, 25),  # overlaps: old value
        op("get", {"key": A}, {"version": 2, "state": {"n": 1}}, 20, 40),
    ]
    return h, 3, {"version": 2, "state": {"n": 7}}


def lost_commit() -> tuple[list[Operation], int, Any]:
    h = [
        op("create", {"key": A, "state": {"n": 0}}, {"version": 1}, 0, 5),
        op("commit", commit(A, 1, "r1", {"n": 1}), ok("committed", 2), 10, 20),
        op("commit", commit(A, 2, "r2", {"n": 2}), ok("committed", 3), 15, 30),
        op("get", {"key": A}, {"version": 3, "state": {"n": 2}}, 35, 40),
    ]
    return h, 3, {"version": 2, "state": {"n": 1}}  # the acknowledged second commit is gone


SCENARIOS: dict[str, Callable[[], tuple[list[Operation], int, Any]]] = {
    "version reused after delete and re-create": recreate,
    "stale commit reported committed": stale_committed,
    "duplicate reported for another key": duplicate_other_key,
    "batch answered from two moments": batch_two_moments,
    "commit under token t after t+1 was granted": fenced_token,
    "read of a value never written": read_never_written,
    "lost acknowledged commit": lost_commit,
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_a_linearizable_history_passes(name: str) -> None:
    history, _index, _wrong = SCENARIOS[name]()
    if name == "commit under token t after t+1 was granted":
        history = [*history[:5], op("get", {"key": A}, {"version": 2, "state": {"by": 2}}, 65, 70)]
    assert_linearizable(history)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_one_wrong_answer_is_caught(name: str) -> None:
    history, index, wrong = SCENARIOS[name]()
    assert_caught(planted(history, index, wrong), index)


def test_unknown_outcome_may_land_later_or_never() -> None:
    unknown = op("commit", commit(A, 1, "u", {"n": 1}), None, 10, None)
    base = [op("create", {"key": A, "state": {"n": 0}}, {"version": 1}, 0, 5), unknown]
    never = [*base, op("get", {"key": A}, {"version": 1, "state": {"n": 0}}, 20, 30)]
    landed_late = [*never, op("get", {"key": A}, {"version": 2, "state": {"n": 1}}, 40, 50)]
    retried = [*base, op("commit", commit(A, 1, "u", {"n": 1}), ok("duplicate", 2), 20, 30)]
    for history in (never, landed_late, retried):
        assert_linearizable(history)
    # but it cannot be undone once seen, nor land before it was invoked
    undone = [*landed_late, op("get", {"key": A}, {"version": 1, "state": {"n": 0}}, 60, 70)]
    assert check_linearizable(undone).ok is False
    early = [
        base[0],
        op("get", {"key": A}, {"version": 2, "state": {"n": 1}}, 6, 8),
        op("commit", commit(A, 1, "u", {"n": 1}), None, 10, None),
    ]
    assert check_linearizable(early).ok is False


def test_a_lease_may_expire_but_tokens_never_go_back() -> None:
    name = {"name": "L"}
    h = [
        op("create", {"key": A, "state": {}}, {"version": 1}, 0, 5),
        op("acquire", name, {"token": 1}, 10, 11),
        op(
            "commit",
            commit(A, 1, "x", {}, lease="L", token=1),
            ok("fenced", 1, reason="expired"),
            12,
            13,
        ),
        op("acquire", name, {"token": 2}, 20, 21),  # the TTL ran out: granted again
        op("release", {"name": "L", "token": 2}, True, 30, 31),
        op("acquire", name, {"token": 3}, 40, 41),
    ]
    assert_linearizable(h)
    assert check_linearizable(planted(h, 5, {"token": 2})).ok is False  # a token reused
    assert check_linearizable(planted(h, 5, "held")).ok is False  # released: it is free
    # fenced as expired while a newer token holds it: the reason is wrong
    wrong = planted(h, 2, ok("fenced", 1, reason="newer_owner"))
    assert check_linearizable(wrong).ok is False


def test_a_superseded_token_cannot_release_the_newer_holders_lease() -> None:
    """Token 1 ran out and token 2 was granted: token 1's release is refused and token 2
    still holds the lease. A history where token 1's release succeeded (freeing the
    newer holder's lease) is not linearizable (issue 23's survivor)."""
    name = {"name": "L"}
    h = [
        op("acquire", name, {"token": 1}, 10, 11),
        op("acquire", name, {"token": 2}, 20, 21),  # token 1's TTL ran out
        op("release", {"name": "L", "token": 1}, False, 30, 31),
        op("acquire", name, "held", 40, 41),  # token 2 holds it still
    ]
    assert_linearizable(h)
    assert_caught(planted(h, 2, True), 2)  # the old token freed the new holder's lease
    # the same answer with nothing after it: a release of token 1 can never succeed
    assert check_linearizable(planted(h[:3], 2, True)).ok is False


def test_partitions_are_judged_apart_and_named() -> None:
    good = [
        op("create", {"key": A, "state": {}}, {"version": 1}, 0, 5),
        op("create", {"key": B, "state": {}}, {"version": 1}, 0, 5),
        op("get", {"key": B}, {"version": 7, "state": {}}, 6, 7),  # b is wrong, a is not
    ]
    report = check_linearizable(good)
    assert report.ok is False
    assert [p.ok for p in report.partitions] == [True, False]
    assert "partition [c:orders/b]" in report.summary()
    # a batch joins its keys into one partition
    items = [commit(A, 1, "x", {}), commit(B, 1, "y", {})]
    batch = op("commit_many", {"items": items}, [ok("committed", 2), ok("committed", 2)], 10, 20)
    assert len(check_linearizable([*good[:2], batch]).partitions) == 1


def test_the_search_is_bounded() -> None:
    # many overlapping unknown creates and deletes: a wide search, cut by the budget
    history = [op("create", {"key": A, "state": {}}, {"version": 1}, 0, 1)]
    for i in range(12):
        kind = "delete" if i % 2 else "create"
        args = {"key": A} if kind == "delete" else {"key": A, "state": {"i": i}}
        history.append(op(kind, args, None, 2 + i, None))
    history.append(op("get", {"key": A}, {"version": 99, "state": {}}, 100, 101))
    report = check_linearizable(history, budget=50)
    assert report.ok is None
    assert "budget ran out" in report.summary()
    with pytest.raises(fencing.InvalidInput):
        check_linearizable(history, budget=0)


def test_history_files_round_trip_and_bad_events_are_refused(tmp_path: Path) -> None:
    history, _, _ = recreate()
    path = tmp_path / "h.jsonl"
    with HistoryWriter(path) as sink:
        sink.write({"event": "outcome", "outcome": "committed"})  # other events are skipped
        for o in history:
            sink.write(lin_event(o))
    ops, init = read_lin_file(path)
    assert [o.op for o in ops] == [o.op for o in history] and init == {}
    assert check_linearizable(ops).ok is True
    bad = [
        {"event": "lin", "op": "upsert", "args": {"key": A}, "invoke": 1, "return": 2},
        {"event": "lin", "op": "get", "args": {}, "invoke": 1, "return": 2},
        {"event": "lin", "op": "get", "args": {"key": A}, "invoke": 5, "return": 2},
        {"event": "lin", "op": "get", "args": {"key": A}, "invoke": "1", "return": 2},
        {
            "event": "lin",
            "op": "commit",
            "args": {"key": A, "expected": 1, "state": {}},
            "invoke": 1,
            "return": 2,
        },
        {
            "event": "lin",
            "op": "commit",
            "args": {**commit(A, "1", "r", {})},
            "invoke": 1,
            "return": 2,
        },
        {
            "event": "lin",
            "op": "commit",
            "args": commit(A, 1, "r", {}, lease="L"),
            "invoke": 1,
            "return": 2,
        },
        {"event": "lin", "op": "commit_many", "args": {"items": []}, "invoke": 1, "return": 2},
        {
            "event": "lin",
            "op": "release",
            "args": {"name": "L", "token": None},
            "invoke": 1,
            "return": 2,
        },
        {"event": "lin", "op": "get", "args": {"key": 7}, "invoke": 1, "return": 2},
    ]
    for event in bad:
        with pytest.raises(HistoryError):
            check_linearizable([event])
        path.write_text(json.dumps(event) + "\n")
        with pytest.raises(HistoryError):
            read_lin_file(path)
    with pytest.raises(HistoryError):
        check_linearizable([42])  # type: ignore[list-item]
    with pytest.raises(HistoryError):  # an Operation is checked the same way
        check_linearizable([op("get", {"key": A}, None, 9, 3)])


# -- properties: sequential runs of the real memory store ----------------------------------
def sequential_history(seed: int, stretch: int) -> list[Operation]:
    """A churn run on a memory store, one operation at a time (a fake clock counts), then
    every interval stretched by up to ``stretch`` ticks each way: overlapping, still
    containing the moment the operation really ran."""
    store = fencing.open("memory://")
    ticks = itertools.count(0, 100)
    sink: list[dict[str, Any]] = []

    class Sink:
        def write(self, event: dict[str, Any]) -> None:
            sink.append(json.loads(json.dumps(event)))

    config = Config(ops=25, rows=0, seed=seed)
    drivers = [SyncDriver(store, Sink(), "p", f"t{i}", True) for i in range(3)]  # type: ignore[arg-type]
    plans = [plan(config, f"t{i}") for i in range(3)]
    for d in drivers:
        d.clock = lambda: next(ticks)
    rng = random.Random(seed)
    pending = [next(p) for p in plans]
    live = list(range(3))
    while live:  # interleave the workers' steps at random, one call at a time
        i = rng.choice(live)
        try:
            pending[i] = plans[i].send(drivers[i].call(pending[i]))
        except StopIteration:
            live.remove(i)
    store.close()
    out = []
    for n, e in enumerate(sink):
        lo = rng.randint(0, stretch)
        hi = rng.randint(0, stretch)
        out.append(
            Operation(
                e["op"],
                e["args"],
                e["result"],
                e["invoke"] - lo,
                e["return"] + hi,
                "p",
                e["thread"],
                n,
            )
        )
    return out


def mutate(history: list[Operation], rng: random.Random) -> tuple[list[Operation], int] | None:
    """One answer made wrong in a way no order could explain: a version or token off by one."""
    choices = []
    for n, o in enumerate(history):
        r = o.result
        if o.op in ("create", "get") and isinstance(r, dict):
            choices.append((n, {**r, "version": r["version"] + 1}))
        elif o.op == "commit" and isinstance(r, dict) and r["version"] is not None:
            choices.append((n, {**r, "version": r["version"] + rng.choice([-1, 1])}))
        elif o.op == "acquire" and isinstance(r, dict):
            choices.append((n, {"token": r["token"] + 1}))
        elif o.op == "delete":
            choices.append((n, not r))
    if not choices:
        return None
    n, wrong = rng.choice(choices)
    return planted(history, n, wrong), n


@given(seed=st.integers(0, 2**32 - 1), stretch=st.sampled_from([0, 50, 150, 400]))
def test_sequential_runs_are_linearizable(seed: int, stretch: int) -> None:
    report = check_linearizable(sequential_history(seed, stretch))
    assert report.ok is True, report.summary()


@given(seed=st.integers(0, 2**32 - 1), stretch=st.sampled_from([0, 50]))
def test_one_mutated_answer_is_rejected(seed: int, stretch: int) -> None:
    history = sequential_history(seed, stretch)
    found = mutate(history, random.Random(seed))
    if found is None:
        return
    wrong, _ = found
    report = check_linearizable(wrong)
    assert report.ok is False, report.summary()


def test_when_an_operation_of_unknown_outcome_is_inert() -> None:
    """``inert``: an operation whose outcome is unknown and that can no longer take effect
    (versions and tokens only grow), so the search need not place it."""
    from fencing.testing._linear_model import (
        LEASE_PREFIX,
        Context,
        LeaseState,
        RecordState,
        inert,
    )

    ctx = Context([A, LEASE_PREFIX + "L"], frozenset())

    def unknown(kind: str, args: dict[str, Any]) -> Operation:
        return Operation(kind, args, None, 1, None)

    def at(rec: RecordState, lease: LeaseState | None = None) -> tuple[Any, ...]:
        return (rec, LeaseState() if lease is None else lease)

    live = RecordState(True, 3, "{}", fence=2)
    plain = unknown("commit", commit(A, 3, "r", {}))
    assert not inert(ctx, at(live), plain)  # expects version 3, the record is at 3
    assert inert(ctx, at(live._replace(version=4)), plain)  # past it
    assert not inert(ctx, at(live._replace(version=2)), plain)
    gone = RecordState(False, 0, "null", tomb=3)
    assert inert(ctx, at(gone), plain)  # deleted at 3
    assert not inert(ctx, at(gone._replace(tomb=2)), plain)  # deleted before it
    assert not inert(ctx, at(live), unknown("commit", commit(A, None, "r", {})))  # no version
    fenced = unknown("commit", commit(A, 3, "r", {}, lease="L", token=2))
    assert not inert(ctx, at(live, LeaseState(2, True)), fenced)
    assert inert(ctx, at(live, LeaseState(3, True)), fenced)  # a newer token was granted
    assert inert(ctx, at(live._replace(fence=3), LeaseState(2, True)), fenced)  # or wrote it
    assert inert(ctx, at(live._replace(version=4), LeaseState(2, True)), fenced)
    batch = unknown("commit_many", {"items": [commit(A, 3, "r", {})]})
    assert not inert(ctx, at(live), batch)
    assert inert(ctx, at(live._replace(version=4)), batch)
    release = unknown("release", {"name": "L", "token": 2})
    assert not inert(ctx, at(live, LeaseState(2, True)), release)
    assert inert(ctx, at(live, LeaseState(3, True)), release)  # not its token any more
    assert inert(ctx, at(live), unknown("get", {"key": A}))
    for kind, args in (("create", {"key": A, "state": {}}), ("delete", {"key": A})):
        assert not inert(ctx, at(gone), unknown(kind, args))
    assert not inert(ctx, at(live), unknown("acquire", {"name": "L"}))


def test_a_history_file_keeps_every_field_of_an_operation_and_its_init(tmp_path: Path) -> None:
    history = [
        Operation("create", {"key": A, "state": {"n": 1}}, {"version": 3}, 1, 2, "p1", "t1"),
        Operation("get", {"key": A}, None, 3, None, "p2", ""),
    ]
    path = tmp_path / "h.jsonl"
    init = {"event": "init", "key": A, "version": 2, "state": {}}
    bare = {"event": "lin", "op": "get", "args": {"key": A}, "invoke": 5, "return": 6}
    events = (init, *(lin_event(o) for o in history), bare)
    path.write_text("\n".join(json.dumps(e) for e in events) + "\n\n")
    ops, found = read_lin_file(path)
    assert ops == [*history, Operation("get", {"key": A}, None, 5, 6, "", "")]
    assert (ops[2].process, ops[2].thread) == ("", "")  # none written: empty
    assert [(o.process, o.thread, o.ret) for o in ops[:2]] == [("p1", "t1", 2), ("p2", "", None)]
    assert found == {A: init}
    path.write_text(json.dumps(lin_event(history[0])) + "\n{not json\n")
    with pytest.raises(HistoryError, match=f"^{re.escape(str(path))}:2: not JSON: "):
        read_lin_file(path)
    path.write_text("\n[1, 2]\n")
    with pytest.raises(HistoryError, match=f"^{re.escape(str(path))}:2: an event must be a JSON"):
        read_lin_file(path)


def test_an_operation_describes_itself_in_one_line() -> None:
    result = {"version": 2, "at": Path("y")}
    known = Operation("get", {"key": A, "b": 1}, result, 3, 7, "p1", "t2", index=4)
    assert known.describe() == (
        '#4 p1/t2 [3, 7] get{"b": 1, "key": "c:orders/a"} -> {"at": "y", "version": 2}'
    )
    unknown = Operation("commit", {"when": Path("x")}, "ignored", 5, None, "Xp", "", index=0)
    assert unknown.describe() == '#0 Xp [5, inf] commit{"when": "x"} -> ?'
    assert (
        Operation("get", {}, None, 1, 2, "", "t", index=1).describe() == "#1 t [1, 2] get{} -> null"
    )


def test_a_report_explains_itself_exactly() -> None:
    from fencing.testing import LinReport
    from fencing.testing._linear import PartitionResult
    from fencing.testing._linear_model import LEASE_PREFIX

    ops = [Operation("get", {"key": A}, None, i, i + 1, "p", "", index=i) for i in range(14)]
    bad = PartitionResult(
        [A, LEASE_PREFIX + "L"],
        ops,
        False,
        99,
        order=ops[:13],
        stuck=ops[13:],
        states=list("abcde"),
    )
    text = bad.explain()
    lines = text.split("\n")
    assert lines[0] == (
        "partition [c:orders/a, lease:L]: NOT linearizable: 13 of 14 operations placed at"
        " most; the last placed:"
    )
    assert lines[1:13] == ["  " + o.describe() for o in ops[1:13]]  # the last twelve
    assert lines[13:] == [
        "then none of these could be placed next:",
        "  " + ops[13].describe(),
        "model state(s) there: a; b; c; d",
    ]
    assert bad.explain(limit=1).split("\n")[1:3] == [
        "  " + ops[12].describe(),
        "then none of these could be placed next:",
    ]
    good = PartitionResult([A], ops[:2], True, 5)
    unknown = PartitionResult([B], ops[:3], None, 7)
    assert good.explain() == "partition [c:orders/a]: linearizable (2 operations)"
    assert unknown.explain() == (
        "partition [c:orders/b]: unknown, the search budget ran out after 7 nodes (3 operations)"
    )
    assert LinReport([good]).summary() == "linearizable: 2 operations in 1 partition(s)"
    assert LinReport([good, unknown]).summary() == (
        "unknown: 5 operations in 2 partition(s)\n" + unknown.explain()
    )
    assert LinReport([good, bad]).summary() == (
        "NOT linearizable: 16 operations in 2 partition(s)\n" + text
    )
