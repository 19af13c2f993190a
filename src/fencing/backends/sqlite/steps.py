"""SQLite's step: ``Txn``, a function of a connection run in one transaction."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from ..._flow import Flow
from ..._values import slot_setters

__all__ = ["PRUNE_PAUSE", "Txn", "keyed_pruning", "one", "pruning", "txn"]

T = TypeVar("T")

#: A prune's pause between batches: the store's lock is not handed over in turn (a
#: thread letting it go takes it straight back before a waiting one wakes), so each batch
#: leaves it free this long (10^6 ids: 200 batches, 0.2 s in all; measured on a loaded
#: 2-core machine, the commits meanwhile had a p50 of 0.27 ms instead of 5 ms).
PRUNE_PAUSE: Final = 0.001


@dataclass(frozen=True, slots=True, init=False)
class Txn:
    """A step: ``body(conn, now)`` in one transaction; ``now`` is the store's clock once
    it began (or, with ``begin=False``, when the body ran). ``write=False`` reads in a
    deferred transaction; ``begin=False`` runs a body of one statement, which needs no
    transaction of its own. ``pause``: seconds the store's driver leaves its lock free
    after the transaction, before the flow goes on (a prune's batch: a commit waiting
    for the lock takes it in between; a view on the caller's connection has no lock)."""

    body: Callable[[sqlite3.Connection, float], Any]
    write: bool = True
    begin: bool = True
    pause: float = 0.0

    def __init__(
        self,
        body: Callable[[sqlite3.Connection, float], Any],
        write: bool = True,
        begin: bool = True,
        pause: float = 0.0,
    ) -> None:
        # the dataclass's own, without its per-field lookups: one is made per commit
        _txn_body(self, body)
        _txn_write(self, write)
        _txn_begin(self, begin)
        _txn_pause(self, pause)


_txn_body, _txn_write, _txn_begin, _txn_pause = slot_setters(Txn)


def txn(
    body: Callable[[sqlite3.Connection, float], T], *, write: bool = True, begin: bool = True
) -> Flow[T]:
    """The flow of one ``Txn`` step: its body's result."""
    result: T = yield Txn(body, write, begin)
    return result


def pruning(text: str, older_than: float) -> Callable[[int], Flow[int]]:
    """One batch of a prune (``_contract.prune_batches``): the DELETE ``text`` of the
    cutoff (``older_than`` seconds before the store's clock) and the limit, in a write
    transaction of its own, then ``PRUNE_PAUSE``; how many rows it deleted."""

    def batch(limit: int) -> Flow[int]:
        def body(conn: sqlite3.Connection, now: float) -> int:
            return int(conn.execute(text, (now - older_than, limit)).rowcount)

        gone: int = yield Txn(body, pause=PRUNE_PAUSE)
        return gone

    return batch


def keyed_pruning(text: str, older_than: float) -> Callable[[int], Flow[int]]:
    """The batches of a prune in primary-key order (``statements.PRUNE_EFFECTS``: the
    named parameters ``after``, ``cutoff`` and ``limit``; it returns the keys it
    deleted): each in a write transaction of its own, then ``PRUNE_PAUSE``, starting
    after the last key of the batch before it (rows the prune keeps are not read again);
    how many rows each deleted."""
    after = ""

    def batch(limit: int) -> Flow[int]:
        nonlocal after

        def body(conn: sqlite3.Connection, now: float) -> list[str]:
            params = {"after": after, "cutoff": now - older_than, "limit": limit}
            return [row[0] for row in conn.execute(text, params)]

        keys: list[str] = yield Txn(body, pause=PRUNE_PAUSE)
        if keys:  # (committed: the next batch starts after them)
            after = max(keys)
        return len(keys)

    return batch


def one(step: Txn) -> Flow[Any]:
    """The flow of one step made beforehand: its body's result."""
    result = yield step
    return result
