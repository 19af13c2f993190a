"""A test-time audit of blind writers (``docs/guard.md``): every UPDATE a test's code sends
to a watched table is read, and one that does not move the table's version is a
:class:`BlindWrite`, named with its statement and the test.

An UPDATE *moves the version* when it sets the version column from itself
(``version = version + 1``: fencing's commits, ``FencedModel.save()``,
``FencedQuerySet.update()``) or sets it while its WHERE clause checks the version (a
compare-and-set: SQLAlchemy's ``version_id_col`` flush, ``SET version = ? WHERE id = ?
AND version = ?``). Anything else is blind: an UPDATE that leaves the version out (a
plain ``save()`` with ``update_fields``, ``QuerySet.update()``, a bulk Core ``UPDATE``)
or that sets it from the application without checking it (a full-row ``save()`` of a
stale instance). INSERT and DELETE are not read.

The statements are taken where they are sent: SQLAlchemy (``before_cursor_execute`` on
every ``Engine``, async engines' too), Django (an ``execute_wrapper`` on each connection
of this thread), an ``sqlite3`` connection (its trace callback: read after the fact), or
any text given to :meth:`WriteAudit.check`. Other raw drivers (psycopg, PyMySQL) have no
hook to take: feed their statements to ``check``. The reading is of the SQL text, not a
parser: it knows the UPDATEs ORMs and hand-written code send (one table, ``SET ...
WHERE ...``, in a CTE too); a multi-table ``UPDATE a JOIN b`` is not read.
"""

from __future__ import annotations

import re
import sqlite3 as _sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

__all__ = ["BlindWrite", "BlindWriteError", "WriteAudit", "blind_updates"]

_IDENT = r'(?:"[^"]+"|`[^`]+`|\[[^\]]+\]|[A-Za-z_][\w$]*)'
_UPDATE = re.compile(
    rf"\bUPDATE\s+(?:ONLY\s+|OR\s+\w+\s+)?(?!SET\b)({_IDENT}(?:\s*\.\s*{_IDENT})*)"
    rf"\s*(?:(?:AS\s+)?(?!SET\b){_IDENT}\s+)?SET\b",
    re.IGNORECASE,
)
_SET_ENDS = ("WHERE", "FROM", "RETURNING", "ORDER", "LIMIT")
_WHERE_ENDS = ("RETURNING", "ORDER", "LIMIT")


class BlindWriteError(AssertionError):
    """A test's code wrote a watched table without moving its version (the audit's
    report: every blind write, with its statement and the test)."""


@dataclass(frozen=True, slots=True)
class BlindWrite:
    """One UPDATE of a watched table that did not move its version."""

    table: str
    version: str
    statement: str
    source: str
    test: str | None = None
    #: reported as written outside fencing (``allow="fencing"``), version moved or not
    outside: bool = False

    def __str__(self) -> str:
        who = f"{self.test}: " if self.test else ""
        what = "outside fencing" if self.outside else "without moving its version column"
        return (
            f"{who}UPDATE of table {self.table!r} {what}"
            f"{'' if self.outside else ' ' + repr(self.version)}"
            f" ({self.source}): {_shorten(self.statement)}"
        )


def _shorten(statement: str, limit: int = 400) -> str:
    text = " ".join(statement.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _bare(name: str) -> str:
    """A (possibly quoted, possibly qualified) identifier's last part, unquoted, lower."""
    last = re.split(r"\s*\.\s*(?=[\"`\[A-Za-z_])", name.strip())[-1]
    return last.strip('"`[]').lower()


def _unquoted(text: str) -> str:
    return re.sub(
        r'"([^"]+)"|`([^`]+)`|\[([^\]]+)\]', lambda m: next(g for g in m.groups() if g), text
    )


def _clause(text: str, start: int, ends: tuple[str, ...]) -> tuple[str, int]:
    """The text from ``start`` to the first of ``ends`` (a keyword) at depth 0, a
    closing parenthesis below it, a ``;`` or the end; and where it stopped."""
    depth, i, quote = 0, start, ""
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"`":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            if depth == 0:
                break
            depth -= 1
        elif ch == ";" and depth == 0:
            break
        elif depth == 0 and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] in "_$")):
            word = re.match(r"[A-Za-z]+", text[i:])
            if word and word.group(0).upper() in ends:
                break
        i += 1
    return text[start:i], i


