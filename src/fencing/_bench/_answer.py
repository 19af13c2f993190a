"""Baselines that give the same answer as fencing, and the refusal path.

fencing's ``Committed`` carries the record at its new version, and a refusal carries the
current record and why (``Stale`` told apart from ``Duplicate``). A hand-written
baseline that only reports "applied" or "not applied" returns less, and is cheaper for
it. Each store's hand-written code implements :class:`Answering`: every call returns
an :data:`Answer`, ``(kind, version, state)``, read back in the same transaction or
round trip, so that both sides of a contest do the same work.

:func:`check_answers` runs fencing and the store's answering baseline on the same
inputs (a commit, a redelivery, a stale intent, a table row, a fenced commit, a batch)
and lists every answer each gave: equal answers are what makes a ratio fair.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol

import fencing

from .._values import Intent, Record
from ._harness import BenchFailed, Block, Side

__all__ = [
    "ANSWERS",
    "Answer",
    "Answering",
    "check_answers",
    "of_outcome",
]

#: ``(kind, version, state)``: "committed" with the row at its new version, or
#: "stale" / "duplicate" with the current row.
Answer = tuple[str, int, dict[str, Any]]

#: The label of every baseline that gives the same answer as fencing.
ANSWERS: Final = "same answer"
#: Stage names of the refusal contest.
REFUSED_STALE: Final = "refused: stale intent"
REFUSED_DUPLICATE: Final = "refused: redelivered intent"
#: The user table's columns, as fencing's table record carries them.
TABLE_COLUMNS: Final = ("status", "total", "note")


def of_outcome(outcome: Any) -> Answer:
    """fencing's outcome as an :data:`Answer`."""
    current = outcome.current
    if current is None:
        return (outcome.kind, 0, {})
    return (outcome.kind, current.version, dict(current.state))


def expect(answer: Answer, kind: str, what: str) -> None:
    if answer[0] != kind:
        raise BenchFailed(f"{what}: expected {kind}, got {answer!r}")


class Answering(Protocol):
    """A store's hand-written code that answers as fencing does."""

    #: what each answering call runs, for the reader: commit, table, apply, many, fenced
    answer_methods: dict[str, str]

    def answer_records(self, collection: str, keys: Sequence[str]) -> None: ...
    def answer_commit(
        self, collection: str, key: str, version: int, state: dict[str, Any], intent_id: str
    ) -> Answer: ...
    def answer_read(self, collection: str, key: str) -> tuple[int, dict[str, Any]]: ...
    def answer_table(
        self, key: int, version: int, status: str, total: int, intent_id: str
    ) -> Answer: ...
    def answer_fenced(
        self,
        collection: str,
        key: str,
        version: int,
        state: dict[str, Any],
        intent_id: str,
        lease_name: str,
        token: int,
    ) -> Answer: ...
    def answer_many(
        self, collection: str, items: Sequence[tuple[str, str, int, dict[str, Any]]]
    ) -> list[Answer]: ...
    def acquire(self, name: str, ttl: float) -> int: ...
    def release(self, name: str, token: int) -> None: ...


def _state(i: int) -> dict[str, Any]:
    return {"status": "shipped", "n": i}


def _decide(state: dict[str, Any]) -> dict[str, Any]:
    return {"status": "shipped", "n": state["n"] + 1}


class _Cursor:
    def __init__(self, keys: Sequence[Any]) -> None:
        self.keys = list(keys)
        self.versions = [1] * len(self.keys)
        self.next = 0

    def take(self, n: int) -> list[tuple[Any, int]]:
        out = []
        for _ in range(n):
            k = self.next
            out.append((self.keys[k], self.versions[k]))
            self.versions[k] += 1
            self.next = (k + 1) % len(self.keys)
        return out


def commit_side(hand: Answering, collection: str, keys: Sequence[str]) -> Side:
    cursor, commit = _Cursor(keys), hand.answer_commit

    def prepare(n: int) -> Block:
        items = [(k, v, _state(i), fencing_id()) for i, (k, v) in enumerate(cursor.take(n))]

        def op(i: int) -> None:
            key, version, state, intent_id = items[i]
            expect(commit(collection, key, version, state, intent_id), "committed", "commit")

        return Block([op])

    return Side(ANSWERS, hand.answer_methods["commit"], prepare)


