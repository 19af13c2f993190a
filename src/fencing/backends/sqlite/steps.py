"""SQLite's step: ``Txn``, a function of a connection run in one transaction."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ..._flow import Flow

__all__ = ["Txn", "pruning", "txn"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Txn:
    """A step: ``body(conn, now)`` in one transaction; ``now`` is the store's clock once
    it began (or, with ``begin=False``, when the body ran). ``write=False`` reads in a
    deferred transaction; ``begin=False`` runs a body of one statement, which needs no
    transaction of its own."""

    body: Callable[[sqlite3.Connection, float], Any]
    write: bool = True
    begin: bool = True


def txn(
    body: Callable[[sqlite3.Connection, float], T], *, write: bool = True, begin: bool = True
) -> Flow[T]:
    """The flow of one ``Txn`` step: its body's result."""
    result: T = yield Txn(body, write, begin)
    return result


def pruning(text: str, older_than: float) -> Callable[[int], Flow[int]]:
    """One batch of a prune (``_contract.prune_batches``): the DELETE ``text`` of the
    cutoff (``older_than`` seconds before the store's clock) and the limit, in a write
    transaction of its own; how many rows it deleted."""

    def batch(limit: int) -> Flow[int]:
        return txn(lambda conn, now: int(conn.execute(text, (now - older_than, limit)).rowcount))

    return batch
