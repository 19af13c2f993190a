"""PostgreSQL's steps: what a flow asks its driver to run (a ``Query`` or a ``Pipeline``),
and what it gets back (an ``Answer``, or a list of them for a pipeline)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from ..._flow import Flow
from .errors import Disconnected

__all__ = ["Answer", "Pipeline", "Query", "Step", "answer", "has_rows", "pruning", "read_only"]


@dataclass(frozen=True, slots=True)
class Query:
    """One statement on its own (autocommit): its own transaction, one round trip."""

    text: str
    params: Mapping[str, Any] = field(default_factory=dict)
    names: bool = False  # the flow reads the answer's column names


@dataclass(frozen=True, slots=True)
class Pipeline:
    """Statements sent at once with one Sync: one round trip, one implicit transaction."""

    queries: tuple[Query, ...]


@dataclass(frozen=True, slots=True)
class Answer:
    """A statement's result: column names, rows and row count."""

    names: tuple[str, ...]
    rows: list[tuple[Any, ...]]
    rowcount: int


#: A flow yields steps, receives an ``Answer`` (``list[Answer]`` for a ``Pipeline``), may
#: receive a translated error thrown back in, and returns the operation's result.
Step: TypeAlias = Query | Pipeline


def has_rows(cursor: Any) -> bool:
    """Whether a psycopg cursor's statement returned a result set (``SELECT``, ``RETURNING``)."""
    result = cursor.pgresult
    return result is not None and bool(result.nfields)


def answer(query: Query, cursor: Any, rows: list[tuple[Any, ...]]) -> Answer:
    """A statement's answer from its psycopg cursor; column names only when the flow
    needs them (building ``cursor.description`` costs more than the rest of the answer)."""
    names: tuple[str, ...] = ()
    if query.names:
        result = cursor.pgresult
        names = tuple(bytes(result.fname(i)).decode() for i in range(result.nfields))
    return Answer(names, rows, cursor.rowcount)


def read_only(query: Query) -> Flow[Answer]:
    """A statement safe to run again (a read, or an idempotent write): once more, on a
    fresh connection, if the first was lost under it."""
    try:
        result: Answer = yield query
    except Disconnected:
        result = yield query
    return result


def pruning(text: str, older_than: float, start: Any = 0.0) -> Callable[[int], Flow[int]]:
    """The batches of a prune (``_contract.prune_batches``) of ``text``
    (``statements.prune_batch``, ``statements.PRUNE_EFFECTS``): each a statement on its
    own (its own transaction), starting where the one before it ended (``start`` for the
    first: a time, or a key); how many rows each deleted. Safe to run again: the rows it
    deleted are gone either way."""
    age = float(older_than)
    after = start

    def batch(limit: int) -> Flow[int]:
        nonlocal after
        params = {"after": after, "age": age, "limit": limit}
        found = yield from read_only(Query(text, params))
        count, last = found.rows[0]
        if last is not None:
            after = last
        return int(count)

    return batch
