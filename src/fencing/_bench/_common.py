"""What every store's bench shares: fencing's side of each contest, and the scenario.

fencing's side goes through the public API only (``collection.commit``, ``table.commit``,
``apply``, ``commit_many``, ``acquire``/``renew``/``release``), so it is the same code
on every store. Each store module supplies its hand-written baselines (a
:class:`HandWritten`) and how to make a user table for ``store.table``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Final, Generic, Protocol, TypeVar

import fencing

from .._values import Intent, Kind, Outcome, Record, new_intent_id
from . import _answer, _worktx
from ._harness import MANY_TARGET, SINGLE_TARGET, BenchFailed, Block, Contest, Side, Skip
from ._worktx import _paramstyle

__all__ = [
    "ANSWER_ROWS",
    "GUARD_OPERATION",
    "KEYS",
    "LEASE_TTL",
    "NO_ROW",
    "NO_TRIGGER",
    "START",
    "Bench",
    "Cursor",
    "FencingOps",
    "HandWritten",
    "LeaseCalls",
    "check_committed",
    "decide_state",
    "hand_lease_cycle",
    "new_id",
]

#: Records per contest: commits cycle over them; a commit_many call writes each once.
KEYS: Final = 100
#: Rows of the hand-written side's user table: ``KEYS`` for the old baseline, ``KEYS``
#: for the FOR UPDATE one, ``KEYS`` for the same-answer one, one for ``check_answers``.
ANSWER_ROWS: Final = 3 * KEYS + 1
#: Said of a baseline that does not read back what fencing returns.
NO_ROW: Final = ", no row back"
#: The state every benchmark record starts with.
START: Final[Mapping[str, Any]] = {"status": "new", "n": 0}
#: Seconds a benchmark lease is held for (each is released long before).
LEASE_TTL: Final = 60.0
FENCED_TTL: Final = 3600.0
#: The ``using`` contest's operation.
USING_OPERATION: Final = "table.commit in the caller's transaction"
#: The ``guard`` contest's operation, and its baseline's label.
GUARD_OPERATION: Final = "table.commit, guard trigger"
NO_TRIGGER: Final = "no trigger"
#: The ``metrics`` contest's operation, and its baseline's label.
METRICS_OPERATION: Final = "collection.commit, Prometheus metrics on"
METRICS_OFF: Final = "metrics off"
#: The ``worktx`` contest's operation, and its baseline's label.
WORKTX_OPERATION: Final = "fenced task: commit + own row + outbox send"

K = TypeVar("K", str, int)
Builder = Callable[[], Contest | Skip]


class Cursor(Generic[K]):
    """Hands out ``(key, expected version)`` pairs round-robin over a side's records.

    Every measured commit must apply, so each pair taken is the version the record
    will be at when its turn comes.
    """

    def __init__(self, keys: Sequence[K], first_version: int = 1) -> None:
        self.keys: list[K] = list(keys)
        self.versions = [first_version] * len(self.keys)
        self.next = 0

    def take(self, n: int) -> list[tuple[K, int]]:
        out: list[tuple[K, int]] = []
        size = len(self.keys)
        for _ in range(n):
            k = self.next
            out.append((self.keys[k], self.versions[k]))
            self.versions[k] += 1
            self.next = (k + 1) % size
        return out


def new_id() -> str:
    """A fresh intent id, as ``Intent.new`` makes them (both sides insert alike)."""
    return new_intent_id()


def check_committed(outcome: Outcome) -> None:
    if not outcome.committed:
        raise BenchFailed(f"a measured commit did not apply: {outcome!r}")


def decide_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """What ``apply`` decides, on both sides: ship, and count."""
    return {"status": "shipped", "n": state["n"] + 1}


def collection_state(i: int) -> dict[str, Any]:
    return {"status": "shipped", "n": i}


def table_state(i: int) -> dict[str, Any]:
    return {"status": "shipped", "total": i}


class FencingOps:
    """fencing's side of every contest, through the public API only."""

    def __init__(self, store: fencing.Store, suffix: str) -> None:
        self.store = store
        self.suffix = suffix
        self.collection = f"bench-{suffix}"
        self.coll = store.collection(self.collection)
        self.created: list[str] = []

    def records(self, keys: Sequence[str]) -> None:
        for key in keys:
            self.coll.create(key, START)
            self.created.append(key)

    def cleanup(self) -> None:
        for key in self.created:
            self.coll.delete(key)
        self.created.clear()

    def _intents(
        self, cursor: Cursor[Any], n: int, name: str, kind: Kind
    ) -> list[tuple[Intent, dict[str, Any]]]:
        state = collection_state if kind == "collection" else table_state
        return [
            (Intent(new_id(), name, key, version, "ship", kind=kind), state(i))
            for i, (key, version) in enumerate(cursor.take(n))
        ]

    def commit(self, keys: Sequence[str]) -> Side:
        cursor, commit = Cursor(keys), self.coll.commit

        def prepare(n: int) -> Block:
            items = self._intents(cursor, n, self.collection, "collection")

            def op(i: int) -> None:
                intent, state = items[i]
                check_committed(commit(intent, state))

            return Block([op])

        return Side("fencing", "collection.commit(intent, state)", prepare)

    def table_commit(self, table: fencing.Table, keys: Sequence[int]) -> Side:
        cursor, commit = Cursor(keys), table.commit

        def prepare(n: int) -> Block:
            items = self._intents(cursor, n, table.name, "table")

            def op(i: int) -> None:
                intent, state = items[i]
                check_committed(commit(intent, state))

            return Block([op])

        return Side("fencing", "table.commit(intent, {status, total})", prepare)

    def bound_table_commit(self, table: fencing.Table, conn: Any, keys: Sequence[int]) -> Side:
        """``table.commit`` through ``store.using(conn)``, then the caller's COMMIT."""
        cursor = Cursor(keys)
        view = self.store.using(conn).table(table.name)
        commit, done = view.commit, conn.commit

        def prepare(n: int) -> Block:
            items = self._intents(cursor, n, table.name, "table")

            def op(i: int) -> None:
                intent, state = items[i]
                check_committed(commit(intent, state))
                done()

            return Block([op])

        return Side(
            "fencing, using(conn)",
            "store.using(conn).table(...).commit(intent, state); conn.commit()",
            prepare,
        )

    def worker_task(
        self, table: fencing.Table, conn: Any, shipments: str, keys: Sequence[int], joined: bool
    ) -> Side:
        """One delivery of a fenced task in the worker's transaction or not (_worktx)."""
        return _worktx.worker_task(self, table, conn, shipments, Cursor(keys), new_id, joined)

    def apply(self, keys: Sequence[str]) -> Side:
        cursor, apply = Cursor(keys), self.coll.apply

        def decide(record: Record) -> dict[str, Any]:
            return decide_state(record.state)

        def prepare(n: int) -> Block:
            items = self._intents(cursor, n, self.collection, "collection")

            def op(i: int) -> None:
                check_committed(apply(items[i][0], decide))

            return Block([op])

        return Side("fencing", "collection.apply(intent, decide)", prepare)

    def commit_many(self, keys: Sequence[str]) -> Side:
        cursor, commit_many, batch = Cursor(keys), self.coll.commit_many, len(keys)

        def prepare(n: int) -> Block:
            batches = [
                self._intents(cursor, batch, self.collection, "collection") for _ in range(n)
            ]

            def op(i: int) -> None:
                for outcome in commit_many(batches[i]):
                    check_committed(outcome)

            return Block([op])

        return Side("fencing", f"collection.commit_many({batch} items)", prepare)

    def fenced(self, keys: Sequence[str], lease_name: str) -> Side:
        cursor, commit, store = Cursor(keys), self.coll.commit, self.store

        def prepare(n: int) -> Block:
            items = self._intents(cursor, n, self.collection, "collection")
            lease = store.acquire(lease_name, owner="bench", ttl=FENCED_TTL)

            def op(i: int) -> None:
                intent, state = items[i]
                check_committed(commit(intent, state, lease=lease))

            return Block([op], close=lease.release)

        return Side("fencing", "collection.commit(intent, state, lease=lease)", prepare)

    def lease_cycle(self, lease_name: str) -> Side:
        store = self.store

        def prepare(n: int) -> Block:
            held: list[fencing.Lease] = []

            def acquire(i: int) -> None:
                held.append(store.acquire(lease_name, owner="bench", ttl=LEASE_TTL))

            def renew(i: int) -> None:
                held[0].renew()

            def release(i: int) -> None:
                held.pop().release()

            return Block([acquire, renew, release])

        return Side("fencing", "store.acquire(); lease.renew(); lease.release()", prepare)


