"""How the test suite reaches each backend: URLs, availability, and user tables.

Every contract test runs against each case here, through the sync API and through
the async API (see ``_syncify``). Server cases skip with a reason when the server
is absent on a laptop, and fail when ``CI`` is set.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

CI = bool(os.environ.get("CI"))

# name of a user-owned test table's columns, with SQL types (portable subset)
TABLE_COLUMNS: dict[str, str] = {
    "status": "VARCHAR(40)",
    "total": "INTEGER",
    "note": "VARCHAR(200)",
}


def server_up(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def require_server(name: str, host: str, port: int) -> None:
    """Skip (laptop) or fail (CI) when a server the test needs is not listening."""
    if server_up(host, port):
        return
    message = f"{name} is not reachable on {host}:{port}"
    if CI:
        pytest.fail(f"{message}, and CI is set: server tests must run in CI")
    pytest.skip(f"{message} (start it to run these tests)")


@dataclass
class Case:
    """One backend under test."""

    name: str
    make_url: Callable[[Path], str]
    shared_between_processes: bool = False
    server: tuple[str, str, int] | None = None
    # create_table(store, table, key, version, columns, rows) sets up a user table
    create_table: Callable[..., None] | None = None
    # cleanup(url) runs after each test that opened ``url`` (drop a schema, flush keys)
    cleanup: Callable[[str], None] | None = None
    marks: list[Any] = field(default_factory=list)

    def url(self, tmp_path: Path) -> str:
        if self.server is not None:
            require_server(*self.server)
        return self.make_url(tmp_path)


def _sqlite_table(
    store: Any,
    table: str,
    key: str,
    version: str | None,
    columns: Mapping[str, str],
    rows: Iterable[Mapping[str, Any]],
) -> None:
    backend = store.backend
    backend = getattr(backend, "sync", backend)
    cols = [f'"{key}" INTEGER PRIMARY KEY']
    if version:
        cols.append(f'"{version}" INTEGER NOT NULL DEFAULT 1')
    cols += [f'"{c}" {t}' for c, t in columns.items()]
    with backend._lock:
        conn = backend.conn
        conn.execute(f'DROP TABLE IF EXISTS "{table}"')
        conn.execute(f'CREATE TABLE "{table}" ({", ".join(cols)})')
        for row in rows:
            names = ", ".join(f'"{c}"' for c in row)
            marks = ", ".join("?" for _ in row)
            conn.execute(f'INSERT INTO "{table}" ({names}) VALUES ({marks})', list(row.values()))


def _memory_table(
    store: Any,
    table: str,
    key: str,
    version: str | None,
    columns: Mapping[str, str],
    rows: Iterable[Mapping[str, Any]],
) -> None:
    backend = store.backend
    backend = getattr(backend, "sync", backend)
    backend.create_table(table, key=key, version=version, columns=list(columns))
    for row in rows:
        full = dict.fromkeys(columns)
        if version:
            full[version] = 1
        full.update(row)
        backend.insert_row(table, full)


CASES: dict[str, Case] = {
    "memory": Case("memory", lambda tmp: "memory://", create_table=_memory_table),
    "sqlite-memory": Case(
        "sqlite-memory", lambda tmp: "sqlite://:memory:", create_table=_sqlite_table
    ),
    "sqlite-file": Case(
        "sqlite-file",
        lambda tmp: f"sqlite:///{tmp / ('db-' + uuid.uuid4().hex[:8] + '.sqlite')}",
        shared_between_processes=True,
        create_table=_sqlite_table,
    ),
}


def register(case: Case) -> None:
    """Server backends add their case here (see tests/backends_*.py)."""
    CASES[case.name] = case


def named_case_url(request: Any, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """For a fixture parametrized by case names: (name, URL of a fresh store), cleaned
    up after; skips when the case is not registered (its driver is not installed)."""
    case = CASES.get(request.param)
    if case is None:
        pytest.skip(f"the {request.param} test case is not registered (driver not installed)")
    url = case.url(tmp_path)
    yield request.param, url
    if case.cleanup is not None:
        case.cleanup(url)
