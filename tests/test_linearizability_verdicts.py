"""The linearizability checker's verdicts on small hand-made histories, exactly.

Each history is judged linearizable or not as the model of a store must (leases,
batches, unknown outcomes); bad events are refused with their exact message; and a
failure explains itself with the operations it could not place.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fencing import InvalidInput
from fencing.testing import (
    HistoryError,
    MemoryHistory,
    Operation,
    check_linearizable,
    lin_event,
    read_lin_file,
    write_lin,
)

from .test_linearizability_checker import A, commit, ok, op

L = {"name": "L"}
CREATE = op("create", {"key": A, "state": {}}, {"version": 1}, 0, 1)


def under(token: int, root: str, **extra: Any) -> dict[str, Any]:
    """A commit of record A under lease L with ``token``, expecting no version."""
    return commit(A, None, root, {"r": root}, lease="L", token=token, **extra)


def release(token: int, result: Any, t0: int) -> Operation:
    return op("release", {"name": "L", "token": token}, result, t0, t0 + 1)


# name: (history, linearizable?)
CASES: dict[str, tuple[list[Operation], bool]] = {
    # a holder writes twice under one token: the record's fence equals it, not above
    "two commits under one token": (
        [
            CREATE,
            op("acquire", L, {"token": 1}, 2, 3),
            op("commit", under(1, "x"), ok("committed", 2), 4, 5),
            op("commit", under(1, "y"), ok("committed", 3), 6, 7),
        ],
        True,
    ),
    # released: a commit under the released token is fenced as expired, never committed
    "a released token's commit is fenced as expired": (
        [
            CREATE,
            op("acquire", L, {"token": 1}, 2, 3),
            release(1, True, 4),
            op("commit", under(1, "x"), ok("fenced", 1, reason="expired"), 6, 7),
        ],
        True,
    ),
    "a released token's commit cannot commit": (
        [
            CREATE,
            op("acquire", L, {"token": 1}, 2, 3),
            release(1, True, 4),
            op("commit", under(1, "x"), ok("committed", 2), 6, 7),
        ],
        False,
    ),
    # a release refused under the current token: its TTL ran out, nobody holds the lease
    "after an expired release the lease is free": (
        [
            op("acquire", L, {"token": 1}, 0, 1),
            release(1, False, 2),
            op("acquire", L, "held", 4, 5),
        ],
        False,
    ),
    "after an expired release it is granted again": (
        [
            op("acquire", L, {"token": 1}, 0, 1),
            release(1, False, 2),
            op("acquire", L, {"token": 2}, 4, 5),
        ],
        True,
    ),
    "after an expired release its token cannot commit": (
        [
            CREATE,
            op("acquire", L, {"token": 1}, 2, 3),
            release(1, False, 4),
            op("commit", under(1, "x"), ok("committed", 2), 6, 7),
        ],
        False,
    ),
    "a superseded token's refused release leaves the newer holder": (
        [
            op("acquire", L, {"token": 1}, 0, 1),
            op("acquire", L, {"token": 2}, 2, 3),
            release(1, False, 4),
            op("acquire", L, "held", 6, 7),
        ],
        True,
    ),
    "a superseded token's release cannot succeed": (
        [
            op("acquire", L, {"token": 1}, 0, 1),
            op("acquire", L, {"token": 2}, 2, 3),
            release(1, True, 4),
        ],
        False,
    ),
    # a record's fence is the highest token that wrote it, whichever lease granted it
    "a record written under a higher token fences a lower one of another lease": (
        [
            CREATE,
            op("acquire", {"name": "M"}, {"token": 1}, 2, 3),
            op("acquire", {"name": "M"}, {"token": 2}, 4, 5),
            op("commit", commit(A, None, "m", {}, lease="M", token=2), ok("committed", 2), 6, 7),
            op("acquire", L, {"token": 1}, 8, 9),
            op("commit", under(1, "x"), ok("fenced", 2, reason="newer_owner"), 10, 11),
        ],
        True,
    ),
    # -- guards: a commit whose guard does not hold is stale, else it commits
    "a guard that holds commits": (
        [
            op("create", {"key": A, "state": {"s": "new", "n": 1}}, {"version": 1}, 0, 1),
            op("commit", commit(A, None, "x", {}, guard={"s": "new"}), ok("committed", 2), 2, 3),
        ],
        True,
    ),
    "a guard that does not hold is stale": (
        [
            op("create", {"key": A, "state": {"s": "new"}}, {"version": 1}, 0, 1),
            op("commit", commit(A, None, "x", {}, guard={"s": "paid"}), ok("stale", 1), 2, 3),
        ],
        True,
    ),
    "a guard that does not hold cannot commit": (
        [
            op("create", {"key": A, "state": {"s": "new"}}, {"version": 1}, 0, 1),
            op("commit", commit(A, None, "x", {}, guard={"s": "paid"}), ok("committed", 2), 2, 3),
        ],
        False,
    ),
    # -- a table commit (merge) sets only the columns it names
    "a merge keeps the other columns": (
        [
            op("create", {"key": A, "state": {"a": 1, "b": 2}}, {"version": 1}, 0, 1),
            op("commit", commit(A, 1, "x", {"b": 3}, merge=True), ok("committed", 2), 2, 3),
            op("get", {"key": A}, {"version": 2, "state": {"a": 1, "b": 3}}, 4, 5),
        ],
        True,
    ),
    "a merge is not a replacement": (
        [
            op("create", {"key": A, "state": {"a": 1, "b": 2}}, {"version": 1}, 0, 1),
            op("commit", commit(A, 1, "x", {"b": 3}, merge=True), ok("committed", 2), 2, 3),
            op("get", {"key": A}, {"version": 2, "state": {"b": 3}}, 4, 5),
        ],
        False,
    ),
    "a commit without merge replaces the state": (
        [
            op("create", {"key": A, "state": {"a": 1, "b": 2}}, {"version": 1}, 0, 1),
            op("commit", commit(A, 1, "x", {"b": 3}), ok("committed", 2), 2, 3),
            op("get", {"key": A}, {"version": 2, "state": {"b": 3}}, 4, 5),
        ],
        True,
    ),
    # -- a create over an existing record answers "exists", never a new version
    "a second create answers exists": (
        [CREATE, op("create", {"key": A, "state": {"n": 2}}, "exists", 2, 3)],
        True,
    ),
    "a second create cannot create": (
        [CREATE, op("create", {"key": A, "state": {"n": 2}}, {"version": 2}, 2, 3)],
        False,
    ),
    # a batch's commit counts toward a root committed more than once (then duplicate)
    "a root committed in a batch, then again alone: duplicate": (
        [
            CREATE,
            op("commit_many", {"items": [commit(A, 1, "x", {})]}, [ok("committed", 2)], 2, 3),
            op("commit", commit(A, 1, "x", {}), ok("duplicate", 2), 4, 5),
        ],
        True,
    ),
    # an unknown commit overtaken by a newer version can no longer land: it is settled
    "an unknown commit that can no longer land": (
        [
            CREATE,
            op("commit", commit(A, 1, "u", {"n": 1}), None, 2, None),
            op("commit", commit(A, 1, "y", {"n": 2}), ok("committed", 2), 4, 5),
            op("get", {"key": A}, {"version": 2, "state": {"n": 2}}, 6, 7),
            op("commit", commit(A, 2, "z", {"n": 3}), ok("committed", 3), 8, 9),
        ],
        True,
    ),
    # -- states compare as JSON the stores keep: key order aside, 1.0 is 1, true is not 1
    "a state read back with its keys in another order": (
        [
            op(
                "create",
                {"key": A, "state": {"a": 1, "b": [1.0, {"c": 2.0}]}},
                {"version": 1},
                0,
                1,
            ),
            op("get", {"key": A}, {"version": 1, "state": {"b": [1, {"c": 2}], "a": 1.0}}, 2, 3),
        ],
        True,
    ),
    "a list read back with other items": (
        [
            op("create", {"key": A, "state": {"xs": [1, 2]}}, {"version": 1}, 0, 1),
            op("get", {"key": A}, {"version": 1, "state": {"xs": [3, 4]}}, 2, 3),
        ],
        False,
    ),
    "true is not 1": (
        [
            op("create", {"key": A, "state": {"f": True}}, {"version": 1}, 0, 1),
            op("get", {"key": A}, {"version": 1, "state": {"f": 1}}, 2, 3),
        ],
        False,
    ),
    # -- a batch answers one result per item, as a list
    "a batch answered per item": (
        [CREATE, op("commit_many", {"items": [commit(A, 1, "x", {})]}, [ok("committed", 2)], 2, 3)],
        True,
    ),
    "a batch answered with no list": (
        [CREATE, op("commit_many", {"items": [commit(A, 1, "x", {})]}, None, 2, 3)],
        False,
    ),
    "a batch answered with one result, not a list": (
        [CREATE, op("commit_many", {"items": [commit(A, 1, "x", {})]}, ok("committed", 2), 2, 3)],
        False,
    ),
    "a batch answered with a result too many": (
        [
            CREATE,
            op(
                "commit_many",
                {"items": [commit(A, 1, "x", {})]},
                [ok("committed", 2), ok("committed", 3)],
                2,
                3,
            ),
        ],
        False,
    ),
    "a batch answered with a result too few": (
        [
            CREATE,
            op(
                "commit_many",
                {"items": [commit(A, 1, "x", {}), commit(A, 2, "y", {})]},
                [ok("committed", 2)],
                2,
                3,
            ),
        ],
        False,
    ),
    # a batch of unknown outcome may have landed (then its writes are seen) or not
    "an unknown batch that landed": (
        [
            CREATE,
            op("commit_many", {"items": [commit(A, 1, "x", {"n": 1})]}, None, 2, None),
            op("get", {"key": A}, {"version": 2, "state": {"n": 1}}, 4, 5),
        ],
        True,
    ),
    "an unknown batch that never landed": (
        [
            CREATE,
            op("commit_many", {"items": [commit(A, 1, "x", {"n": 1})]}, None, 2, None),
            op("get", {"key": A}, {"version": 1, "state": {}}, 4, 5),
        ],
        True,
    ),
    "an unknown batch lands whole or not at all": (
        [
            CREATE,
            op(
                "commit_many",
                {"items": [commit(A, 1, "x", {"n": 1}), commit(A, 2, "y", {"n": 2})]},
                None,
                2,
                None,
            ),
            op("get", {"key": A}, {"version": 2, "state": {"n": 1}}, 4, 5),
        ],
        False,
    ),
}


@pytest.mark.parametrize(("history", "linearizable"), CASES.values(), ids=list(CASES))
def test_each_verdict(history: list[Operation], linearizable: bool) -> None:
    report = check_linearizable(history)
    assert report.ok is linearizable, report.summary()


def test_a_failure_names_what_it_placed_what_was_stuck_and_the_states() -> None:
    history = [
        CREATE,
        op("acquire", L, {"token": 1}, 2, 3),
        op("commit", under(1, "x"), ok("committed", 2), 4, 5),
        op("get", {"key": A}, {"version": 7, "state": {}}, 20, 25),  # never written
        op("get", {"key": A}, {"version": 8, "state": {}}, 22, 28),  # nor this
    ]
    report = check_linearizable(history)
    assert report.ok is False
    (part,) = report.partitions
    assert part.ok is False and isinstance(part.nodes, int) and part.nodes >= len(history)
    assert [o.index for o in part.order] == [0, 1, 2]
    assert [o.index for o in part.stuck] == [3, 4]  # each once, the pending ones
    assert part.states == [
        "{lease:L: LeaseState(last=1, held=True), c:orders/a: RecordState(exists=True,"
        ' version=2, state=\'{"r":"x"}\', fence=1, applied=frozenset(), tomb=0)}'
    ]
    assert report.summary().split("\n")[-4:] == [
        "then none of these could be placed next:",
        "  " + part.stuck[0].describe(),
        "  " + part.stuck[1].describe(),
        "model state(s) there: " + part.states[0],
    ]


_BAD: list[tuple[dict[str, Any], str]] = [
    (
        {"op": "upsert", "args": {"key": A}},
        "op must be one of "
        + repr(("create", "get", "delete", "commit", "commit_many", "acquire", "release"))
        + ", not 'upsert'",
    ),
    ({"op": "get", "args": [A]}, "args must be an object"),
    ({"op": "get", "args": {}}, "get args lack ['key']"),
    ({"op": "get", "invoke": 5, "return": 2}, "return must be null or an integer >= invoke"),
    ({"op": "get", "invoke": 5, "return": 5.0}, "return must be null or an integer >= invoke"),
    ({"op": "get", "invoke": "1"}, "invoke must be an integer (ns)"),
    ({"op": "get", "invoke": True}, "invoke must be an integer (ns)"),
    ({"op": "get", "args": {"key": 7}}, "get key must be a string"),
    ({"op": "create", "args": {"key": A}}, "create args lack ['state']"),
    ({"op": "acquire", "args": {"name": 3}}, "acquire name must be a string"),
    ({"op": "commit", "args": {"key": A, "expected": 1, "state": {}}}, "commit args lack ['root']"),
    (
        {"op": "commit", "args": commit(A, "1", "r", {})},
        "commit expected must be an integer or null",
    ),
    (
        {"op": "commit", "args": commit(A, True, "r", {})},
        "commit expected must be an integer or null",
    ),
    ({"op": "commit", "args": commit(A, 1, 5, {})}, "commit root must be a string"),
    (
        {"op": "commit", "args": commit(A, 1, "r", {}, lease="L")},
        "a commit under a lease needs its integer token",
    ),
    (
        {"op": "commit", "args": commit(A, 1, "r", {}, lease="L", token=True)},
        "a commit under a lease needs its integer token",
    ),
    (
        {"op": "commit", "args": commit(A, 1, "r", {}, lease=5, token=1)},
        "commit lease must be a string",
    ),
    ({"op": "commit_many", "args": {}}, "commit_many args lack ['items']"),
    ({"op": "commit_many", "args": {"items": []}}, "commit_many items must be a non-empty list"),
    (
        {"op": "commit_many", "args": {"items": {"a": 1}}},
        "commit_many items must be a non-empty list",
    ),
    ({"op": "commit_many", "args": {"items": [1]}}, "commit_many items must be objects"),
    (
        {"op": "commit_many", "args": {"items": [{"key": A}]}},
        "commit args lack ['expected', 'root', 'state']",
    ),
    (
        {"op": "commit_many", "args": {"items": [commit(A, "x", "r", {})]}},
        "commit expected must be an integer or null",
    ),
    ({"op": "release", "args": {"name": "L"}}, "release args lack ['token']"),
    ({"op": "release", "args": {"name": "L", "token": None}}, "release token must be an integer"),
    ({"op": "release", "args": {"name": "L", "token": False}}, "release token must be an integer"),
]


@pytest.mark.parametrize(("fields", "message"), _BAD)
def test_a_bad_operation_exactly(tmp_path: Path, fields: dict[str, Any], message: str) -> None:
    event = {"event": "lin", "args": {"key": A}, "invoke": 1, "return": 2, **fields}
    good = lin_event(CREATE)
    with pytest.raises(HistoryError) as caught:
        check_linearizable([good, event])
    assert str(caught.value) == f"event 1: {message}"
    kept = dict(event)
    o = Operation(kept["op"], kept["args"], None, kept["invoke"], kept["return"])
    with pytest.raises(HistoryError) as caught:
        check_linearizable([CREATE, o])
    assert str(caught.value) == f"operation 1: {message}"
    path = tmp_path / "h.jsonl"
    path.write_text(json.dumps(good) + "\n\n" + json.dumps(event) + "\n")
    with pytest.raises(HistoryError) as caught:
        read_lin_file(path)
    assert str(caught.value) == f"{path}:3: {message}"


def test_operations_read_from_a_file_are_numbered_when_judged(tmp_path: Path) -> None:
    history = [CREATE, op("get", {"key": A}, {"version": 1, "state": {}}, 2, 3)]
    sink = MemoryHistory()
    for o in history:
        write_lin(sink, o)
    assert sink.events == [lin_event(o) for o in history]
    path = tmp_path / "h.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in sink.events), encoding="utf-8")
    ops, init = read_lin_file(path)
    assert ops == history and init == {}
    assert [o.index for o in ops] == [-1, -1]  # not numbered until judged
    (part,) = check_linearizable(ops).partitions
    assert [o.index for o in part.operations] == [0, 1]


def test_a_history_file_is_utf8_whatever_the_locale(tmp_path: Path) -> None:
    state = {"name": "Zoë ✓"}
    history = [op("create", {"key": A, "state": state}, {"version": 1}, 0, 1)]
    path = tmp_path / "h.jsonl"
    path.write_bytes((json.dumps(lin_event(history[0]), ensure_ascii=False) + "\n").encode())
    assert read_lin_file(path)[0][0].args["state"] == state
    # in a process whose locale encoding is ASCII (no UTF-8 mode, no locale coercion)
    env = {
        **os.environ,
        "LC_ALL": "C",
        "PYTHONUTF8": "0",
        "PYTHONCOERCECLOCALE": "0",
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    code = (
        "import locale, sys; from fencing.testing import read_lin_file;"
        "print(locale.getpreferredencoding(False), ascii(read_lin_file(sys.argv[1])[0][0].args))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(path)], env=env, capture_output=True, text=True
    )
    assert out.stderr == "" and out.stdout.split(" ", 1)[1] == ascii(history[0].args) + "\n"


def test_an_unknown_answer_shows_as_any() -> None:
    from fencing.testing._linear_model import ANY

    assert repr(ANY) == "ANY"


RECORD = (
    "c:orders/a: RecordState(exists=True, version=1, state='{}', fence=0,"
    " applied=frozenset(), tomb=0)"
)


@pytest.mark.parametrize(
    ("how", "held"),
    [
        (release(1, True, 4), [False]),  # released
        (release(1, False, 4), [False]),  # refused under its own token: the TTL ran out
        (op("release", {"name": "L", "token": 1}, None, 4, None), [False, True]),  # or never
    ],
    ids=["released", "expired", "unknown"],
)
def test_the_lease_a_release_leaves_is_shown(how: Operation, held: list[bool]) -> None:
    wrong = op("commit", under(1, "x"), ok("committed", 9), 20, 21)  # v9: never possible
    history = [op("acquire", L, {"token": 1}, 0, 1), CREATE, how, wrong]
    (part,) = check_linearizable(history).partitions
    assert part.ok is False and [o.index for o in part.stuck] == [3]
    assert part.states == [f"{{lease:L: LeaseState(last=1, held={h}), {RECORD}}}" for h in held]


def test_a_deleted_record_is_shown_as_its_tombstone() -> None:
    history = [
        CREATE,
        op("acquire", L, {"token": 1}, 2, 3),
        op("commit", under(1, "x"), ok("committed", 2), 4, 5),
        op("delete", {"key": A}, True, 6, 7),
        op("get", {"key": A}, {"version": 2, "state": {"r": "x"}}, 8, 9),  # it is gone
    ]
    (part,) = check_linearizable(history).partitions
    assert part.ok is False and [o.index for o in part.stuck] == [4]
    assert part.states == [
        "{lease:L: LeaseState(last=1, held=True), c:orders/a: RecordState(exists=False,"
        " version=0, state='null', fence=0, applied=frozenset(), tomb=2)}"
    ]


def test_an_unknown_read_is_not_placed() -> None:
    history = [
        CREATE,
        op("get", {"key": A}, {"version": 7, "state": {}}, 2, None),  # never answered
        op("get", {"key": A}, {"version": 1, "state": {}}, 4, 5),
    ]
    (part,) = check_linearizable(history).partitions
    assert part.ok is True and [o.index for o in part.order] == [0, 2]


def test_an_unknown_commit_that_cannot_land_is_settled_not_placed() -> None:
    history = [
        CREATE,
        op("commit", commit(A, 1, "y", {"n": 2}), ok("committed", 2), 2, 3),
        op("commit", commit(A, 1, "u", {"n": 1}), None, 4, None),  # v1 is gone by then
        op("get", {"key": A}, {"version": 2, "state": {"n": 2}}, 6, 7),
    ]
    (part,) = check_linearizable(history).partitions
    assert part.ok is True and [o.index for o in part.order] == [0, 1, 3]


@pytest.mark.parametrize("first", [True, False], ids=["create-first", "read-first"])
def test_a_call_at_the_moment_of_a_return_overlaps_it(first: bool) -> None:
    # the read is invoked at the nanosecond the create returns: either may come first
    create = op("create", {"key": A, "state": {}}, {"version": 1}, 0, 5)
    read = op("get", {"key": A}, None, 5, 6)
    history = [create, read] if first else [read, create]
    assert check_linearizable(history).ok is True
    late = op("get", {"key": A}, None, 6, 7)  # a moment later it must see the record
    assert check_linearizable([create, late]).ok is False


def test_an_operation_that_cannot_go_first_is_named() -> None:
    history = [op("get", {"key": A}, {"version": 1, "state": {}}, 0, 1)]  # never created
    (part,) = check_linearizable(history).partitions
    assert part.ok is False and part.order == [] and [o.index for o in part.stuck] == [0]
    assert part.states == [
        "{c:orders/a: RecordState(exists=False, version=0, state='null', fence=0,"
        " applied=frozenset(), tomb=0)}"
    ]


def test_the_budget_counts_one_node_per_operation_placed_in_order() -> None:
    history = [
        CREATE,
        op("get", {"key": A}, {"version": 1, "state": {}}, 2, 3),
        op("delete", {"key": A}, True, 4, 5),
    ]
    (enough,) = check_linearizable(history, budget=3).partitions
    assert enough.ok is True and enough.nodes == 3
    (short,) = check_linearizable(history, budget=2).partitions
    assert short.ok is None and short.explain() == (
        "partition [c:orders/a]: unknown, the search budget ran out after 3 nodes (3 operations)"
    )


def test_the_search_never_explores_the_same_placement_twice() -> None:
    # eight overlapping reads, then an impossible one: 2**8 sets of reads placed, not 8!
    # orders of them, before the search can tell the history is not linearizable
    reads = [op("get", {"key": A}, {"version": 1, "state": {}}, 2, 10) for _ in range(8)]
    wrong = op("get", {"key": A}, {"version": 5, "state": {}}, 11, 12)
    assert check_linearizable([CREATE, *reads, wrong], budget=5_000).ok is False


def test_unknown_operations_settled_then_undone_are_settled_again() -> None:
    # once the record is deleted, the unknown commit expecting v1 can never land: it is
    # settled (twice, as the search backs up over the first delete and tries again)
    history = [
        CREATE,
        op("delete", {"key": A}, False, 18, 18),
        op("delete", {"key": A}, True, 5, 8),
        op("commit", commit(A, 1, "x", {}, lease="L", token=2), None, 6, None),
        op("get", {"key": A}, {"version": 1, "state": {}}, 18, None),  # never placed
    ]
    (part,) = check_linearizable(history).partitions
    assert part.ok is True and [o.index for o in part.order] == [0, 2, 1]


def test_the_longest_prefix_after_backing_up_over_settled_operations() -> None:
    # nothing granted token 2: its release cannot succeed; the search backs up over the
    # unknown releases it settled on the way, and reports its longest prefix
    history = [
        release(1, False, 16),
        op("release", {"name": "L", "token": 1}, None, 10, None),
        op("release", {"name": "L", "token": 1}, True, 2, None),
        op("release", {"name": "L", "token": 2}, True, 24, 29),
    ]
    (part,) = check_linearizable(history).partitions
    assert part.ok is False
    assert ([o.index for o in part.order], [o.index for o in part.stuck]) == ([2, 0], [3])


def test_records_given_before_the_history_start_from_their_version() -> None:
    table = "t:orders/1"
    history = [
        op("get", {"key": table}, {"version": 3, "state": {"n": 1}}, 0, 1),
        op("commit", commit(table, 3, "x", {"n": 2}, merge=True), ok("committed", 4), 2, 3),
    ]
    given = {table: {"version": 3, "state": {"n": 1}, "fence": 0}}
    report = check_linearizable(history, init=given)
    assert report.ok is True
    (part,) = report.partitions
    assert part.keys == [table] and part.explain() == (
        "partition [t:orders/1]: linearizable (2 operations)"
    )
    assert check_linearizable(history).ok is False  # without it, there is no such row
    # an init event in the history does the same; a row without a version is at v1
    event = {"event": "init", "key": table, "state": {"n": 1}}
    v1 = [op("get", {"key": table}, {"version": 1, "state": {"n": 1}}, 0, 1)]
    assert check_linearizable([event, *v1]).ok is True
    assert check_linearizable([{**event, "version": 3}, *v1]).ok is False


@pytest.mark.parametrize(
    ("history", "order", "stuck"),
    [
        (  # two deletes of one record both answered true: the second cannot be placed
            [
                CREATE,
                op("delete", {"key": A}, True, 22, 30),
                op("get", {"key": A}, None, 15, None),
                op("delete", {"key": A}, True, 19, 24),
            ],
            [0, 1],
            [3],
        ),
        (  # a duplicate of a root never committed: the search backs up over settled ones
            [
                CREATE,
                op(
                    "commit", commit(A, 2, "r0", {}, lease="L", token=1), ok("duplicate", 2), 28, 39
                ),
                op("commit", commit(A, 1, "r2", {}), ok("duplicate", 1), 6, None),
                op(
                    "commit",
                    commit(A, 1, "r1", {}, lease="L", token=2),
                    ok("fenced", 1),
                    26,
                    None,
                ),
                op("delete", {"key": A}, True, 8, 20),
            ],
            [0, 2, 4],
            [1],
        ),
    ],
    ids=["two-deletes", "duplicate-of-nothing"],
)
def test_the_longest_prefix_of_a_failure(
    history: list[Operation], order: list[int], stuck: list[int]
) -> None:
    (part,) = check_linearizable(history).partitions
    assert part.ok is False
    assert ([o.index for o in part.order], [o.index for o in part.stuck]) == (order, stuck)


def test_a_record_given_before_the_history_keeps_its_fence_and_state() -> None:
    table = "t:orders/1"
    acquire = op("acquire", L, {"token": 1}, 0, 1)
    write = op(
        "commit",
        commit(table, None, "x", {}, lease="L", token=1),
        ok("fenced", 1, reason="newer_owner"),  # token 5 wrote the row before
        2,
        3,
    )
    assert check_linearizable([acquire, write], init={table: {"fence": 5}}).ok is True
    assert check_linearizable([acquire, write], init={table: {"fence": 1}}).ok is False
    read = op("get", {"key": table}, {"version": 1, "state": {}}, 0, 1)  # no state: {}
    assert check_linearizable([read], init={table: {}}).ok is True


def test_a_record_given_without_a_fence_or_state_starts_at_fence_0_and_empty() -> None:
    table = "t:orders/1"
    read = op("get", {"key": table}, {"version": 2, "state": {}}, 0, 1)  # it is at v1
    (part,) = check_linearizable([read], init={table: {"version": 1}}).partitions
    assert part.ok is False
    assert part.states == [
        "{t:orders/1: RecordState(exists=True, version=1, state='{}', fence=0,"
        " applied=frozenset(), tomb=0)}"
    ]


def test_a_read_of_unknown_outcome_leaves_the_state_as_it_is() -> None:
    """The model's ``step``: a read that may never have happened changes nothing and
    answers nothing to judge (the search does not even place one)."""
    from fencing.testing._linear_model import Context, RecordState, step

    ctx = Context([A], frozenset())
    for rec in (RecordState(True, 3, '{"n":1}'), RecordState()):
        assert step(ctx, (rec,), Operation("get", {"key": A}, None, 1, None)) == [(rec,)]


@pytest.mark.parametrize("budget", [0, -1, True, 1.5, "3", None])
def test_a_budget_is_a_positive_integer(budget: Any) -> None:
    with pytest.raises(InvalidInput) as refused:
        check_linearizable([CREATE], budget=budget)
    assert str(refused.value) == f"budget must be a positive integer, not {budget!r}"


def test_a_budget_of_one_node_places_one_operation() -> None:
    assert check_linearizable([CREATE], budget=1).ok is True


def test_lin_events_are_numbered_in_the_order_given() -> None:
    history = [CREATE, op("get", {"key": A}, {"version": 1, "state": {}}, 2, 3)]
    init = {"event": "init", "key": "t:orders/1", "version": 1}
    (part,) = check_linearizable([lin_event(history[0]), init, lin_event(history[1])]).partitions
    assert [o.index for o in part.operations] == [0, 1]
    assert part.order[1].describe().startswith("#1 ")


@pytest.mark.parametrize("item", [None, "lin", ["lin"], 3])
def test_a_history_item_is_an_operation_or_a_lin_event(item: Any) -> None:
    with pytest.raises(HistoryError) as refused:
        check_linearizable([CREATE, item])
    assert str(refused.value) == (
        f"event 1: an Operation or a lin event, not {type(item).__name__}"
    )
