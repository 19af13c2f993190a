"""MySQL's schema: fencing's own tables (``schema.sql``) and their upgrades, as a flow."""

from __future__ import annotations

import importlib.resources
import re
from typing import Final

from ..._errors import SchemaError, StoreNotMigrated
from ..._flow import Flow
from .steps import Result, Script

__all__ = [
    "DDL",
    "SCHEMA_VERSION",
    "TABLES",
    "check",
    "drop_ddl",
    "install_ddl",
    "migrate",
    "upgrade_ddl",
]

# 2: fencing_effects (1 -> 2 only added a table);
# 3: an applied intent is keyed by (scope, intent_id, key_text): an id names work on one key;
# 4: the outbox (3 -> 4 only added two tables);
# 5: the outbox's two indexes of unsent rows cover what claims and stats read;
# 6: the outbox's dead rows (5 -> 6: two columns, the pending columns skip dead rows);
# 7: superseded and debounced rows (6 -> 7: three columns, due_at and kind in the key's
#    index)
SCHEMA_VERSION: Final = 7


def _ddl() -> tuple[str, ...]:
    """The statements of ``schema.sql``, each on one line."""
    text = importlib.resources.files(__package__).joinpath("schema.sql").read_text()
    lines = [s.strip() for s in text.splitlines() if not s.strip().startswith("--")]
    return tuple(s.strip() for s in " ".join(lines).split(";") if s.strip())