def table_side(hand: Answering, keys: Sequence[int]) -> Side:
    cursor, commit = _Cursor(keys), hand.answer_table

    def prepare(n: int) -> Block:
        items = [(k, v, i, fencing_id()) for i, (k, v) in enumerate(cursor.take(n))]

        def op(i: int) -> None:
            key, version, total, intent_id = items[i]
            expect(commit(key, version, "shipped", total, intent_id), "committed", "table")

        return Block([op])

    return Side(ANSWERS, hand.answer_methods["table"], prepare)


def apply_side(hand: Answering, collection: str, keys: Sequence[str]) -> Side:
    cursor, commit, read = _Cursor(keys), hand.answer_commit, hand.answer_read

    def prepare(n: int) -> Block:
        items = [(k, v, fencing_id()) for k, v in cursor.take(n)]

        def op(i: int) -> None:
            key, version, intent_id = items[i]
            at, state = read(collection, key)
            if at != version:
                raise BenchFailed(f"apply read {key} at {at}, expected {version}")
            expect(commit(collection, key, at, _decide(state), intent_id), "committed", "apply")

        return Block([op])

    return Side(ANSWERS, hand.answer_methods["apply"], prepare)


def many_side(hand: Answering, collection: str, keys: Sequence[str]) -> Side:
    cursor, many, batch = _Cursor(keys), hand.answer_many, len(keys)

    def prepare(n: int) -> Block:
        calls = [
            [(fencing_id(), k, v, _state(j)) for j, (k, v) in enumerate(cursor.take(batch))]
            for _ in range(n)
        ]

        def op(i: int) -> None:
            for answer in many(collection, calls[i]):
                expect(answer, "committed", "commit_many")

        return Block([op])

    return Side(ANSWERS, hand.answer_methods["many"], prepare)


def fenced_side(hand: Answering, collection: str, keys: Sequence[str], lease_name: str) -> Side:
    cursor, commit = _Cursor(keys), hand.answer_fenced

    def prepare(n: int) -> Block:
        items = [(k, v, _state(i), fencing_id()) for i, (k, v) in enumerate(cursor.take(n))]
        token = hand.acquire(lease_name, 3600.0)

        def op(i: int) -> None:
            key, version, state, intent_id = items[i]
            answer = commit(collection, key, version, state, intent_id, lease_name, token)
            expect(answer, "committed", "fenced commit")

        return Block([op], close=lambda: hand.release(lease_name, token))

    return Side(ANSWERS, hand.answer_methods["fenced"], prepare)


def fencing_id() -> str:
    from .._values import new_intent_id

    return new_intent_id()


# -- the refusal path ------------------------------------------------------------------------
def refusal_sides(
    coll: fencing.Collection, hand: Answering, hand_collection: str, keys: Sequence[str]
) -> tuple[Side, Side]:
    """Stale and redelivered intents, refused again and again: every record was committed
    once (version 2) by the intent the duplicates redeliver; stale intents are new ids
    decided at version 1. Both sides answer the current row and why."""
    ours_first: list[Intent] = []
    theirs_first: list[str] = []
    for i, key in enumerate(keys):
        intent = Intent(fencing_id(), coll.name, key, 1, "ship")
        outcome = coll.commit(intent, _state(i))
        if not outcome.committed:
            raise BenchFailed(f"the refusal contest's setup did not commit: {outcome!r}")
        ours_first.append(intent)
        theirs_first.append(fencing_id())
        expect(
            hand.answer_commit(hand_collection, key, 1, _state(i), theirs_first[-1]),
            "committed",
            "the refusal contest's setup",
        )
    size, commit, answer = len(keys), coll.commit, hand.answer_commit

    def ours(n: int) -> Block:
        stale = [Intent(fencing_id(), coll.name, keys[i % size], 1, "ship") for i in range(n)]

        def refuse_stale(i: int) -> None:
            expect(of_outcome(commit(stale[i], _state(i))), "stale", "stale intent")

        def refuse_duplicate(i: int) -> None:
            again = ours_first[i % size]
            expect(of_outcome(commit(again, _state(i % size))), "duplicate", "redelivery")

        return Block([refuse_stale, refuse_duplicate])

    def theirs(n: int) -> Block:
        stale = [fencing_id() for _ in range(n)]

        def refuse_stale(i: int) -> None:
            got = answer(hand_collection, keys[i % size], 1, _state(i), stale[i])
            expect(got, "stale", "stale intent")

        def refuse_duplicate(i: int) -> None:
            k = i % size
            got = answer(hand_collection, keys[k], 1, _state(k), theirs_first[k])
            expect(got, "duplicate", "redelivery")

        return Block([refuse_stale, refuse_duplicate])

    ours_side = Side("fencing", "collection.commit(intent, state) -> Stale / Duplicate", ours)
    return ours_side, Side(ANSWERS, hand.answer_methods["commit"], theirs)


