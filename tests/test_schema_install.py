"""What ``install_ddl`` writes out (Django's ``sqlmigrate``, an offline install) makes
the same SQLite schema as ``migrate``: every table, column and index, the superseded
rows' index of schema 6 too."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import fencing
from fencing.backends.sqlite import schema


def _objects(path: Path) -> set[tuple[str, str]]:
    """Every table, index and trigger, and every column (``table.column``)."""
    with sqlite3.connect(path) as conn:
        found = conn.execute(
            "SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"
        ).fetchall()
        columns = {
            ("column", f"{table}.{name}")
            for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            for (name,) in conn.execute(f"SELECT name FROM pragma_table_info('{table}')")
        }
    conn.close()
    return set(found) | columns


def test_install_ddl_makes_what_migrate_makes(tmp_path: Path) -> None:
    migrated, installed = tmp_path / "migrated.db", tmp_path / "installed.db"
    fencing.open(f"sqlite:///{migrated}").close()
    with sqlite3.connect(installed) as conn:
        for statement in schema.install_ddl():
            conn.execute(statement)
    conn.close()
    made = _objects(installed)
    assert ("index", "fencing_outbox_superseded") in made
    assert ("column", "fencing_outbox.due_at") in made
    assert made == _objects(migrated)
