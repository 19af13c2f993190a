"""The PostgreSQL case: a fresh schema per test on the server of this machine (or CI).

``FENCING_POSTGRES_URL`` points the tests at another server; each test gets its own
``fencing_t_<hex>`` schema (``?schema=...``), dropped with everything in it afterwards.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import fencing

from ._backends import Case, register, require_server
from ._lenders import Lender, register_lender
from ._syncify import Loop, Syncified

BASE_URL = os.environ.get("FENCING_POSTGRES_URL", "postgresql://root@127.0.0.1:5432/test")
_parts = urlsplit(BASE_URL)
HOST = _parts.hostname or "127.0.0.1"
PORT = _parts.port or 5432


def url_for(schema: str, **options: str) -> str:
    query = dict(parse_qsl(_parts.query), schema=schema, **options)
    return urlunsplit(_parts._replace(query=urlencode(query)))


def schema_of(url: str) -> str:
    schema = dict(parse_qsl(urlsplit(url).query))["schema"]
    assert schema.startswith("fencing_t_"), schema
    return schema


def admin() -> Any:
    """A short-lived autocommit psycopg connection to the test server."""
    import psycopg

    from fencing._url import StoreURL
    from fencing.backends.postgres.settings import settings_from_url

    settings = settings_from_url(StoreURL.parse(BASE_URL), {})
    return psycopg.connect(settings.conninfo, autocommit=True)


def make_url(tmp_path: Path) -> str:
    """A URL whose schema is fresh (fencing creates it on migrate)."""
    return url_for("fencing_t_" + uuid.uuid4().hex[:16])


def cleanup(url: str) -> None:
    from psycopg import sql

    with admin() as conn:
        conn.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema_of(url)))
        )


def connect(store: Any) -> Any:
    """A short-lived autocommit connection to a store's database, its schema first on
    the search path (works for a sync or an async store: no event loop needed)."""
    import psycopg
    from psycopg import sql

    backend = store.backend
    conn = psycopg.connect(backend.conninfo, autocommit=True)
    if backend.schema is not None:
        conn.execute(
            sql.SQL("SET search_path TO {}, public").format(sql.Identifier(backend.schema))
        )
    return conn


def create_table(
    store: Any,
    table: str,
    key: str,
    version: str | None,
    columns: Mapping[str, str],
    rows: Iterable[Mapping[str, Any]],
) -> None:
    from psycopg import sql

    ident = sql.Identifier
    cols = [sql.SQL("{} INTEGER PRIMARY KEY").format(ident(key))]
    if version:
        cols.append(sql.SQL("{} INTEGER NOT NULL DEFAULT 1").format(ident(version)))
    cols += [sql.SQL("{} {}").format(ident(c), sql.SQL(t)) for c, t in columns.items()]
    with connect(store) as conn:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(ident(table)))
        conn.execute(sql.SQL("CREATE TABLE {} ({})").format(ident(table), sql.SQL(", ").join(cols)))
        for row in rows:
            conn.execute(
                sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
                    ident(table),
                    sql.SQL(", ").join(map(ident, row)),
                    sql.SQL(", ").join([sql.Placeholder()] * len(row)),
                ),
                list(row.values()),
            )


register(
    Case(
        name="postgresql",
        make_url=make_url,
        shared_between_processes=True,
        server=("PostgreSQL", HOST, PORT),
        create_table=create_table,
        cleanup=cleanup,
    )
)


# -- what the PostgreSQL-specific test files share -----------------------------------------
@dataclass
class Setup:
    url: str
    app: str  # application_name of the store's connections (to find them on the server)
    schema: str


def new_setup(**options: str) -> Setup:
    require_server("PostgreSQL", HOST, PORT)
    schema = "fencing_t_" + uuid.uuid4().hex[:16]
    app = "fencing-test-" + uuid.uuid4().hex[:8]
    return Setup(url_for(schema, application_name=app, **options), app, schema)


@contextmanager
def opened(url: str, api: str, **options: Any) -> Iterator[Any]:
    """A store on ``url`` through the sync API, or the async API made to look sync."""
    if api == "sync":
        store = fencing.open(url, **options)
        try:
            yield store
        finally:
            store.close()
        return
    loop = Loop()
    try:
        store = Syncified(loop.run(fencing.open_async(url, **options)), loop)
        try:
            yield store
        finally:
            store.close()
    finally:
        loop.close()


# -- what one call sends: libpq's protocol trace ---------------------------------------------
@dataclass
class Traffic:
    statements: int  # Execute (extended protocol) and Query (simple) messages
    round_trips: int  # Sync and Query messages: each waits for ReadyForQuery
    prepares: int  # a named Parse: psycopg preparing a statement it saw 5 times


def pgconn_of(store: Any) -> Any:
    """The one connection of a store opened with max_size=1."""
    backend = store.backend
    if isinstance(store, Syncified):

        async def get() -> Any:
            async with backend.pool.connection() as conn:
                return conn.pgconn

        return store._loop.run(get())
    with backend.pool.connection() as conn:
        return conn.pgconn


@contextmanager
def traced(pgconn: Any) -> Iterator[list[Traffic]]:
    from psycopg import pq

    found: list[Traffic] = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace"
        with path.open("w") as f:
            pgconn.trace(f.fileno())
            pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
            try:
                yield found
            finally:
                pgconn.untrace()
        sent = [line.split("\t") for line in path.read_text().splitlines() if line[:2] == "F\t"]
    kinds = Counter(parts[2] for parts in sent)
    named = sum(1 for p in sent if p[2] == "Parse" and not p[3].startswith(' ""'))
    found.append(Traffic(kinds["Execute"] + kinds["Query"], kinds["Sync"] + kinds["Query"], named))


# -- store.using(): connections lent by the caller (tests/test_using.py) ----------------------
def _lend_options(url: str) -> str:
    """libpq options putting the URL's schema first on the search path, as the store's
    own connections have it (so a table name resolves the same on both)."""
    return f"-c search_path={schema_of(url)},public"


def _lend_conninfo(url: str) -> str:
    from fencing._url import StoreURL
    from fencing.backends.postgres.settings import settings_from_url

    plain = urlunsplit(urlsplit(url)._replace(query=""))
    return settings_from_url(StoreURL.parse(plain), {}).conninfo


def _lend(url: str, *, autocommit: bool = False) -> Any:
    import psycopg

    return psycopg.connect(_lend_conninfo(url), autocommit=autocommit, options=_lend_options(url))


async def _alend(url: str) -> Any:
    import psycopg

    return await psycopg.AsyncConnection.connect(_lend_conninfo(url), options=_lend_options(url))


def _sa_url(url: str, driver: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(scheme=f"postgresql+{driver}", query=""))


def _lend2(url: str, *, autocommit: bool = False) -> Any:
    """A psycopg2 connection, as most Django projects still have (autocommit off: its
    default)."""
    import psycopg2

    conn = psycopg2.connect(_lend_conninfo(url), options=_lend_options(url))
    conn.autocommit = autocommit
    return conn


register_lender(
    "postgresql",
    Lender(
        connect=_lend,
        connect_autocommit=lambda url: _lend(url, autocommit=True),
        aconnect=_alend,
        sa_url=lambda url: _sa_url(url, "psycopg"),
        sa_async_url=lambda url: _sa_url(url, "psycopg_async"),
        sa_options=lambda url: {"connect_args": {"options": _lend_options(url)}},
        driver="psycopg",
    ),
)
register_lender(
    "postgresql",
    Lender(
        connect=_lend2,
        connect_autocommit=lambda url: _lend2(url, autocommit=True),
        aconnect=None,
        sa_url=lambda url: _sa_url(url, "psycopg2"),
        sa_async_url=None,
        sa_options=lambda url: {"connect_args": {"options": _lend_options(url)}},
        driver="psycopg2",
        requires="psycopg2",
    ),
)