def _assignments(clause: str) -> Iterator[tuple[str, str]]:
    """``column = expression`` pairs of a SET clause, split at top-level commas."""
    depth, quote, start = 0, "", 0
    parts = []
    for i, ch in enumerate(clause):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"`":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(clause[start:i])
            start = i + 1
    parts.append(clause[start:])
    for part in parts:
        column, eq, expression = part.partition("=")
        if eq:
            yield _bare(column), expression


def blind_updates(
    statement: str, tables: Mapping[str, str], *, every: bool = False
) -> list[tuple[str, str]]:
    """The UPDATEs in ``statement`` of the ``tables`` (bare name -> version column) that do
    not move the version (``every``: all of them), as ``(table, version column)``."""
    found = []
    for match in _UPDATE.finditer(statement):
        table = _bare(match.group(1))
        version = tables.get(table)
        if version is None:
            continue
        if every:
            found.append((table, version))
            continue
        sets, end = _clause(statement, match.end(), _SET_ENDS)
        where = ""
        rest = statement[end:]
        head = re.match(r"\s*(?:FROM\b.*?)?\bWHERE\b", rest, re.IGNORECASE | re.DOTALL)
        if head:
            where = _clause(statement, end + head.end(), _WHERE_ENDS)[0]
        column = re.escape(version.lower())
        moved = False
        for name, expression in _assignments(sets):
            if name != version.lower():
                continue
            from_itself = re.search(rf"\b{column}\b\s*\)*\s*\+", _unquoted(expression).lower())
            checked = re.search(rf"\b{column}\b\s*(?:=|<=>|\bIS\b)", _unquoted(where).lower())
            moved = bool(from_itself or checked)
        if not moved:
            found.append((table, version))
    return found


