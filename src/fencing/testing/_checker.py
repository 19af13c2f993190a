"""The history checker: judges a recorded history (see ``_history``) for anomalies.

Four kinds of anomaly, each reported with the events that show it:

``stale_write``
    A committed outcome whose ``applied_over`` differs from its
    ``expected_version``: the write replaced a version other than the one its
    decision was taken against.
``lost_update``
    An acknowledged commit whose write is not part of the history that led to
    the final state. Each key's final state is traced back through the versions
    each write was decided against (``expected_version``; ``applied_over`` for a
    guard-only intent); an acknowledged commit not on that trace is lost. That
    covers two acknowledged commits producing the same version (one overwrote
    the other), a final version below an acknowledged one (a write was rolled
    back), and a version skipped by a write decided against an older one.
``double_applied``
    One intent (``root_id``: a ``Recompute`` attempt shares its root) committed
    more than once to the same key.
``fence_regression``
    Along a key's chain of writes (each write follows the write it replaced,
    ``applied_over``), a commit made under a lease token lower than the token of
    an earlier commit: a zombie lease holder overwrote its successor.

The checker is linear in the length of the history: one pass over the events
with dictionary look-ups, then one pass over each key's commits. Keys without a
``final`` event are traced back from their highest acknowledged version.

It assumes the history holds every write made to the keys it covers from some
version on (writes made outside the recorder look like lost updates), and that
versions are integers that a guarded write raises by one.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, cast

from ._history import LEASE_ACTIONS, OUTCOMES, HistoryError

__all__ = [
    "ANOMALY_KINDS",
    "LABELS",
    "Anomaly",
    "Report",
    "check_file",
    "check_history",
    "iter_file",
]

#: The anomaly kinds, in the order reports show them.
ANOMALY_KINDS: Final = ("lost_update", "stale_write", "double_applied", "fence_regression")

#: How each kind is named in summaries and tables.
LABELS: Final = {
    "lost_update": "lost updates",
    "stale_write": "stale writes",
    "double_applied": "double-applied intents",
    "fence_regression": "fence regressions",
}

_EVENTS: Final = frozenset({"outcome", "final", "lease", "error"})
_OUTCOMES: Final = frozenset(OUTCOMES)
_LEASE_ACTIONS: Final = frozenset(LEASE_ACTIONS)

Key = tuple[str, str | int]


@dataclass(frozen=True, slots=True)
class Anomaly:
    """One anomaly: its kind, the key, what happened, and the offending events.

    ``lines`` are the events' line numbers (1-based positions in the history).
    """

    kind: str
    collection: str
    key: str | int
    message: str
    events: tuple[Mapping[str, Any], ...]
    lines: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "collection": self.collection,
            "key": self.key,
            "message": self.message,
            "lines": list(self.lines),
            "events": [dict(e) for e in self.events],
        }


@dataclass
class Report:
    """What the checker found. ``ok`` is True when there is no anomaly."""

    events: int = 0
    keys: int = 0
    outcomes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    errors: int = 0
    leases: int = 0
    anomalies: dict[str, list[Anomaly]] = field(
        default_factory=lambda: {kind: [] for kind in ANOMALY_KINDS}
    )

    @property
    def counts(self) -> dict[str, int]:
        """The number of anomalies of each kind (every kind present, zeros included)."""
        return {kind: len(found) for kind, found in self.anomalies.items()}

    @property
    def total(self) -> int:
        return sum(len(found) for found in self.anomalies.values())

    @property
    def ok(self) -> bool:
        return self.total == 0

    def to_dict(self, examples: int = 5) -> dict[str, Any]:
        """JSON-ready: counts of everything and the first ``examples`` of each anomaly."""
        return {
            "ok": self.ok,
            "events": self.events,
            "keys": self.keys,
            "outcomes": dict(self.outcomes),
            "errors": self.errors,
            "leases": self.leases,
            "anomalies": self.counts,
            "examples": {
                kind: [a.to_dict() for a in found[:examples]]
                for kind, found in self.anomalies.items()
            },
        }

    def summary(self) -> str:
        if self.ok:
            return f"ok: {self.events} events on {self.keys} keys, no anomaly"
        found = ", ".join(f"{n} {LABELS[kind]}" for kind, n in self.counts.items() if n)
        return f"{self.total} anomalies in {self.events} events on {self.keys} keys: {found}"


# -- reading and validating events -------------------------------------------------
def _fail(line: int, problem: str) -> HistoryError:
    return HistoryError(f"line {line}: {problem}")


def _str(ev: Mapping[str, Any], name: str, line: int) -> str:
    value = ev.get(name)
    if not isinstance(value, str) or not value:
        raise _fail(line, f"{name!r} must be a non-empty string, got {value!r}")
    return value


def _opt_int(ev: Mapping[str, Any], name: str, line: int) -> int | None:
    value = ev.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(line, f"{name!r} must be an integer or null, got {value!r}")
    return value


def _key(ev: Mapping[str, Any], line: int) -> Key:
    collection = _str(ev, "collection", line)
    if "key" not in ev:
        raise _fail(line, "'key' is missing")
    key = ev["key"]
    if isinstance(key, bool) or not isinstance(key, str | int):
        raise _fail(line, f"'key' must be a string or an integer, got {key!r}")
    return collection, key


def _check_t(ev: Mapping[str, Any], line: int) -> None:
    t = ev.get("t")
    if t is not None and (
        isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t)
    ):
        raise _fail(line, f"'t' must be a finite number, got {t!r}")


@dataclass(slots=True)
class _Commit:
    """An acknowledged, versioned commit of one key, in history order."""

    line: int
    event: Mapping[str, Any]
    version: int
    applied_over: int
    base: int  # the version its decision was taken against
    token: int | None
    content_pre: int  # latest earlier producer of ``base`` (-1: none seen yet)
    write_pre: int  # latest earlier producer of ``applied_over`` (-1: none seen yet)


@dataclass(slots=True)
class _KeyState:
    commits: list[_Commit] = field(default_factory=list)
    latest: dict[int, int] = field(default_factory=dict)  # version -> last producer so far
    first: dict[int, int] = field(default_factory=dict)  # version -> first producer
    producers: dict[int, int] = field(default_factory=dict)
    roots: dict[str, list[tuple[int, Mapping[str, Any]]]] = field(default_factory=dict)
    final: tuple[int, Mapping[str, Any], int | None] | None = None


class _Checker:
    def __init__(self) -> None:
        self.report = Report()
        self.keys: dict[Key, _KeyState] = {}

    def _state(self, key: Key) -> _KeyState:
        state = self.keys.get(key)
        if state is None:
            state = self.keys[key] = _KeyState()
        return state

    def add(self, line: int, ev: object) -> None:
        if type(ev) is not dict and not isinstance(ev, Mapping):
            raise _fail(line, f"an event must be a JSON object, got {type(ev).__name__}")
        kind = ev.get("event")
        if kind == "outcome":
            self._outcome(line, ev)
            return
        if kind not in _EVENTS:
            raise _fail(line, f"'event' must be one of {sorted(_EVENTS)}, got {kind!r}")
        _check_t(ev, line)
        self.report.events += 1
        if kind == "final":
            self._final(line, ev)
        elif kind == "lease":
            _str(ev, "name", line)
            if ev.get("action") not in _LEASE_ACTIONS:
                raise _fail(line, f"lease 'action' must be one of {list(LEASE_ACTIONS)}")
            if _opt_int(ev, "token", line) is None:
                raise _fail(line, "a lease event needs an integer 'token'")
            self.report.leases += 1
        else:
            self._state(_key(ev, line))
            _str(ev, "intent_id", line)
            self.report.errors += 1

    def _outcome(self, line: int, ev: Mapping[str, Any]) -> None:
        # The hot path: plain type checks first, the careful ones only to explain a failure.
        get = ev.get
        collection, k, intent_id, outcome = (
            get("collection"),
            get("key"),
            get("intent_id"),
            get("outcome"),
        )
        if not (type(collection) is str and collection and (type(k) is str or type(k) is int)):
            _key(ev, line)
        if type(intent_id) is not str or not intent_id:
            _str(ev, "intent_id", line)
        root = get("root_id")
        if root is None:
            root = str(intent_id).split("~", 1)[0]
        elif type(root) is not str or not root:
            raise _fail(line, f"'root_id' must be a non-empty string, got {root!r}")
        if outcome not in _OUTCOMES:
            raise _fail(line, f"'outcome' must be one of {list(OUTCOMES)}, got {outcome!r}")
        expected, version, applied_over, token, fence = (
            get("expected_version"),
            get("version"),
            get("applied_over"),
            get("token"),
            get("fence"),
        )
        for value in (expected, version, applied_over, token, fence):
            if value is not None and type(value) is not int:
                for name in ("expected_version", "version", "applied_over", "token", "fence"):
                    _opt_int(ev, name, line)
        t = get("t")
        if t is not None and (type(t) is not float or t - t != 0.0):  # not finite: inf - inf is nan
            _check_t(ev, line)
        self.report.events += 1
        key = cast(Key, (collection, k))  # checked above
        state = self.keys.get(key)
        if state is None:
            state = self.keys[key] = _KeyState()
        self.report.outcomes[outcome] += 1
        if outcome != "committed":
            return
        found = state.roots.get(root)
        if found is None:
            state.roots[root] = [(line, ev)]
        else:
            found.append((line, ev))
        if version is None:
            if applied_over is not None:
                raise _fail(line, "a commit with 'applied_over' needs its 'version'")
            return  # a table without versions: nothing to chain
        if applied_over is None:
            raise _fail(line, "a committed outcome with a 'version' needs 'applied_over'")
        if expected is not None and applied_over != expected:
            self._anomaly(
                "stale_write",
                key,
                f"intent {_short(intent_id)} decided against v{expected},"
                f" applied over v{applied_over}",
                [(line, ev)],
            )
        base = expected if expected is not None else applied_over
        latest = state.latest
        index = len(state.commits)
        state.commits.append(
            _Commit(
                line,
                ev,
                version,
                applied_over,
                base,
                token,
                latest.get(base, -1),
                latest.get(applied_over, -1),
            )
        )
        latest[version] = index
        if version not in state.first:
            state.first[version] = index
        producers = state.producers
        producers[version] = producers.get(version, 0) + 1

    def _final(self, line: int, ev: Mapping[str, Any]) -> None:
        key = _key(ev, line)
        version = _opt_int(ev, "version", line)
        _opt_int(ev, "fence", line)
        state = self._state(key)
        if state.final is not None:
            raise _fail(line, f"a second 'final' event for {key[0]}/{key[1]!r}")
        state.final = (line, ev, version)

    def _anomaly(
        self, kind: str, key: Key, message: str, found: list[tuple[int, Mapping[str, Any]]]
    ) -> None:
        self.report.anomalies[kind].append(
            Anomaly(
                kind,
                key[0],
                key[1],
                message,
                tuple(ev for _, ev in found),
                tuple(line for line, _ in found),
            )
        )

    # -- the per-key pass ----------------------------------------------------------
    def finish(self) -> Report:
        self.report.keys = len(self.keys)
        for key, state in self.keys.items():
            for root, commits in state.roots.items():
                if len(commits) > 1:
                    self._anomaly(
                        "double_applied",
                        key,
                        f"intent {_short(root)} committed {len(commits)} times",
                        commits,
                    )
            if state.commits:
                self._lost_updates(key, state)
                self._fence_regressions(key, state)
        return self.report

    @staticmethod
    def _resolve(state: _KeyState, earlier: int, version: int, me: int) -> int:
        """The commit that produced ``version`` before commit ``me`` (-1: none recorded).

        The latest producer earlier in the history; if it was recorded later (events
        from several processes can land out of order), the first one recorded.
        """
        if earlier >= 0:
            return earlier
        found = state.first.get(version, -1)
        if found == me:
            found = state.latest.get(version, -1)
        return -1 if found == me else found

    def _lost_updates(self, key: Key, state: _KeyState) -> None:
        commits = state.commits
        if state.final is not None:
            final_line, final_ev, head_version = state.final
            if head_version is None:
                return  # the record was deleted: there is no final chain to trace
        else:
            head_version = max(c.version for c in commits)
            final_line, final_ev = commits[state.latest[head_version]].line, None
        reached = bytearray(len(commits))
        cur = state.latest.get(head_version, -1)
        while cur >= 0 and not reached[cur]:
            reached[cur] = 1
            c = commits[cur]
            cur = self._resolve(state, c.content_pre, c.base, cur)
        tail = [(final_line, final_ev)] if final_ev is not None else []
        for i, c in enumerate(commits):
            if reached[i]:
                continue
            if c.version > head_version:
                why = f"rolled back, the final version is v{head_version}"
            elif state.producers.get(c.version, 0) > 1:
                why = f"{state.producers[c.version]} commits produced v{c.version}"
            else:
                why = "overwritten by a write decided against an older version"
            self._anomaly(
                "lost_update",
                key,
                f"v{c.version} of intent {_short(c.event.get('intent_id'))} lost: {why}",
                [(c.line, c.event), *tail],
            )

    def _fence_regressions(self, key: Key, state: _KeyState) -> None:
        commits = state.commits
        n = len(commits)
        # best[i]: index of the highest-token commit on the chain up to and including i
        best = [-2] * n  # -2: not computed yet; -1: no token on the chain
        busy = bytearray(n)

        def top(i: int) -> int:
            """The highest-token commit on the chain ending at ``i`` (iterative, memoised)."""
            stack: list[int] = []
            j = i
            while j >= 0 and best[j] == -2 and not busy[j]:
                busy[j] = 1
                stack.append(j)
                c = commits[j]
                j = self._resolve(state, c.write_pre, c.applied_over, j)
            carry = best[j] if j >= 0 and best[j] != -2 else -1
            for k in reversed(stack):
                tk = commits[k].token
                if tk is not None and (carry < 0 or tk > (commits[carry].token or 0)):
                    carry = k
                best[k] = carry
                busy[k] = 0
            return best[i] if i >= 0 else -1

        for i, c in enumerate(commits):
            if c.token is None:
                continue
            pred = self._resolve(state, c.write_pre, c.applied_over, i)
            if pred < 0:
                continue
            holder = top(pred)
            if holder < 0:
                continue
            higher = commits[holder]
            if higher.token is not None and higher.token > c.token:
                self._anomaly(
                    "fence_regression",
                    key,
                    f"token {c.token} wrote v{c.version} after token {higher.token}"
                    f" wrote v{higher.version}",
                    [(higher.line, higher.event), (c.line, c.event)],
                )


def _short(intent_id: object) -> str:
    """An intent id shortened for messages (the events keep it whole)."""
    text = str(intent_id)
    return text if len(text) <= 14 else text[:12] + "…"


# -- public entry points ------------------------------------------------------------
def check_history(events: Iterable[Mapping[str, Any]]) -> Report:
    """Judge a history given as event dicts (positions count from 1 as line numbers).

    Malformed events raise :class:`HistoryError` naming the position.
    """
    checker = _Checker()
    for line, ev in enumerate(events, 1):
        checker.add(line, ev)
    return checker.finish()


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def iter_file(path: str | os.PathLike[str]) -> Iterator[tuple[int, Any]]:
    """``(line number, parsed JSON)`` for each non-blank line of a history file."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                yield number, json.loads(raw, parse_constant=_reject_constant)
            except (ValueError, UnicodeDecodeError) as exc:
                raise HistoryError(f"{os.fspath(path)}: line {number}: not JSON ({exc})") from None


def check_file(path: str | os.PathLike[str]) -> Report:
    """Judge a JSON Lines history file; malformed lines raise :class:`HistoryError`."""
    checker = _Checker()
    try:
        for number, ev in iter_file(path):
            checker.add(number, ev)
    except HistoryError as exc:
        text = str(exc)
        prefix = f"{os.fspath(path)}: "
        if not text.startswith(prefix):
            raise HistoryError(prefix + text) from None
        raise
    return checker.finish()
