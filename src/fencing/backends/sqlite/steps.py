"""SQLite's step: ``Txn``, a function of a connection run in one transaction."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ..._flow import Flow
from ..._values import slot_setters

__all__ = ["Txn", "one", "txn"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True, init=False)
class Txn:
    """A step: ``body(conn, now)`` in one transaction; ``now`` is the store's clock once
    it began (or, with ``begin=False``, when the body ran). ``write=False`` reads in a
    deferred transaction; ``begin=False`` runs a body of one statement, which needs no
    transaction of its own."""

    body: Callable[[sqlite3.Connection, float], Any]
    write: bool = True
    begin: bool = True

    def __init__(
        self,
        body: Callable[[sqlite3.Connection, float], Any],
        write: bool = True,
        begin: bool = True,
    ) -> None:
        # the dataclass's own, without its per-field lookups: one is made per commit
        _txn_body(self, body)
        _txn_write(self, write)
        _txn_begin(self, begin)


_txn_body, _txn_write, _txn_begin = slot_setters(Txn)


def txn(
    body: Callable[[sqlite3.Connection, float], T], *, write: bool = True, begin: bool = True
) -> Flow[T]:
    """The flow of one ``Txn`` step: its body's result."""
    result: T = yield Txn(body, write, begin)
    return result


def one(step: Txn) -> Flow[Any]:
    """The flow of one step made beforehand: its body's result."""
    result = yield step
    return result