class WriteAudit:
    """Reads the UPDATEs sent to watched tables and keeps the blind ones (``findings``).

    ``tables``: table names (their version column ``version``), or a mapping of table
    name to version column. ``allow="versioned"`` (the default) lets an UPDATE that
    moves the version pass; ``allow="fencing"`` reports every UPDATE of a watched table
    the hooks read: fencing's own commits run on its own (or a borrowed DB-API)
    connection, which no ORM hook reads, so only fencing may write the table (as a
    table only an outbox may write). Do not read fencing's own ``sqlite3`` connection
    with ``allow="fencing"``. Used as a context manager it takes the statements of
    SQLAlchemy and Django (whichever is importable; Django once configured) while it is
    open, and raises :class:`BlindWriteError` on a clean exit if any write was blind::

        with WriteAudit(["orders"]):
            session.execute(update(Order).values(status="x"))   # reported

    In pytest, ``pytest_plugins = ["fencing.testing.pytest_plugin"]`` gives the
    ``fencing_audit`` fixture and marker (``docs/guard.md``).
    """

    def __init__(
        self,
        tables: Iterable[str] | Mapping[str, str] = (),
        *,
        version: str = "version",
        test: str | None = None,
        allow: str = "versioned",
    ) -> None:
        if allow not in ("versioned", "fencing"):
            raise ValueError(f"allow must be 'versioned' or 'fencing', not {allow!r}")
        self.allow = allow
        self.tables: dict[str, str] = {}
        self.findings: list[BlindWrite] = []
        self.test = test
        #: whether statements are read now (the pytest plugin reads the test's call only)
        self.active = True
        self._stack: ExitStack | None = None
        self.watch(tables, version=version)

    def watch(
        self, tables: str | Iterable[str] | Mapping[str, str], *, version: str = "version"
    ) -> None:
        """Watch more tables (a name, names, or a mapping of name to version column)."""
        if isinstance(tables, str):
            tables = [tables]
        pairs = tables.items() if isinstance(tables, Mapping) else ((t, version) for t in tables)
        for table, column in pairs:
            if not isinstance(table, str) or not table or not isinstance(column, str) or not column:
                raise TypeError(f"a table name and its version column, not {table!r}: {column!r}")
            self.tables[_bare(table)] = _bare(column)

    def check(self, statement: str, *, source: str = "sql") -> list[BlindWrite]:
        """Read one statement; its blind writes (also added to ``findings``)."""
        if not self.active or not self.tables or "update" not in statement.lower():
            return []
        every = self.allow == "fencing"
        found = [
            BlindWrite(table, version, statement, source, self.test, every)
            for table, version in blind_updates(statement, self.tables, every=every)
        ]
        self.findings.extend(found)
        return found

    def report(self) -> str:
        """Every blind write, one a line (empty if none)."""
        if not self.findings:
            return ""
        kind = "write(s) outside fencing" if self.allow == "fencing" else "blind write(s)"
        lines = [f"fencing audit: {len(self.findings)} {kind} to a watched table:"]
        lines += [f"  {finding}" for finding in self.findings]
        lines.append(
            "  move the version (version = version + 1, a versioned ORM save) or commit"
            " through fencing (docs/guard.md)"
        )
        return "\n".join(lines)

    def assert_clean(self) -> None:
        """Raise :class:`BlindWriteError` naming every blind write, if there was one."""
        if self.findings:
            raise BlindWriteError(self.report())

    # -- where statements are taken ---------------------------------------------------
    @contextmanager
    def sqlalchemy(self, target: Any = None) -> Iterator[None]:
        """Read the statements of ``target`` (an ``Engine``; None: every engine, async
        engines' too) while open."""
        from sqlalchemy import event
        from sqlalchemy.engine import Engine

        where = Engine if target is None else getattr(target, "sync_engine", target)

        def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            self.check(statement, source="sqlalchemy")

        event.listen(where, "before_cursor_execute", before)
        try:
            yield
        finally:
            event.remove(where, "before_cursor_execute", before)

    @contextmanager
    def django(
        self, aliases: Iterable[str] | None = None, *, models: bool = True
    ) -> Iterator[None]:
        """Read the statements of Django's connections ``aliases`` (None: all) in this
        thread while open. ``models``: also watch every installed model with fencing's
        ``VersionField`` (its table and column)."""
        from django.db import connections

        if models:
            self._watch_django_models()

        def wrapper(execute: Callable[..., Any], sql: str, *args: Any) -> Any:
            self.check(sql, source="django")
            return execute(sql, *args)

        chosen = [connections[a] for a in aliases] if aliases is not None else connections.all()
        for connection in chosen:
            connection.execute_wrappers.append(wrapper)
        try:
            yield
        finally:
            for connection in chosen:
                if wrapper in connection.execute_wrappers:
                    connection.execute_wrappers.remove(wrapper)

    def _watch_django_models(self) -> None:
        from django.apps import apps

        for model in apps.get_models():
            for field in model._meta.concrete_fields:
                if getattr(field, "fencing_version", False):
                    self.watch({model._meta.db_table: field.column})

    @contextmanager
    def sqlite3(self, conn: _sqlite3.Connection) -> Iterator[None]:
        """Read the statements of an ``sqlite3`` connection (its trace callback, as each
        one starts: a blind write is reported, not prevented) while open. The same
        statement twice in a row is read once (SQLite traces its triggers so)."""
        last = [""]

        def traced(text: str) -> None:
            # SQLite traces each trigger program a statement runs as the statement's
            # own text again: a repeat in a row is read once
            if text != last[0]:
                self.check(text, source="sqlite3")
            last[0] = text

        conn.set_trace_callback(traced)
        try:
            yield
        finally:
            conn.set_trace_callback(None)

    @contextmanager
    def hooked(self) -> Iterator[WriteAudit]:
        """Take SQLAlchemy's statements (if it is installed) and Django's (if it is
        configured) while open; raises nothing (``assert_clean`` does)."""
        with ExitStack() as stack:
            if _importable("sqlalchemy"):
                stack.enter_context(self.sqlalchemy())
            if _django_ready():
                stack.enter_context(self.django())
            yield self

    def __enter__(self) -> WriteAudit:
        stack = ExitStack()
        stack.enter_context(self.hooked())
        self._stack = stack
        return self

    def __exit__(self, kind: object, value: object, traceback: object) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()
        if kind is None:
            self.assert_clean()


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _django_ready() -> bool:
    import sys

    if "django" not in sys.modules:
        return False
    from django.apps import apps

    return bool(apps.ready)