class HandWritten(Protocol):
    """A store's hand-written baselines: for each operation, one side or more."""

    def create_records(self, collection: str, keys: Sequence[str]) -> None: ...
    def commit(self, collection: str, keys: Sequence[str]) -> list[Side]: ...
    def table_commit(self, keys: Sequence[int]) -> list[Side]: ...
    def apply(self, collection: str, keys: Sequence[str]) -> list[Side]: ...
    def commit_many(self, collection: str, keys: Sequence[str]) -> list[Side]: ...
    def fenced(self, collection: str, keys: Sequence[str], lease_name: str) -> list[Side]: ...
    def lease_cycle(self, lease_name: str) -> list[Side]: ...
    def close(self) -> None: ...


class Bench:
    """One store and setting: fencing beside a store's hand-written baselines.

    Subclasses set ``store_name`` and ``setting``, open ``store`` and ``hand``, and
    implement :meth:`fencing_table` (a user table with ``KEYS`` rows for
    ``store.table``) and :meth:`drop` (remove what the bench created).
    """

    store_name: str = ""
    setting: str = ""
    #: single operations' target (``_harness``); ``None``: none (``:memory:``)
    single_target: float | None = SINGLE_TARGET
    cleanup_records: bool = True
    #: SQL stores: the ``guard`` contest (``user_table`` makes its two tables).
    guard_trigger: bool = False

    def __init__(self, store: fencing.Store, hand: HandWritten, suffix: str) -> None:
        self.store = store
        self.hand = hand
        self.suffix = suffix
        self.ours = FencingOps(store, suffix)
        self._outbox_tasks: list[str] = []

    # -- hooks ---------------------------------------------------------------------------
    def fencing_table(self) -> fencing.Table | Skip:
        return Skip("table.commit", "this store has no guarded tables")

    def user_table(self, name: str) -> fencing.Table:
        """A user table ``name`` with ``KEYS`` rows, as ``store.table`` (SQL stores)."""
        raise NotImplementedError

    def borrowed(self) -> Any:
        """A driver connection of the caller's to fencing's database, not in autocommit
        mode (SQL stores: the ``using`` contest); closed by :meth:`drop`."""
        raise NotImplementedError

    def drop(self) -> None:
        """Remove what the bench created on fencing's side (the baseline cleans itself)."""

    # -- contests ------------------------------------------------------------------------
    def contests(self) -> list[tuple[str, Builder]]:
        found: list[tuple[str, Builder]] = [
            ("commit", self.commit),
            ("refused", self.refused),
            ("table", self.table_commit),
            ("apply", self.apply),
            ("many", self.commit_many),
            ("fenced", self.fenced),
            ("lease", self.lease_cycle),
            ("metrics", self.metrics),
        ]
        if self.guard_trigger:
            found.insert(2, ("guard", self.guard))
            found.insert(3, ("using", self.using))
            found.insert(4, ("worktx", self.worktx))
        return found

    def _records(self, prefix: str) -> list[str]:
        keys = [f"{prefix}-{k:03d}" for k in range(KEYS)]
        self.ours.records(keys)
        self.hand.create_records(self.ours.collection, keys)
        return keys

    def _answer_records(self, keys: Sequence[str]) -> str:
        """The same-answer baseline's own copy of ``keys``: its collection name."""
        name = f"{self.ours.collection}/answer"
        self.answering.answer_records(name, keys)
        return name

    @property
    def answering(self) -> _answer.Answering:
        hand: Any = self.hand
        return hand  # type: ignore[no-any-return]

    def commit(self) -> Contest:
        keys = self._records("c")
        coll = self.ours.collection
        answer = _answer.commit_side(self.answering, self._answer_records(keys), keys)
        sides = (
            self.ours.commit(keys),
            answer,
            *self.extra_answers(self._answer_records_named(keys, "select"), keys),
            *less(self.hand.commit(coll, keys)),
        )
        return Contest(("collection.commit",), sides, target=self.single_target)

    def _answer_records_named(self, keys: Sequence[str], tail: str) -> str:
        name = f"{self.ours.collection}/{tail}"
        self.answering.answer_records(name, keys)
        return name

    def extra_answers(self, collection: str, keys: Sequence[str]) -> list[Side]:
        """Other same-answer baselines for collection.commit (PostgreSQL: a second SELECT)."""
        return []

    def refused(self) -> Contest:
        """The refusal path: stale and redelivered intents, the current row and why."""
        keys = self._records("r")
        theirs = self._answer_records_named(keys, "refused")
        sides = _answer.refusal_sides(self.ours.coll, self.answering, theirs, keys)
        return Contest((_answer.REFUSED_STALE, _answer.REFUSED_DUPLICATE), sides)

    def check_answers(self) -> list[tuple[str, _answer.Answer, _answer.Answer]]:
        """fencing's answer and the same-answer baseline's, case by case (see _answer)."""
        table = (
            self.user_table(f"bench_answers_{self.suffix}")
            if self.guard_trigger
            else self.fencing_table()
        )

        def rows() -> tuple[fencing.Table, int, int]:
            assert not isinstance(table, Skip)
            return table, KEYS, ANSWER_ROWS

        return _answer.check_answers(
            self.store, self.answering, self.suffix, None if isinstance(table, Skip) else rows
        )

    def table_commit(self) -> Contest | Skip:
        table = self.fencing_table()
        if isinstance(table, Skip):
            return table
        keys = list(range(1, KEYS + 1))
        answer = _answer.table_side(self.answering, [2 * KEYS + k for k in keys])
        sides = (self.ours.table_commit(table, keys), answer, *less(self._hand_table()))
        return Contest(("table.commit",), sides, target=self.single_target)

    def _hand_table(self) -> list[Side]:
        """The hand-written table commit, made once: its rows' versions go on from one
        contest to the next."""
        sides: list[Side] | None = getattr(self, "_hand_table_sides", None)
        if sides is None:
            sides = self._hand_table_sides = self.hand.table_commit(list(range(1, KEYS + 1)))
        return sides

    def guard(self) -> Contest:
        """table.commit on a table guarded by the trigger (``store.guard_table``) beside
        the same commit on a table without it, alternately in one run: the trigger's cost."""
        guarded = self.user_table(f"bench_guard_{self.suffix}")
        self.store.guard_table(guarded.name)
        plain = self.user_table(f"bench_plain_{self.suffix}")
        keys = list(range(1, KEYS + 1))
        ours = replace(
            self.ours.table_commit(guarded, keys),
            method="table.commit(intent, {status, total}) on a table with the guard trigger",
        )
        theirs = replace(
            self.ours.table_commit(plain, keys),
            label=NO_TRIGGER,
            method="the same table.commit on the same table without the trigger",
        )
        return Contest((GUARD_OPERATION,), (ours, theirs))

    def using(self) -> Contest | Skip:
        """table.commit on the caller's connection, committed by the caller, beside the
        store's own table.commit and the hand-written statement, alternately in one run."""
        conn = self.borrowed()
        if isinstance(conn, Skip):
            return conn
        table = self.user_table(f"bench_using_{self.suffix}")
        keys = list(range(1, KEYS + 1))
        half = len(keys) // 2  # the two fencing sides never share a row
        bound = self.ours.bound_table_commit(table, conn, keys[:half])
        own = replace(
            self.ours.table_commit(table, keys[half:]),
            label="fencing, own connections",
            method="store.table(...).commit(intent, state)",
        )
        return Contest((USING_OPERATION,), (bound, own, *self._hand_table()))

    def worktx(self) -> Contest | Skip:
        """A fenced task that ships, books a shipment row and sends the next step through
        the outbox: all in the worker's transaction (``transaction=``, ``then=``) beside
        today's fenced task followed by the row's and the send's own transactions,
        alternately in one run: what the worker transaction costs."""
        joined = self.borrowed()
        if isinstance(joined, Skip):
            return Skip(WORKTX_OPERATION, joined.reason)
        separate = self.borrowed()
        table = self.user_table(f"bench_worktx_{self.suffix}")
        shipments = f"bench_ship_{self.suffix}"
        joined.cursor().execute(f"CREATE TABLE {shipments} (order_id INTEGER, note VARCHAR(40))")
        joined.commit()
        made: list[str] | None = getattr(self, "_tables_made", None)
        if made is not None:
            made.append(shipments)
        self._outbox_tasks.append(f"bench.notify-{self.suffix}")
        keys = list(range(1, KEYS + 1))
        half = len(keys) // 2  # the two sides never share a row
        ours = self.ours.worker_task(table, joined, shipments, keys[:half], joined=True)
        theirs = self.ours.worker_task(table, separate, shipments, keys[half:], joined=False)
        return Contest((WORKTX_OPERATION,), (ours, theirs))

    def apply(self) -> Contest:
        keys = self._records("a")
        answer = _answer.apply_side(self.answering, self._answer_records(keys), keys)
        sides = (
            self.ours.apply(keys),
            answer,
            *less(self.hand.apply(self.ours.collection, keys)),
        )
        return Contest(("apply",), sides, target=self.single_target)

    def commit_many(self) -> Contest:
        keys = self._records("m")
        answer = _answer.many_side(self.answering, self._answer_records(keys), keys)
        sides = (
            self.ours.commit_many(keys),
            answer,
            *less(self.hand.commit_many(self.ours.collection, keys)),
        )
        many = None if self.single_target is None else MANY_TARGET
        return Contest((f"commit_many ({len(keys)}/call)",), sides, per_call=len(keys), target=many)

    def fenced(self) -> Contest:
        keys = self._records("f")
        lease = f"bench-fenced-{self.suffix}"
        answer = _answer.fenced_side(
            self.answering, self._answer_records(keys), keys, f"{lease}/answer"
        )
        sides = (
            self.ours.fenced(keys, lease),
            answer,
            *less(self.hand.fenced(self.ours.collection, keys, lease)),
        )
        return Contest(("commit under lease",), sides, target=self.single_target)

    def lease_cycle(self) -> Contest:
        lease = f"bench-lease-{self.suffix}"
        sides = (self.ours.lease_cycle(lease), *self.hand.lease_cycle(lease))
        stages = ("lease acquire", "lease renew", "lease release")
        return Contest(stages, sides, target=self.single_target)

    def metrics(self) -> Contest | Skip:
        """collection.commit with ``fencing.contrib.prometheus`` enabled (into a registry of
        its own) beside the same commit with nothing enabled, alternately in one run."""
        try:
            from prometheus_client import CollectorRegistry

            from ..contrib import prometheus
        except ImportError:
            return Skip(METRICS_OPERATION, "prometheus_client is not installed (extra prometheus)")
        keys = self._records("p")
        half = len(keys) // 2  # the two sides never share a record
        registry = CollectorRegistry()
        on, off = self.ours.commit(keys[:half]), self.ours.commit(keys[half:])

        def metrics_on(n: int) -> Block:
            block = on.prepare(n)
            prometheus.enable(registry)
            return replace(block, close=lambda: prometheus.disable(registry))

        ours = Side("fencing", "collection.commit(intent, state), metrics enabled", metrics_on)
        theirs = replace(off, label=METRICS_OFF, method="the same commit, nothing enabled")
        return Contest((METRICS_OPERATION,), (ours, theirs))

    def _forget_outbox(self) -> None:
        """Delete the outbox rows the ``worktx`` contest sent (a store of the user's)."""
        if not self._outbox_tasks:
            return
        conn = self.borrowed()
        mark = "?" if _paramstyle(conn) == "qmark" else "%s"
        for task in self._outbox_tasks:
            conn.cursor().execute(f"DELETE FROM fencing_outbox WHERE task = {mark}", (task,))
        conn.commit()

    def close(self) -> None:
        """Delete fencing's records, close the store, drop the rest, close the baseline."""
        try:
            try:
                if self.cleanup_records:
                    self.ours.cleanup()
                    self._forget_outbox()
            finally:
                self.store.close()
        finally:
            try:
                self.drop()
            finally:
                self.hand.close()


