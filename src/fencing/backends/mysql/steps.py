"""The step MySQL's flows yield, ``Batch``: statements sent in one round trip (a
multi-statement query), answered by one ``Result`` per statement. ``Script`` gathers
statements, and their parameters in order, into one batch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

__all__ = ["SEPARATOR", "Batch", "Result", "Script", "one", "statements"]

#: What joins a batch's statements (``Script.batch``); ``statements`` splits on it.
SEPARATOR: Final = ";\n"


@dataclass(frozen=True, slots=True)
class Batch:
    """Statements sent in one round trip; ``params`` fill their ``%s`` in order."""

    sql: str
    params: tuple[Any, ...] | None


@dataclass(frozen=True, slots=True)
class Result:
    """One statement's result: column names and rows (empty for non-SELECT), row count."""

    names: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]
    affected: int


class Script:
    """Statements being gathered into one batch; ``add`` returns a statement's index."""

    __slots__ = ("count", "params", "parts", "size")

    def __init__(self, *statements: str) -> None:
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

    def batch(self) -> Batch:
        return Batch(SEPARATOR.join(self.parts), tuple(self.params) or None)


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
