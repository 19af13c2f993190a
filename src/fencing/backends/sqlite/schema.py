"""SQLite's schema: fencing's own tables (``schema.sql``) and their upgrades."""

from __future__ import annotations

import importlib.resources
import re
import sqlite3
from typing import Final

from ..._errors import SchemaError, StoreNotMigrated

__all__ = ["SCHEMA_VERSION", "TABLES", "check", "drop_ddl", "install_ddl", "migrate", "upgrade_ddl"]

# 2: effects; 3: applied intents by (scope, id, key); 4: outbox; 5: the outbox's dead rows;
# 6: the outbox's superseded and debounced rows
SCHEMA_VERSION: Final = 6

# 2 -> 3: rebuild fencing_applied with (scope, intent_id, key) as its primary key
_APPLIED_BY_KEY: Final = (
    "CREATE TABLE fencing_applied_v3 (scope TEXT NOT NULL, intent_id TEXT NOT NULL,"
    " key NOT NULL, applied_at REAL NOT NULL, PRIMARY KEY (scope, intent_id, key))"
    " WITHOUT ROWID",
    "INSERT INTO fencing_applied_v3 SELECT scope, intent_id, key, applied_at FROM fencing_applied",
    "DROP TABLE fencing_applied",
    "ALTER TABLE fencing_applied_v3 RENAME TO fencing_applied",
    "CREATE INDEX IF NOT EXISTS fencing_applied_at ON fencing_applied (applied_at)",
)
# 4 -> 5: a row's strikes toward a relay's dead_after, and when it was given up as dead
_DEAD_ROWS: Final = (
    "ALTER TABLE fencing_outbox ADD COLUMN strikes INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE fencing_outbox ADD COLUMN dead_at REAL",
)
# 5 -> 6: when a row was superseded, when it is due (debounce), when its burst began
_SUPERSEDED_ROWS: Final = (
    "ALTER TABLE fencing_outbox ADD COLUMN superseded_at REAL",
    "ALTER TABLE fencing_outbox ADD COLUMN due_at REAL",
    "ALTER TABLE fencing_outbox ADD COLUMN burst_at REAL",
)
#: made after the upgrade (its column is new in version 6): the stats count superseded
#: rows from it, never from the sent history
_SUPERSEDED_INDEX: Final = (
    "CREATE INDEX IF NOT EXISTS fencing_outbox_superseded ON fencing_outbox (kind)"
    " WHERE superseded_at IS NOT NULL"
)
_OUTBOX_COLUMNS: Final = "SELECT name FROM pragma_table_info('fencing_outbox')"


def _ddl() -> list[str]:
    text = importlib.resources.files(__package__).joinpath("schema.sql").read_text()
    return [s for s in text.split(";") if s.strip()]


_DDL: Final = _ddl()
#: fencing's tables, in the order the DDL makes them
TABLES: Final = tuple(re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", " ".join(_DDL)))


_SCHEMA_ROW: Final = "INSERT INTO fencing_schema VALUES ('core', ?)"


def install_ddl() -> tuple[str, ...]:
    """The statements ``migrate`` runs on a file without fencing's tables: what a
    migration tool shows for it (Django's ``sqlmigrate``)."""
    row = _SCHEMA_ROW.replace("?", str(SCHEMA_VERSION))
    kept = (
        "\n".join(line for line in s.splitlines() if not line.lstrip().startswith("--"))
        for s in _DDL
    )
    return (*(" ".join(s.split()) for s in kept), row, _SUPERSEDED_INDEX)


def drop_ddl() -> tuple[str, ...]:
    """The statements that drop fencing's tables (their data with them)."""
    return tuple(f"DROP TABLE IF EXISTS {name}" for name in reversed(TABLES))


def migrate(conn: sqlite3.Connection, now: float) -> None:
    """Create fencing's tables (idempotent) and upgrade an older schema, in the caller's
    write transaction; ``SchemaError`` if the file's schema is newer than this fencing."""
    for statement in _DDL:
        conn.execute(statement)
    row = conn.execute("SELECT version FROM fencing_schema WHERE component = 'core'").fetchone()
    if row is None:
        conn.execute(_SCHEMA_ROW, (SCHEMA_VERSION,))
    elif row[0] > SCHEMA_VERSION:
        raise SchemaError(
            f"this store's schema is version {row[0]}, newer than this fencing"
            f" ({SCHEMA_VERSION}); upgrade fencing"
        )
    elif row[0] < SCHEMA_VERSION:  # 1 -> 2 and 3 -> 4 only added tables, made above
        if row[0] < 3:  # 2 -> 3: the applied intents' key joins their primary key
            for statement in _APPLIED_BY_KEY:
                conn.execute(statement)
        columns = {name for (name,) in conn.execute(_OUTBOX_COLUMNS)}
        # 4 -> 5: a version 4 outbox gains its columns (one made above has them)
        if "dead_at" not in columns:
            for statement in _DEAD_ROWS:
                conn.execute(statement)
        # 5 -> 6: likewise, an outbox of version 4 or 5
        if "superseded_at" not in columns:
            for statement in _SUPERSEDED_ROWS:
                conn.execute(statement)
        conn.execute(
            "UPDATE fencing_schema SET version = ? WHERE component = 'core'", (SCHEMA_VERSION,)
        )
    conn.execute(_SUPERSEDED_INDEX)


def upgrade_ddl(stored: int | None) -> tuple[str, ...]:
    """The static DDL of ``migrate`` on a file whose fencing schema is known to be at
    version ``stored`` (None: no fencing tables), for an offline migration to write
    out: the statements ``migrate`` runs, each step as it decides it there (an outbox
    lacks its dead rows' columns at version 4 only, its superseded rows' at 4 and 5:
    one made now has them)."""
    texts = [" ".join(line.split("--")[0] for line in s.splitlines()).strip() for s in _DDL]
    texts = [" ".join(t.split()) for t in texts]
    version = str(SCHEMA_VERSION)
    if stored is None:
        texts.append(f"INSERT INTO fencing_schema VALUES ('core', {version})")
    elif stored < SCHEMA_VERSION:
        if stored < 3:
            texts += _APPLIED_BY_KEY
        if stored == 4:
            texts += _DEAD_ROWS
        if stored in (4, 5):
            texts += _SUPERSEDED_ROWS
        texts.append(f"UPDATE fencing_schema SET version = {version} WHERE component = 'core'")
    texts.append(_SUPERSEDED_INDEX)
    return tuple(texts)


_HAS_SCHEMA_TABLE: Final = (
    "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'fencing_schema'"
)


def check(conn: sqlite3.Connection, now: float) -> None:
    """Read only: ``StoreNotMigrated`` unless fencing's schema is in this file at this
    fencing's version (``SchemaError`` if newer)."""
    if not conn.execute(_HAS_SCHEMA_TABLE).fetchone()[0]:
        raise StoreNotMigrated("no fencing tables in this file", None, SCHEMA_VERSION)
    row = conn.execute("SELECT version FROM fencing_schema WHERE component = 'core'").fetchone()
    found = None if row is None else int(row[0])
    if found is not None and found > SCHEMA_VERSION:
        raise SchemaError(
            f"this store's schema is version {found}, newer than this fencing"
            f" ({SCHEMA_VERSION}); upgrade fencing"
        )
    if found != SCHEMA_VERSION:
        raise StoreNotMigrated(f"schema version {found}", found, SCHEMA_VERSION)