# -- the check: each baseline really returns what fencing returns ----------------------------
def check_answers(
    store: fencing.Store,
    hand: Answering,
    prefix: str,
    table: Callable[[], tuple[fencing.Table, int, int]] | None,
) -> list[tuple[str, Answer, Answer]]:
    """``(case, fencing's answer, the baseline's)`` for every case, on fresh records.

    ``table()`` gives a fencing table and two row ids (one on each side) at version 1,
    or ``table`` is None where the store has no table contest.
    """
    out: list[tuple[str, Answer, Answer]] = []
    coll = store.collection(f"bench-answers-{prefix}")
    theirs = f"bench-answers-{prefix}/hand"
    keys = ["a", "b", "c", "d"]
    for key in keys:
        coll.create(key, {"status": "new", "n": 0})
    hand.answer_records(theirs, keys)

    def both(case: str, ours: Any, hand_answer: Answer) -> None:
        out.append((case, of_outcome(ours), hand_answer))

    first, hand_first = Intent(fencing_id(), coll.name, "a", 1, "ship"), fencing_id()
    both(
        "commit",
        coll.commit(first, _state(7)),
        hand.answer_commit(theirs, "a", 1, _state(7), hand_first),
    )
    both(
        "redelivered",
        coll.commit(first, _state(7)),
        hand.answer_commit(theirs, "a", 1, _state(7), hand_first),
    )
    both(
        "stale",
        coll.commit(Intent(fencing_id(), coll.name, "a", 1, "ship"), _state(8)),
        hand.answer_commit(theirs, "a", 1, _state(8), fencing_id()),
    )

    def decide(record: Record) -> dict[str, Any]:
        return _decide(dict(record.state))

    at, state = hand.answer_read(theirs, "b")
    both(
        "apply",
        coll.apply(Intent(fencing_id(), coll.name, "b", 1, "ship"), decide),
        hand.answer_commit(theirs, "b", at, _decide(state), fencing_id()),
    )
    lease_ours = store.acquire(f"bench-answers-{prefix}", owner="bench", ttl=60.0)
    token = hand.acquire(f"bench-answers-{prefix}/hand", 60.0)
    try:
        both(
            "fenced commit",
            coll.commit(
                Intent(fencing_id(), coll.name, "c", 1, "ship"), _state(3), lease=lease_ours
            ),
            hand.answer_fenced(
                theirs, "c", 1, _state(3), fencing_id(), f"bench-answers-{prefix}/hand", token
            ),
        )
    finally:
        lease_ours.release()
        hand.release(f"bench-answers-{prefix}/hand", token)
    batch_ours = [
        (Intent(fencing_id(), coll.name, k, v, "ship"), _state(j))
        for j, (k, v) in enumerate([("d", 1), ("a", 1), ("b", 2)])
    ]
    batch_theirs = [
        (fencing_id(), k, v, _state(j)) for j, (k, v) in enumerate([("d", 1), ("a", 1), ("b", 2)])
    ]
    for j, (ours_one, theirs_one) in enumerate(
        zip(
            coll.commit_many(batch_ours),
            hand.answer_many(theirs, batch_theirs),
            strict=True,
        )
    ):
        out.append((f"commit_many item {j}", of_outcome(ours_one), theirs_one))
    for key in keys:  # a user's own store keeps nothing of the check
        coll.delete(key)
    if table is not None:
        user_table, our_row, their_row = table()
        both(
            "table.commit",
            user_table.commit(
                Intent(fencing_id(), user_table.name, our_row, 1, "ship", kind="table"),
                {"status": "shipped", "total": 5},
            ),
            hand.answer_table(their_row, 1, "shipped", 5, fencing_id()),
        )
    return out
