"""A backend's flow run on an application's own connection, in its transaction (a
migration's): ``contrib.alembic`` on SQLAlchemy's, ``contrib.django.operations`` on
Django's. PostgreSQL's queries one after the other (fencing's tables in ``schema``),
MySQL's batches one statement at a time (such a connection runs no multi-statement
batch), SQLite's transaction bodies on the connection itself (a body never begins,
commits or rolls back)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["Query", "runner"]

#: runs one statement (the driver's placeholders) and answers its column names (empty
#: for no result set), its rows and its row count
Query = Callable[[str, Any], tuple[tuple[str, ...], list[tuple[Any, ...]], int]]


def runner(
    dialect: str,
    query: Query | None = None,
    *,
    schema: str | None = None,
    sqlite: Callable[[], Any] | None = None,
) -> Callable[[Any], Any]:
    """The step runner of ``drive(flow, ...)`` for ``dialect``'s flows: ``query`` runs
    PostgreSQL's and MySQL's statements; ``sqlite`` gives what a SQLite body runs on
    (``execute(sql, params)`` returning a cursor)."""
    if dialect in ("postgresql", "mysql"):
        if query is None:
            raise TypeError(f"a {dialect} runner needs query=")
        return _postgres(query, schema) if dialect == "postgresql" else _mysql(query)
    if sqlite is None:
        raise TypeError("a SQLite runner needs sqlite=")
    opened = sqlite

    def lite(step: Any) -> Any:
        return step.body(opened(), time.time())

    return lite


def _postgres(query: Query, schema: str | None) -> Callable[[Any], Any]:
    from ..backends.postgres.statements import qualified
    from ..backends.postgres.steps import Answer
    from ..backends.postgres.steps import Query as Statement

    def one(step: Statement) -> Answer:
        return Answer(*query(qualified(step.text, schema), step.params))

    def run(step: Any) -> Any:
        return one(step) if isinstance(step, Statement) else [one(q) for q in step.queries]

    return run


def _mysql(query: Query) -> Callable[[Any], Any]:
    from ..backends.mysql.steps import Result, statements

    def run(step: Any) -> Any:
        found = []
        for sql, params in statements(step):
            names, rows, count = query(sql, params)
            found.append(Result(names, tuple(rows), count))
        return found

    return run
