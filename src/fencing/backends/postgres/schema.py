"""PostgreSQL's schema: fencing's own tables (``schema.sql``, ``effects.sql``) and their
upgrades, as the ``migrate`` flow."""

from __future__ import annotations

import importlib.resources
import re
from typing import Final

from ..._errors import SchemaError, StoreNotMigrated
from ..._flow import Flow
from .statements import qualified, quoted
from .steps import Answer, Pipeline, Query, read_only

__all__ = ["SCHEMA_VERSION", "TABLES", "check", "drop_ddl", "install_ddl", "migrate", "upgrade_ddl"]

# 2: fencing_effects (1 -> 2 only added a table and its indexes);
# 3: an applied intent is keyed by (scope, intent_id, key): an id names work on one key;
# 4: the outbox (``outbox.sql``: 3 -> 4 only adds a table, a sequence and indexes);
# 5: the outbox's dead rows (``outbox.sql``: 4 -> 5 adds two columns, IF NOT EXISTS);
# 6: superseded and debounced rows (``outbox.sql``: three columns and an index)
SCHEMA_VERSION: Final = 6


def _statements(name: str) -> tuple[str, ...]:
    """The statements of a ``.sql`` file beside this module: its ``--`` comment lines
    dropped, each statement on one line."""
    text = importlib.resources.files(__package__).joinpath(name).read_text()
    kept = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--"))
    return tuple(" ".join(s.split()) for s in kept.split(";") if s.strip())


_DDL: Final = (
    *_statements("schema.sql"),
    f"INSERT INTO fencing_schema AS v (component, version) VALUES ('core', {SCHEMA_VERSION})"
    " ON CONFLICT (component) DO UPDATE SET version = excluded.version"
    " WHERE v.version < excluded.version",
)
_EFFECTS_DDL: Final = _statements("effects.sql")  # new in version 2
_OUTBOX_DDL: Final = _statements("outbox.sql")  # new in version 4
#: fencing's tables, in the order the DDL makes them
TABLES: Final = tuple(
    re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", " ".join((*_DDL, *_EFFECTS_DDL, *_OUTBOX_DDL)))
)
# 2 -> 3 (run under the migration lock; a second run only rebuilds the same key)
_APPLIED_BY_KEY: Final = (
    "ALTER TABLE fencing_applied DROP CONSTRAINT fencing_applied_pkey,"
    " ADD CONSTRAINT fencing_applied_pkey PRIMARY KEY (scope, intent_id, key)"
)
_MIGRATE_LOCK: Final = "SELECT pg_advisory_xact_lock(hashtext('fencing.migrate'))"
_HAS_SCHEMA_TABLE: Final = (
    "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_tables"
    " WHERE schemaname = coalesce(%(schema)s, current_schema())"
    " AND tablename = 'fencing_schema')"
)
_SCHEMA_VERSION: Final = "SELECT version FROM fencing_schema WHERE component = 'core'"


def _not_newer(stored: int | None) -> None:
    if stored is not None and stored > SCHEMA_VERSION:
        raise SchemaError(
            f"this store's schema is version {stored}, newer than this fencing"
            f" ({SCHEMA_VERSION}); upgrade fencing"
        )


def migrate(schema: str | None) -> Flow[None]:
    """Create fencing's tables (in ``schema``) unless they are there at this version:
    one pipeline, one transaction, under an advisory lock."""
    found: Answer = yield from read_only(Query(_HAS_SCHEMA_TABLE, {"schema": schema}))
    stored = None
    if found.rows[0][0]:
        have: Answer = yield from read_only(Query(_SCHEMA_VERSION))
        stored = have.rows[0][0] if have.rows else None
        _not_newer(stored)
        if stored == SCHEMA_VERSION:
            return
    queries = [Query(text) for text in upgrade_ddl(stored, schema)]
    queries.append(Query(_SCHEMA_VERSION))
    answers: list[Answer] = yield Pipeline(tuple(queries))
    _not_newer(answers[-1].rows[0][0])


def upgrade_ddl(stored: int | None, schema: str | None) -> tuple[str, ...]:
    """What ``migrate`` runs on a store at schema version ``stored`` (None: no fencing
    tables) to bring it to this fencing's, in one transaction: also the static DDL an
    offline migration writes out for a version it is told. Fencing's tables are named
    unqualified: the driver puts them in ``schema`` (``statements.qualified``)."""
    texts = [_MIGRATE_LOCK]
    if schema is not None:
        texts.append(f"CREATE SCHEMA IF NOT EXISTS {quoted(schema)}")
    texts += [*_DDL, *_EFFECTS_DDL, *_OUTBOX_DDL]
    if stored is not None and stored < 3:
        texts.append(_APPLIED_BY_KEY)
    return tuple(texts)


def install_ddl(schema: str | None) -> tuple[str, ...]:
    """The statements ``migrate`` runs on a database without fencing's tables, as the
    driver sends them (the tables in ``schema``): what a migration tool shows for it
    (Django's ``sqlmigrate``)."""
    head = () if schema is None else (f"CREATE SCHEMA IF NOT EXISTS {quoted(schema)}",)
    return head + tuple(qualified(s, schema) for s in (*_DDL, *_EFFECTS_DDL, *_OUTBOX_DDL))


def drop_ddl(schema: str | None) -> tuple[str, ...]:
    """The statements that drop fencing's tables (their data with them) and the outbox's
    claim sequence from ``schema``; the schema itself stays (it may hold more)."""
    drops = [f"DROP TABLE IF EXISTS {name}" for name in reversed(TABLES)]
    drops.append("DROP SEQUENCE IF EXISTS fencing_outbox_claim")  # (schema 4)
    return tuple(qualified(s, schema) for s in drops)


def check(schema: str | None) -> Flow[None]:
    """Read only (nothing created, not even ``schema``): ``StoreNotMigrated`` unless
    fencing's tables are in ``schema`` (default: the current one) at this version."""
    found: Answer = yield from read_only(Query(_HAS_SCHEMA_TABLE, {"schema": schema}))
    where = "the current schema" if schema is None else f"schema {schema!r}"
    if not found.rows[0][0]:
        raise StoreNotMigrated(f"no fencing tables in {where}", None, SCHEMA_VERSION)
    have: Answer = yield from read_only(Query(_SCHEMA_VERSION))
    stored = int(have.rows[0][0]) if have.rows else None
    _not_newer(stored)
    if stored != SCHEMA_VERSION:
        raise StoreNotMigrated(f"schema version {stored} in {where}", stored, SCHEMA_VERSION)