DDL: Final = _ddl()
#: fencing's tables, in the order the DDL makes them
TABLES: Final = tuple(re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", " ".join(DDL)))
_SCHEMA_ROW: Final = "INSERT IGNORE INTO fencing_schema (component, version) VALUES ('core', %s)"
# 1 -> 2 only added a table (made above, IF NOT EXISTS); a newer version is left alone
_SCHEMA_BUMP: Final = (
    "UPDATE fencing_schema SET version = %s WHERE component = 'core' AND version < %s"
)
# 2 -> 3 (a second run only rebuilds the same key)
_APPLIED_BY_KEY: Final = (
    "ALTER TABLE fencing_applied DROP PRIMARY KEY, ADD PRIMARY KEY (scope, intent_id, key_text)"
)
# 4 -> 5 (an outbox made by version 4; a second run only rebuilds the same indexes)
_OUTBOX_COVERING: Final = (
    "ALTER TABLE fencing_outbox DROP INDEX fencing_outbox_unsent,"
    " ADD INDEX fencing_outbox_unsent (unsent_kind, id, created_at),"
    " DROP INDEX fencing_outbox_key, ADD INDEX fencing_outbox_key (unsent_key, id, claimed_until)"
)
_SCHEMA_READ: Final = "SELECT version FROM fencing_schema WHERE component = 'core'"
# 5 -> 6, on a table of version 5 or 4 only (one made above has the columns)
_HAS_DEAD_AT: Final = (
    "SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE()"
    " AND TABLE_NAME = 'fencing_outbox' AND COLUMN_NAME = 'dead_at'"
)
_DEAD_ROWS: Final = (
    "ALTER TABLE fencing_outbox ADD COLUMN strikes INT NOT NULL DEFAULT 0 AFTER sent_at,"
    " ADD COLUMN dead_at DOUBLE NULL AFTER strikes,"
    " MODIFY unsent_kind VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin"
    " GENERATED ALWAYS AS (IF(sent_at IS NULL AND dead_at IS NULL, kind, NULL)) STORED,"
    " MODIFY unsent_key VARCHAR(512)"
    " GENERATED ALWAYS AS (IF(sent_at IS NULL AND dead_at IS NULL, okey, NULL)) STORED,"
    " ADD KEY fencing_outbox_dead (dead_at)"
)

# 6 -> 7, on a table of version 6 or older only (one made above has the columns)
_HAS_SUPERSEDED_AT: Final = (
    "SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE()"
    " AND TABLE_NAME = 'fencing_outbox' AND COLUMN_NAME = 'superseded_at'"
)
_SUPERSEDED_ROWS: Final = (
    "ALTER TABLE fencing_outbox ADD COLUMN superseded_at DOUBLE NULL AFTER dead_at,"
    " ADD COLUMN due_at DOUBLE NULL AFTER superseded_at,"
    " ADD COLUMN burst_at DOUBLE NULL AFTER due_at,"
    " DROP INDEX fencing_outbox_key,"
    " ADD INDEX fencing_outbox_key (unsent_key, id, claimed_until, due_at, kind),"
    " ADD KEY fencing_outbox_superseded (superseded_at, kind)"
)


def migrate() -> Flow[None]:
    """Create fencing's tables (idempotent) and upgrade an older schema; ``SchemaError``
    if the database's schema is newer than this fencing."""
    script = Script(*DDL)
    script.add(_SCHEMA_ROW, SCHEMA_VERSION)
    at = script.add(_SCHEMA_READ)
    results: list[Result] = yield script.batch()
    version = int(results[at].rows[0][0])
    if version > SCHEMA_VERSION:
        raise SchemaError(
            f"this store's schema is version {version}, newer than this fencing"
            f" ({SCHEMA_VERSION}); upgrade fencing"
        )
    if version < SCHEMA_VERSION:
        script = Script()
        if version < 3:  # the applied intents' key joins their primary key
            script.add(_APPLIED_BY_KEY)
        if version == 4:  # older: the outbox was just made, with the version 5 indexes
            script.add(_OUTBOX_COVERING)
        has_dead_at = script.add(_HAS_DEAD_AT)
        has_superseded_at = script.add(_HAS_SUPERSEDED_AT)
        results = yield script.batch()
        script = Script()
        if not int(results[has_dead_at].rows[0][0]):
            script.add(_DEAD_ROWS)
        if not int(results[has_superseded_at].rows[0][0]):
            script.add(_SUPERSEDED_ROWS)
        script.add(_SCHEMA_BUMP, SCHEMA_VERSION, SCHEMA_VERSION)
        yield script.batch()


def upgrade_ddl(stored: int | None) -> tuple[str, ...]:
    """The static DDL of ``migrate`` on a database whose fencing schema is known to be at
    version ``stored`` (None: no fencing tables), for an offline migration to write
    out: the statements ``migrate`` runs, each step as it decides it there (an outbox
    lacks its dead rows' columns at versions 4 and 5 only, its superseded rows' at 4 to
    6: one made now has them)."""
    version = str(SCHEMA_VERSION)
    texts = [*DDL, _SCHEMA_ROW.replace("%s", version)]
    if stored is not None and stored < SCHEMA_VERSION:
        if stored < 3:
            texts.append(_APPLIED_BY_KEY)
        if stored == 4:
            texts.append(_OUTBOX_COVERING)
        if stored in (4, 5):
            texts.append(_DEAD_ROWS)
        if stored in (4, 5, 6):
            texts.append(_SUPERSEDED_ROWS)
        texts.append(_SCHEMA_BUMP.replace("%s", version))
    return tuple(texts)


def install_ddl() -> tuple[str, ...]:
    """The statements ``migrate`` runs on a database without fencing's tables: what a
    migration tool shows for it (Django's ``sqlmigrate``)."""
    return (*DDL, _SCHEMA_ROW % SCHEMA_VERSION)


def drop_ddl() -> tuple[str, ...]:
    """The statements that drop fencing's tables (their data with them)."""
    return tuple(f"DROP TABLE IF EXISTS {name}" for name in reversed(TABLES))


_HAS_SCHEMA_TABLE: Final = (
    "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE()"
    " AND TABLE_NAME = 'fencing_schema'"
)


def check() -> Flow[None]:
    """Read only: ``StoreNotMigrated`` unless fencing's tables are in the URL's
    database at this fencing's version (``SchemaError`` if newer)."""
    script = Script()
    has = script.add(_HAS_SCHEMA_TABLE)
    results: list[Result] = yield script.batch()
    if not int(results[has].rows[0][0]):
        raise StoreNotMigrated("no fencing tables in this database", None, SCHEMA_VERSION)
    script = Script()
    at = script.add(_SCHEMA_READ)
    results = yield script.batch()
    rows = results[at].rows
    version = int(rows[0][0]) if rows else None
    if version is not None and version > SCHEMA_VERSION:
        raise SchemaError(
            f"this store's schema is version {version}, newer than this fencing"
            f" ({SCHEMA_VERSION}); upgrade fencing"
        )
    if version != SCHEMA_VERSION:
        raise StoreNotMigrated(f"schema version {version}", version, SCHEMA_VERSION)
