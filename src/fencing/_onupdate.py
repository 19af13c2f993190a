"""A SQLAlchemy mapped class's update rules, applied to a fenced commit as the ORM's unit
of work applies them to an UPDATE it flushes: each column's ``onupdate``, for the
columns a commit's state leaves out (docs/sqlalchemy.md).

* a scalar is written as is, and a Python callable is called (with no argument: one that
  takes SQLAlchemy's execution context is refused, fencing has none to give it), each
  bound as the mapped column binds (``_checks.bind_mapped``);
* a SQL expression (``func.now()``, ``text(...)``) is rendered by SQLAlchemy in the
  store's dialect, literal values inlined, and written into the commit's own UPDATE
  (``CommitRequest.sql_values``): the database evaluates it, in the statement that
  commits, as the ORM's UPDATE does. It is the application's model code, never input.
* ``server_onupdate`` (a trigger, ``ON UPDATE CURRENT_TIMESTAMP``) is the database's:
  nothing to do.

SQLAlchemy is imported only for a mapped class or ``Table``; this module does no I/O.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ._errors import ConfigurationError

__all__ = ["Updates", "mapped_updates"]

#: SQLAlchemy's dialect module for each SQL store's scheme (its driver's paramstyle:
#: a ``%`` is doubled for psycopg and PyMySQL, as fencing's statements need).
_DIALECTS: dict[str, str] = {
    "postgresql": "sqlalchemy.dialects.postgresql.psycopg",
    "mysql": "sqlalchemy.dialects.mysql.pymysql",
    "sqlite": "sqlalchemy.dialects.sqlite.pysqlite",
}

Producer = Callable[[], Any]


@dataclass(frozen=True, slots=True)
class Updates:
    """A mapped table's ``onupdate`` rules, on one store: per column, a producer of its
    Python value, or its SQL in the store's dialect (None: a store without SQL, whose
    commit is refused unless its state sets the column) and the expression as written."""

    python: tuple[tuple[str, Producer], ...]
    sql: tuple[tuple[str, str | None, str], ...]
    scheme: str
    table: str

    def fill(
        self, state: Mapping[str, Any]
    ) -> tuple[Mapping[str, Any], tuple[tuple[str, str], ...]]:
        """``state`` with the Python rules' values of the columns it leaves out, and the
        SQL of those it leaves to the database, as ``(column, sql)``."""
        added = {column: make() for column, make in self.python if column not in state}
        sql: list[tuple[str, str]] = []
        for column, text, shown in self.sql:
            if column in state:
                continue
            if text is None:
                raise ConfigurationError(
                    f"table {self.table!r}: column {column!r} is updated by the SQL"
                    f" expression {shown!r}, which a {self.scheme} store cannot evaluate:"
                    " set the column in the state"
                )
            sql.append((column, text))
        return ({**state, **added} if added else state), tuple(sql)


def mapped_updates(obj: object, scheme: str, managed: tuple[str | None, ...]) -> Updates | None:
    """The ``onupdate`` rules of a SQLAlchemy mapped class or ``Table`` on a store of
    ``scheme`` (None: it has none, or it is not SQLAlchemy's); the ``managed`` columns
    (key, version) are fencing's and keep no rule."""
    table: Any = getattr(obj, "__table__", obj)
    if not type(table).__module__.startswith("sqlalchemy."):
        return None
    name = f"{table.schema}.{table.name}" if table.schema else table.name
    python: list[tuple[str, Producer]] = []
    sql: list[tuple[str, str | None, str]] = []
    for column in table.columns:
        rule = column.onupdate
        if rule is None or column.name in managed:
            continue
        if getattr(rule, "is_scalar", False):
            python.append((column.name, _constant(rule.arg)))
        elif getattr(rule, "is_callable", False):
            python.append((column.name, _called(rule, name, column.name)))
        elif getattr(rule, "is_clause_element", False):
            sql.append((column.name, _rendered(rule.arg, scheme, name, column.name), str(rule.arg)))
        else:  # pragma: no cover - SQLAlchemy has no other kind of onupdate
            raise ConfigurationError(f"table {name!r}: column {column.name!r}: {rule!r}")
    if not python and not sql:
        return None
    return Updates(tuple(python), tuple(sql), scheme, name)


def _constant(value: Any) -> Producer:
    return lambda: value


def _called(rule: Any, table: str, column: str) -> Producer:
    """The callable SQLAlchemy wrapped to take an execution context (``rule.arg``),
    called with none; refused if the callable as given takes it."""
    if rule.arg is getattr(rule, "_fn", None):  # not wrapped: it takes the context

        def refuse() -> Any:
            raise ConfigurationError(
                f"table {table!r}: column {column!r}'s onupdate {rule.arg!r} takes"
                " SQLAlchemy's execution context, which a fenced commit has not: make it"
                " a callable of no argument or a SQL expression, or set the column"
            )

        return refuse
    wrapped = rule.arg
    return lambda: wrapped(None)


def _rendered(expression: Any, scheme: str, table: str, column: str) -> str | None:
    """``expression`` as SQL of ``scheme``'s dialect, its literal values inlined."""
    module = _DIALECTS.get(scheme)
    if module is None:
        return None
    dialect = importlib.import_module(module).dialect()
    try:
        text = str(expression.compile(dialect=dialect, compile_kwargs={"literal_binds": True}))
    except Exception as exc:  # SQLAlchemy's CompileError, a bind without a literal form...
        raise ConfigurationError(
            f"table {table!r}: column {column!r}'s onupdate {expression} has no SQL of its"
            f" own on {scheme}: {exc}"
        ) from None
    if ";" in text:
        raise ConfigurationError(
            f"table {table!r}: column {column!r}'s onupdate renders as {text!r}: one"
            " expression, without a ';'"
        )
    return text
