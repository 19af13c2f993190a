"""The sequential model the linearizability checker holds a store to.

One partition's state is a tuple of per-key states in a fixed key order. A record
key's state is a :class:`RecordState`; a lease's a :class:`LeaseState`. ``step``
returns every state the operation may leave behind when it answered as recorded:
none if the answer is impossible, several when the model cannot tell (a lease
expiring by the store's clock, an operation whose outcome is unknown).

The rules follow ``fencing._rules.judge``, in its order: missing, duplicate,
fenced (a newer token, then expiry), stale (version, then guard).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

from .._rules import guard_holds

__all__ = [
    "LEASE_PREFIX",
    "OPS",
    "LeaseState",
    "Operation",
    "RecordState",
    "canonical",
    "inert",
    "initial_state",
    "keys_of",
    "step",
]

#: The operation names a history may hold.
OPS: Final = ("create", "get", "delete", "commit", "commit_many", "acquire", "release")
#: Partition keys of leases are their names after this prefix (record keys never start so).
LEASE_PREFIX: Final = "\x00lease:"
COMMIT_OUTCOMES: Final = ("committed", "stale", "duplicate", "missing", "fenced")


def _norm(value: Any) -> Any:
    # JSON equality as fencing's stores keep it: 1 equals 1.0, true is not 1
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _norm(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_norm(v) for v in value]
    return value


def canonical(value: Any) -> str:
    """The canonical JSON text of a state (sorted keys, 1.0 written as 1)."""
    return json.dumps(_norm(value), sort_keys=True, separators=(",", ":"))


class RecordState(NamedTuple):
    """One record key: ``tomb`` is the last version of a deleted record (0: none yet);
    ``applied`` holds the tracked root intent ids applied *to this key*."""

    exists: bool = False
    version: int = 0
    state: str = "null"
    fence: int = 0
    applied: frozenset[str] = frozenset()
    tomb: int = 0


class LeaseState(NamedTuple):
    """One lease name: the last token granted (0: none) and whether it may be held."""

    last: int = 0
    held: bool = False


State = tuple[RecordState | LeaseState, ...]


@dataclass(frozen=True)
class Operation:
    """One operation of a history.

    ``ret`` is None when the outcome is unknown (the call raised
    ``TransientStoreError``): it may have taken effect at any moment after
    ``invoke``, or never, and ``result`` is not judged.
    """

    op: str
    args: Mapping[str, Any]
    result: Any
    invoke: int
    ret: int | None
    process: str = ""
    thread: str = ""
    index: int = field(default=-1, compare=False)

    def describe(self) -> str:
        args = json.dumps(self.args, sort_keys=True, default=str)
        result = "?" if self.ret is None else json.dumps(self.result, sort_keys=True, default=str)
        who = f"{self.process}/{self.thread}".strip("/")
        end = "inf" if self.ret is None else str(self.ret)
        return f"#{self.index} {who} [{self.invoke}, {end}] {self.op}{args} -> {result}"


def _items(op: Operation) -> Sequence[Mapping[str, Any]]:
    if op.op == "commit_many":
        items: Sequence[Mapping[str, Any]] = op.args["items"]
        return items
    return [op.args]


def keys_of(op: Operation) -> list[str]:
    """The partition keys an operation touches (records, and leases it names)."""
    if op.op in ("acquire", "release"):
        return [LEASE_PREFIX + op.args["name"]]
    if op.op in ("commit", "commit_many"):
        found: list[str] = []
        for item in _items(op):
            found.append(item["key"])
            if item.get("lease") is not None:
                found.append(LEASE_PREFIX + item["lease"])
        return found
    return [op.args["key"]]


def initial_state(keys: Sequence[str], init: Mapping[str, Mapping[str, Any]]) -> State:
    """The state before the history: absent records and unheld leases, except the
    records ``init`` names (``{"version": .., "state": .., "fence": ..}``)."""
    out: list[RecordState | LeaseState] = []
    for key in keys:
        if key.startswith(LEASE_PREFIX):
            out.append(LeaseState())
            continue
        row = init.get(key)
        if row is None:
            out.append(RecordState())
        else:
            version = int(row.get("version", 1))
            out.append(
                RecordState(
                    True, version, canonical(row.get("state", {})), int(row.get("fence", 0))
                )
            )
    return tuple(out)


class Context:
    """What ``step`` needs about a partition: key positions and tracked root ids."""

    def __init__(self, keys: Sequence[str], tracked: frozenset[tuple[str, str]]) -> None:
        self.keys = list(keys)
        self.pos = {k: i for i, k in enumerate(self.keys)}
        # (key, root) pairs committed more than once to that key: only those can
        # ever be asked about, so only those are kept in ``applied``
        self.tracked = tracked


class _Any:
    """The answer of an operation whose outcome is unknown: any answer goes."""

    def __repr__(self) -> str:
        return "ANY"


ANY: Final = _Any()


def step(ctx: Context, state: State, op: Operation) -> list[State]:
    """Every state ``op`` may leave behind, answering as recorded (empty: impossible)."""
    if op.ret is None:
        if op.op == "get":
            return [state]
        found = {state}  # it never took effect
        found.update(_apply(ctx, state, op, ANY))
        return list(found)
    return _apply(ctx, state, op, op.result)


def inert(ctx: Context, state: State, op: Operation) -> bool:
    """True when ``op`` (of unknown outcome) cannot take effect in ``state`` nor in any
    state after it: placing it now changes nothing, so the search need not choose.

    Versions and tokens only grow in the model: a commit expecting version ``v`` is
    inert once the record is past ``v`` (or deleted at ``v`` or later), or once a
    newer token than its own was granted or wrote the record; a release once its
    token is not the last one granted. Creates, deletes and acquires never are.
    """
    if op.op == "get":
        return True
    if op.op == "release":
        lease = state[ctx.pos[LEASE_PREFIX + op.args["name"]]]
        assert isinstance(lease, LeaseState)
        return bool(lease.last != op.args["token"])
    if op.op == "commit":
        return _commit_inert(ctx, state, op.args)
    if op.op == "commit_many":
        return all(_commit_inert(ctx, state, item) for item in op.args["items"])
    return False


def _commit_inert(ctx: Context, state: State, args: Mapping[str, Any]) -> bool:
    rec = state[ctx.pos[args["key"]]]
    assert isinstance(rec, RecordState)
    name = args.get("lease")
    if name is not None:
        lease = state[ctx.pos[LEASE_PREFIX + name]]
        assert isinstance(lease, LeaseState)
        if lease.last > args["token"] or rec.fence > args["token"]:
            return True
    expected = args.get("expected")
    if expected is None:
        return False
    return bool(rec.version > expected if rec.exists else rec.tomb >= expected)


def _apply(ctx: Context, state: State, op: Operation, result: Any) -> list[State]:
    kind = op.op
    if kind == "commit":
        return [s for s, _ in _commit(ctx, state, op.args, result)]
    if kind == "commit_many":
        return _batch(ctx, state, op.args["items"], result)
    if kind in ("acquire", "release"):
        i = ctx.pos[LEASE_PREFIX + op.args["name"]]
        lease = state[i]
        assert isinstance(lease, LeaseState)
        return [_put(state, i, new) for new in _lease(kind, lease, op.args, result)]
    i = ctx.pos[op.args["key"]]
    rec = state[i]
    assert isinstance(rec, RecordState)
    return [_put(state, i, new) for new in _record(kind, rec, op.args, result)]


def _put(state: State, i: int, value: RecordState | LeaseState) -> State:
    return (*state[:i], value, *state[i + 1 :])


def _record(kind: str, rec: RecordState, args: Mapping[str, Any], result: Any) -> list[RecordState]:
    if kind == "get":
        if not rec.exists:
            return [rec] if result is None else []
        if result is None:
            return []
        ok = result["version"] == rec.version and canonical(result["state"]) == rec.state
        return [rec] if ok else []
    if kind == "create":
        if rec.exists:
            return [rec] if result is ANY or result == "exists" else []
        new = rec._replace(exists=True, version=rec.tomb + 1, state=canonical(args["state"]))
        new = new._replace(fence=0)
        if result is ANY or (isinstance(result, Mapping) and result.get("version") == new.version):
            return [new]
        return []
    if kind == "delete":
        if rec.exists:
            gone = rec._replace(exists=False, state="null", fence=0, tomb=rec.version, version=0)
            return [gone] if result is ANY or result is True else []
        return [rec] if result is ANY or result is False else []
    raise AssertionError(kind)  # pragma: no cover


def _lease(kind: str, lease: LeaseState, args: Mapping[str, Any], result: Any) -> list[LeaseState]:
    if kind == "acquire":
        granted = lease._replace(last=lease.last + 1, held=True)
        if result is ANY:  # granted, or refused while held
            return [granted, lease] if lease.held else [granted]
        if result == "held":
            return [lease] if lease.held else []
        # granted: always the next token; while held only if the holder's TTL ran out
        return [granted] if result.get("token") == granted.last else []
    token = args["token"]
    current = lease.held and token == lease.last
    if result is ANY:
        return [lease._replace(held=False)] if current else [lease]
    if result is True:
        return [lease._replace(held=False)] if current else []
    # refused: not its token any more, or its TTL ran out (then nobody holds it)
    return [lease._replace(held=False)] if token == lease.last else [lease]


def _judge(ctx: Context, state: State, args: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    """The outcomes a commit may have in ``state``: (outcome, fence reason)."""
    rec = state[ctx.pos[args["key"]]]
    assert isinstance(rec, RecordState)
    if not rec.exists:
        return [("missing", None)]
    if (args["key"], args["root"]) in ctx.tracked and args["root"] in rec.applied:
        return [("duplicate", None)]
    name = args.get("lease")
    answers: list[tuple[str, str | None]] = []
    if name is not None:
        lease = state[ctx.pos[LEASE_PREFIX + name]]
        assert isinstance(lease, LeaseState)
        token = int(args["token"])
        if rec.fence > token or lease.last != token:
            return [("fenced", "newer_owner")]
        if not lease.held:
            return [("fenced", "expired")]
        answers.append(("fenced", "expired"))  # its TTL may have run out by the store's clock
    expected = args.get("expected")
    if expected is not None and rec.version != expected:
        return [*answers, ("stale", None)]
    if not guard_holds(args.get("guard"), json.loads(rec.state)):
        return [*answers, ("stale", None)]
    return [*answers, ("committed", None)]


def _commit(
    ctx: Context, state: State, args: Mapping[str, Any], result: Any
) -> list[tuple[State, Any]]:
    """(state after, answer) for each way the commit may have gone answering ``result``
    (``ANY``: any answer)."""
    i = ctx.pos[args["key"]]
    rec = state[i]
    assert isinstance(rec, RecordState)
    found: list[tuple[State, Any]] = []
    for outcome, reason in _judge(ctx, state, args):
        if outcome == "committed":
            if args.get("merge"):
                merged = json.loads(rec.state)
                merged.update(args["state"])
                new_state = canonical(merged)
            else:
                new_state = canonical(args["state"])
            fence = rec.fence
            if args.get("lease") is not None:
                fence = max(fence, int(args["token"]))
            applied = rec.applied
            if (args["key"], args["root"]) in ctx.tracked:
                applied = applied | {args["root"]}
            new = rec._replace(
                version=rec.version + 1, state=new_state, fence=fence, applied=applied
            )
            answer = {"outcome": outcome, "version": new.version}
            after = _put(state, i, new)
        else:
            answer = {"outcome": outcome, "version": rec.version if rec.exists else None}
            if reason is not None:
                answer["reason"] = reason
            after = state
        if result is ANY or _matches(result, answer):
            found.append((after, answer))
    return found


def _matches(result: Any, answer: Mapping[str, Any]) -> bool:
    if not isinstance(result, Mapping) or result.get("outcome") != answer["outcome"]:
        return False
    if "version" in result and result["version"] != answer["version"]:
        return False
    return not ("reason" in result and "reason" in answer and result["reason"] != answer["reason"])


def _batch(
    ctx: Context, state: State, items: Sequence[Mapping[str, Any]], results: Any
) -> list[State]:
    """A batch as one atomic step: its items in order, each seeing the ones before."""
    if results is not ANY and (not isinstance(results, list) or len(results) != len(items)):
        return []
    frontier = {state}
    for n, item in enumerate(items):
        want = results[n] if isinstance(results, list) else ANY
        nxt: set[State] = set()
        for s in frontier:
            nxt.update(after for after, _ in _commit(ctx, s, item, want))
        frontier = nxt
        if not frontier:
            return []
    return list(frontier)