def less(sides: Sequence[Side]) -> list[Side]:
    """The older baselines that say only "applied" (no row back, no reason on refusal),
    kept beside the same-answer one and labelled so."""
    return [replace(side, label=side.label + NO_ROW) for side in sides]


def one_check(ok: bool, what: str) -> None:
    """Raise ``BenchFailed`` unless a hand-written step did what it must."""
    if not ok:
        raise BenchFailed(f"hand-written {what} did not apply")


class LeaseCalls(Protocol):
    """A hand-written baseline's lease statements."""

    def acquire(self, name: str, ttl: float) -> int: ...
    def renew(self, name: str, token: int, ttl: float) -> None: ...
    def release(self, name: str, token: int) -> None: ...


def hand_lease_cycle(hand: LeaseCalls, lease_name: str, label: str, method: str) -> list[Side]:
    """Acquire, renew and release by hand, the same cycle fencing's side runs."""

    def prepare(n: int) -> Block:
        tokens: list[int] = []

        def acquire(i: int) -> None:
            tokens.append(hand.acquire(lease_name, LEASE_TTL))

        def renew(i: int) -> None:
            hand.renew(lease_name, tokens[0], LEASE_TTL)

        def release(i: int) -> None:
            hand.release(lease_name, tokens.pop())

        return Block([acquire, renew, release])

    return [Side(label, method, prepare)]
