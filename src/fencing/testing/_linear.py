"""A linearizability checker (Wing & Gong's search, as Porcupine runs it) for
histories of operations on a versioned record store.

A history is a list of :class:`Operation`: what was asked (``op``, ``args``), what
came back (``result``) and when (``invoke`` and ``ret``, ``time.monotonic_ns()``,
which Linux shares between processes). It is *linearizable* when every operation
can be given one moment between its invocation and its response such that, run
one at a time in that order, the model of ``_linear_model`` answers every
operation as the store did. An operation whose outcome is unknown (``ret`` None)
may take effect at any moment after its invocation, or never.

The history is split into independent partitions first: operations touching the
same record key or lease name (a batch joins its keys, a commit under a lease
joins the record and the lease) are checked together, the rest apart. Each
partition is searched depth first over the operations that may come next, with
a cache of (operations placed, model states) already explored; a search that
exceeds its node budget answers "unknown", never hangs.

JSON Lines (one ``lin`` event per operation, written whole by one ``write()`` as
``HistoryWriter`` does, so processes may share a file)::

    {"event": "lin", "op": "commit", "args": {"key": "c:orders/o-1", "expected": 3,
     "root": "9f2c..", "state": {"n": 4}, "guard": null, "lease": null, "token": null},
     "result": {"outcome": "committed", "version": 4},
     "invoke": 123456789, "return": 123459999, "process": "p1", "thread": "t3"}

``op`` and its ``args`` -> ``result`` (``return`` null: outcome unknown, result ignored):

- ``create`` ``{key, state}`` -> ``{"version": v}`` | ``"exists"``
- ``get`` ``{key}`` -> ``{"version": v, "state": ...}`` | null
- ``delete`` ``{key}`` -> true | false
- ``commit`` ``{key, expected, root, state, guard?, lease?, token?, merge?}`` ->
  ``{"outcome": "committed"|"stale"|"duplicate"|"missing"|"fenced", "version": v,
  "reason"?: "newer_owner"|"expired"}`` (``merge``: a table commit, which sets only
  the given columns)
- ``commit_many`` ``{items: [commit args, ...]}`` -> a list of commit results
- ``acquire`` ``{name}`` -> ``{"token": t}`` | ``"held"``; ``release`` ``{name, token}`` -> bool

An ``init`` event gives a record's state before the history (a table row)::

    {"event": "init", "key": "t:orders/1", "version": 1, "state": {...}}
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from .._errors import InvalidInput
from ._history import HistoryError
from ._linear_model import (
    LEASE_PREFIX,
    OPS,
    Context,
    Operation,
    State,
    inert,
    initial_state,
    keys_of,
    step,
)

__all__ = [
    "DEFAULT_BUDGET",
    "LinReport",
    "Operation",
    "PartitionResult",
    "check_linearizable",
    "lin_event",
    "read_lin_file",
    "write_lin",
]

#: Search nodes allowed per partition before the answer is "unknown".
DEFAULT_BUDGET: Final = 2_000_000


def lin_event(op: Operation) -> dict[str, Any]:
    """The JSON event for one operation (what a history file holds per line)."""
    return {
        "event": "lin",
        "op": op.op,
        "args": dict(op.args),
        "result": op.result,
        "invoke": op.invoke,
        "return": op.ret,
        "process": op.process,
        "thread": op.thread,
    }


#: The arguments each operation needs (a commit's ``expected`` may be null).
_NEEDS: Final = {
    "create": ("key", "state"),
    "get": ("key",),
    "delete": ("key",),
    "commit": ("key", "expected", "root", "state"),
    "commit_many": ("items",),
    "acquire": ("name",),
    "release": ("name", "token"),
}


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_args(op: str, args: Mapping[str, Any], where: str) -> None:
    missing = [n for n in _NEEDS[op] if n not in args]
    if missing:
        raise HistoryError(f"{where}: {op} args lack {missing}")
    if op == "commit_many":
        items = args["items"]
        if not isinstance(items, list) or not items:
            raise HistoryError(f"{where}: commit_many items must be a non-empty list")
        for item in items:
            if not isinstance(item, Mapping):
                raise HistoryError(f"{where}: commit_many items must be objects")
            _check_args("commit", item, where)
        return
    for name in ("key", "name", "root", "lease"):
        if args.get(name) is not None and not isinstance(args[name], str):
            raise HistoryError(f"{where}: {op} {name} must be a string")
    if op == "commit":
        expected = args["expected"]
        if expected is not None and not _integer(expected):
            raise HistoryError(f"{where}: commit expected must be an integer or null")
        if args.get("lease") is not None and not _integer(args.get("token")):
            raise HistoryError(f"{where}: a commit under a lease needs its integer token")
    if op == "release" and not _integer(args["token"]):
        raise HistoryError(f"{where}: release token must be an integer")


def _checked(op: Operation, where: str, index: int) -> Operation:
    """``op`` validated (a clear ``HistoryError`` before any search), numbered ``index``."""
    if op.op not in OPS:
        raise HistoryError(f"{where}: op must be one of {OPS}, not {op.op!r}")
    if not isinstance(op.args, Mapping):
        raise HistoryError(f"{where}: args must be an object")
    if not _integer(op.invoke):
        raise HistoryError(f"{where}: invoke must be an integer (ns)")
    if op.ret is not None and (not _integer(op.ret) or op.ret < op.invoke):
        raise HistoryError(f"{where}: return must be null or an integer >= invoke")
    _check_args(op.op, op.args, where)
    return Operation(op.op, op.args, op.result, op.invoke, op.ret, op.process, op.thread, index)


def _operation(event: Mapping[str, Any], where: str) -> Operation:
    op = Operation(
        str(event.get("op")),
        event.get("args"),  # type: ignore[arg-type]  # checked by _checked
        event.get("result"),
        event.get("invoke"),  # type: ignore[arg-type]
        event.get("return"),
        str(event.get("process", "")),
        str(event.get("thread", "")),
    )
    return _checked(op, where, -1)


def read_lin_file(
    path: str | os.PathLike[str],
) -> tuple[list[Operation], dict[str, dict[str, Any]]]:
    """The operations and ``init`` records of a JSON Lines history (other events skipped)."""
    ops: list[Operation] = []
    init: dict[str, dict[str, Any]] = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{os.fspath(path)}:{n}"
            try:
                event = json.loads(line)
            except ValueError as exc:
                raise HistoryError(f"{where}: not JSON: {exc}") from exc
            if not isinstance(event, dict):
                raise HistoryError(f"{where}: an event must be a JSON object")
            if event.get("event") == "lin":
                ops.append(_operation(event, where))
            elif event.get("event") == "init":
                init[str(event.get("key"))] = event
    return ops, init


def write_lin(sink: Any, op: Operation) -> None:
    """Write one operation to an ``EventSink`` (``HistoryWriter``, ``MemoryHistory``)."""
    sink.write(lin_event(op))


# -- partitions ----------------------------------------------------------------------
def _partitions(ops: Sequence[Operation]) -> list[list[Operation]]:
    parent: dict[str, str] = {}

    def find(k: str) -> str:
        parent.setdefault(k, k)
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    for op in ops:
        keys = keys_of(op)
        first = find(keys[0])
        for k in keys[1:]:
            root = find(k)
            if root != first:
                parent[root] = first
    groups: dict[str, list[Operation]] = {}
    for op in ops:
        groups.setdefault(find(keys_of(op)[0]), []).append(op)
    return list(groups.values())


# -- the search ----------------------------------------------------------------------
class _Node:
    __slots__ = ("match", "next", "op", "prev", "time")

    def __init__(self, op: int, time: float, match: _Node | None) -> None:
        self.op = op
        self.time = time
        self.match = match  # set on a call node: its return node
        self.prev: _Node | None = None
        self.next: _Node | None = None


@dataclass
class PartitionResult:
    """The verdict on one partition: ``ok`` True, False, or None (budget exhausted)."""

    keys: list[str]
    operations: list[Operation]
    ok: bool | None
    nodes: int
    order: list[Operation] = field(default_factory=list)  # a linearization, or the longest prefix
    stuck: list[Operation] = field(default_factory=list)  # what could not be placed after it
    states: list[str] = field(default_factory=list)  # the model's states at that point

    def explain(self, limit: int = 12) -> str:
        keys = ", ".join(k.replace(LEASE_PREFIX, "lease:") for k in self.keys)
        if self.ok:
            return f"partition [{keys}]: linearizable ({len(self.operations)} operations)"
        if self.ok is None:
            return (
                f"partition [{keys}]: unknown, the search budget ran out after {self.nodes} "
                f"nodes ({len(self.operations)} operations)"
            )
        lines = [
            f"partition [{keys}]: NOT linearizable: {len(self.order)} of "
            f"{len(self.operations)} operations placed at most; the last placed:"
        ]
        lines += ["  " + op.describe() for op in self.order[-limit:]]
        lines.append("then none of these could be placed next:")
        lines += ["  " + op.describe() for op in self.stuck[:limit]]
        lines.append("model state(s) there: " + "; ".join(self.states[:4]))
        return "\n".join(lines)


def _search(
    ops: list[Operation], init: Mapping[str, Mapping[str, Any]], budget: int
) -> PartitionResult:
    keys = sorted({k for op in ops for k in keys_of(op)})
    commits: dict[tuple[str, str], int] = {}
    for op in ops:
        if op.op in ("commit", "commit_many"):
            for item in op.args["items"] if op.op == "commit_many" else [op.args]:
                pair = (item["key"], item["root"])
                commits[pair] = commits.get(pair, 0) + 1
    ctx = Context(keys, frozenset(p for p, n in commits.items() if n > 1))
    # the linked list of call and return entries, by time (calls first on a tie)
    entries: list[tuple[float, int, int, _Node]] = []
    calls: list[_Node] = []
    for i, op in enumerate(ops):
        ret = _Node(i, math.inf if op.ret is None else op.ret, None)
        call = _Node(i, op.invoke, ret)
        calls.append(call)
        if op.ret is None and op.op == "get":
            continue  # a read that may never have happened constrains nothing
        entries.append((call.time, 0, i, call))
        entries.append((ret.time, 1, i, ret))
    entries.sort(key=lambda e: (e[0], e[1], e[2]))
    head = _Node(-1, -math.inf, None)
    prev = head
    for *_, node in entries:
        prev.next, node.prev = node, prev
        prev = node

    def lift(call: _Node) -> None:
        assert call.prev is not None and call.match is not None
        call.prev.next = call.next
        if call.next is not None:
            call.next.prev = call.prev
        ret = call.match
        assert ret.prev is not None
        ret.prev.next = ret.next
        if ret.next is not None:
            ret.next.prev = ret.prev

    def unlift(call: _Node) -> None:
        ret = call.match
        assert ret is not None and ret.prev is not None and call.prev is not None
        ret.prev.next = ret
        if ret.next is not None:
            ret.next.prev = ret
        call.prev.next = call
        if call.next is not None:
            call.next.prev = call

    unknown = [i for i, op in enumerate(ops) if op.ret is None]

    def settle(states: frozenset[State], placed: int) -> list[_Node]:
        """Place every pending unknown operation that can no longer take effect."""
        done: list[_Node] = []
        for i in unknown:
            if not placed >> i & 1 and all(inert(ctx, s, ops[i]) for s in states):
                done.append(calls[i])
        return done

    states: frozenset[State] = frozenset({initial_state(keys, init)})
    placed = sum(1 << i for i in unknown if ops[i].op == "get")  # bitset of those linearized
    stack: list[tuple[_Node, frozenset[State], list[_Node]]] = []
    seen: set[tuple[int, frozenset[State]]] = set()
    best: list[int] = []
    best_stuck: list[int] = []
    best_states: frozenset[State] = states
    nodes = 0
    entry = head.next
    while head.next is not None:
        nodes += 1
        if nodes > budget:
            return PartitionResult(keys, ops, None, nodes)
        assert entry is not None
        if entry.match is not None:  # a call: try to place its operation now
            op = ops[entry.op]
            nxt: set[State] = set()
            for s in states:
                nxt.update(step(ctx, s, op))
            if nxt:
                new_states = frozenset(nxt)
                key = (placed | (1 << entry.op), new_states)
                if key not in seen:
                    seen.add(key)
                    placed |= 1 << entry.op
                    lift(entry)
                    auto = settle(new_states, placed)
                    for node in auto:
                        placed |= 1 << node.op
                        lift(node)
                    stack.append((entry, states, auto))
                    states = new_states
                    entry = head.next
                    continue
            entry = entry.next
        else:  # a return: its operation must have been placed by now; back up
            if len(stack) >= len(best):
                best = [n.op for n, _, _ in stack]
                best_stuck = _candidates(head)
                best_states = states
            if not stack:
                return _failed(keys, ops, nodes, best, best_stuck, best_states)
            top, states, auto = stack.pop()
            for node in reversed(auto):
                placed &= ~(1 << node.op)
                unlift(node)
            placed &= ~(1 << top.op)
            unlift(top)
            entry = top.next
    order = [ops[n.op] for n, _, _ in stack]
    return PartitionResult(keys, ops, True, nodes, order)


def _candidates(head: _Node) -> list[int]:
    """The operations invoked before the first pending return (those that could go next)."""
    found: list[int] = []
    node = head.next
    while node is not None:
        if node.match is None:
            if node.op not in found:
                found.append(node.op)
            break
        found.append(node.op)
        node = node.next
    return found


def _failed(
    keys: list[str],
    ops: list[Operation],
    nodes: int,
    best: list[int],
    stuck: list[int],
    states: frozenset[State],
) -> PartitionResult:
    names = [k.replace(LEASE_PREFIX, "lease:") for k in keys]
    shown = sorted(
        "{" + ", ".join(f"{n}: {v!r}" for n, v in zip(names, s, strict=True)) + "}" for s in states
    )
    return PartitionResult(
        keys, ops, False, nodes, [ops[i] for i in best], [ops[i] for i in stuck], shown
    )


@dataclass
class LinReport:
    """The verdict on a history: one :class:`PartitionResult` per partition."""

    partitions: list[PartitionResult]

    @property
    def ok(self) -> bool | None:
        """True if every partition is linearizable, False if one is not, else None."""
        if any(p.ok is False for p in self.partitions):
            return False
        return None if any(p.ok is None for p in self.partitions) else True

    @property
    def operations(self) -> int:
        return sum(len(p.operations) for p in self.partitions)

    def failures(self) -> list[PartitionResult]:
        return [p for p in self.partitions if p.ok is not True]

    def summary(self) -> str:
        verdict = {True: "linearizable", False: "NOT linearizable", None: "unknown"}[self.ok]
        lines = [f"{verdict}: {self.operations} operations in {len(self.partitions)} partition(s)"]
        lines += [p.explain() for p in self.failures()]
        return "\n".join(lines)


def check_linearizable(
    history: Iterable[Operation | Mapping[str, Any]],
    *,
    init: Mapping[str, Mapping[str, Any]] | None = None,
    budget: int = DEFAULT_BUDGET,
) -> LinReport:
    """Judge a history: operations, or their ``lin`` events (``init`` events are
    taken as initial records too). ``budget`` bounds the search nodes per partition."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise InvalidInput(f"budget must be a positive integer, not {budget!r}")
    ops: list[Operation] = []
    records: dict[str, Mapping[str, Any]] = dict(init or {})
    for n, item in enumerate(history):
        if isinstance(item, Operation):
            ops.append(_checked(item, f"operation {n}", len(ops)))
        elif isinstance(item, Mapping):
            if item.get("event") == "init":
                records[str(item.get("key"))] = item
                continue
            ops.append(_checked(_operation(item, f"event {n}"), f"event {n}", len(ops)))
        else:
            raise HistoryError(f"event {n}: an Operation or a lin event, not {type(item).__name__}")
    results = [_search(part, records, budget) for part in _partitions(ops)]
    return LinReport(results)
