"""The step MySQL's flows yield, ``Batch``: statements sent in one round trip (a
multi-statement query), answered by one ``Result`` per statement. ``Script`` gathers
statements, and their parameters in order, into one batch.

A flow does not write its transaction's framing itself: a batch says that it ``begin``s
the flow's transaction and/or ``end``s it, and the driver frames it (``framed``) as the
connection needs: ``START TRANSACTION`` ... ``COMMIT`` on the store's own connections,
``SAVEPOINT fencing`` ... ``RELEASE SAVEPOINT fencing`` inside a caller's transaction
(``bound``). The framing's results are not the flow's (``unframed``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from ..._flow import Flow
from .restart import restarts_on_deadlock

__all__ = [
    "SEPARATOR",
    "Batch",
    "Result",
    "Script",
    "framed",
    "one",
    "pruning",
    "statements",
    "unframed",
]

#: What joins a batch's statements (``Script.batch``); ``statements`` splits on it.
SEPARATOR: Final = ";\n"


@dataclass(frozen=True, slots=True)
class Batch:
    """Statements sent in one round trip; ``params`` fill their ``%s`` in order."""

    sql: str
    params: tuple[Any, ...] | None
    #: whether it begins the flow's transaction, and whether it ends it (commits)
    begin: bool = False
    end: bool = False


@dataclass(frozen=True, slots=True)
class Result:
    """One statement's result: column names and rows (empty for non-SELECT), row count."""

    names: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]
    affected: int


class Script:
    """Statements being gathered into one batch; ``add`` returns a statement's index."""

    __slots__ = ("begin", "count", "params", "parts", "size")

    def __init__(self, *statements: str, begin: bool = False) -> None:
        self.begin = begin  # the batch begins the flow's transaction
        self.parts: list[str] = list(statements)
        self.params: list[Any] = []
        self.count = len(statements)
        self.size = 0

    def add(self, sql: str, *params: Any, statements: int = 1) -> int:
        """Append ``statements`` statements (joined in ``sql``); the index of the first."""
        self.parts.append(sql)
        self.params.extend(params)
        self.size += len(sql) + sum(len(p) for p in params if isinstance(p, str))
        self.count += statements
        return self.count - statements

    def batch(self, *, end: bool = False) -> Batch:
        """The statements gathered; ``end``: the batch ends (commits) the transaction."""
        return Batch(SEPARATOR.join(self.parts), tuple(self.params) or None, self.begin, end)


def framed(batch: Batch, begin: str, end: str) -> Batch:
    """``batch`` with its transaction's framing: ``begin`` first if it begins the
    transaction, ``end`` last if it ends it (neither has parameters)."""
    if not (batch.begin or batch.end):
        return batch
    parts = [begin] if batch.begin else []
    if batch.sql:
        parts.append(batch.sql)
    if batch.end:
        parts.append(end)
    return Batch(SEPARATOR.join(parts), batch.params)


def unframed(batch: Batch, results: list[Result], begin: int = 1, end: int = 1) -> list[Result]:
    """The results of ``batch``'s own statements, without those of its framing (``begin``
    and ``end``: how many statements each side of the framing has)."""
    if not (batch.begin or batch.end):
        return results
    return results[begin if batch.begin else 0 : len(results) - end if batch.end else None]


def one(sql: str, *params: Any) -> Batch:
    """A batch of one statement."""
    return Batch(sql, params or None)


def statements(batch: Batch) -> list[tuple[str, tuple[Any, ...]]]:
    """A batch's statements one by one, each with its parameters: for a connection that
    runs one statement at a time (an application's own, say in an Alembic migration).
    Only for batches whose statements hold no ``SEPARATOR`` and no literal ``%``, such as
    ``schema.migrate``'s."""
    params = list(batch.params or ())
    found = []
    for sql in batch.sql.split(SEPARATOR):
        count = sql.count("%s")
        found.append((sql, tuple(params[:count])))
        del params[:count]
    return found


def pruning(
    text: str, older_than: float, start: Any = 0, ages: int = 1
) -> Callable[[int], Flow[int]]:
    """The batches of a prune (``_contract.prune_batches``) of ``text``
    (``statements.prune_batch``, ``statements.PRUNE_EFFECTS``): each a batch on its own
    (autocommit: its own transaction), run again after a deadlock, starting where the
    one before it ended (``start`` for the first: a time, or a key); how many rows each
    deleted. Each of its two statements takes the position, the age ``ages`` times (as
    often as its predicate has the cutoff) and the limit."""
    age = float(older_than)
    after: Any = start

    @restarts_on_deadlock
    def batch(limit: int) -> Flow[int]:
        nonlocal after
        params = (after, *(age,) * ages, limit)
        results: list[Result] = yield one(text, *params, *params)
        last = results[-1].rows[0][0]
        if last is not None:
            after = last
        return results[-2].affected

    return batch
