"""Monitors and the relay never make the store they are pointed at (issue 18, item 9).

``fencing outbox`` (``--fail-if-older``, ``--fail-if-dead``), ``reconcile --fail-if-any``,
``stats``, ``inspect`` and ``relay`` open their URL with ``fencing.open(url,
migrate="check")``: a mistyped SQLite path, PostgreSQL ``?schema=`` or MySQL database
is an error (exit 2, "no fencing store at ..."), not a new empty store reported healthy;
the SQLite file is not made, the schema not created, no table made; an older schema is
named and left as it is.
"""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fencing
from fencing._cli import main
from fencing._url import StoreURL
from fencing.backends.sqlite import SCHEMA_VERSION as SQLITE_VERSION

from ._backends import require_server

try:
    import celery

    APP: Any = celery.Celery("open-check", broker="memory://", set_as_current=False)
except ModuleNotFoundError:  # pragma: no cover - the celery extra
    APP = None
try:
    from arq.connections import RedisSettings

    ARQ: Any = RedisSettings(host="127.0.0.1", port=1)  # never reached: refused before
except ModuleNotFoundError:  # pragma: no cover - the arq extra
    ARQ = None

RELAY = ["relay", "{url}", "--queue"]
COMMANDS = {
    "outbox": ["outbox", "{url}"],
    "outbox-fail-if-older": ["outbox", "{url}", "--fail-if-older", "60"],
    "outbox-fail-if-dead": ["outbox", "{url}", "--fail-if-dead"],
    "reconcile-fail-if-any": ["reconcile", "{url}", "--fail-if-any"],
    "stats": ["stats", "{url}"],
    "inspect": ["inspect", "{url}", "orders", "o-1"],
    "relay-celery": [*RELAY, "celery", "--once", "--quiet", "--app", "tests.test_open_check:APP"],
    "relay-arq": [*RELAY, "arq", "--once", "--quiet", "--app", "tests.test_open_check:ARQ"],
}


def _run(name: str, url: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    if name == "relay-celery" and APP is None:
        pytest.skip("the celery extra is not installed")
    if name == "relay-arq" and ARQ is None:
        pytest.skip("the arq extra is not installed")
    capsys.readouterr()
    code = main([part.format(url=url) for part in COMMANDS[name]])
    return code, capsys.readouterr().err


# -- SQLite -------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", COMMANDS)
def test_a_missing_sqlite_file_is_an_error_and_is_not_made(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "typo.db"
    code, err = _run(command, f"sqlite:///{path}", capsys)
    assert code == 2, err
    assert "StoreNotMigrated: no fencing store at sqlite:///" in err
    assert "run `fencing migrate URL` first" in err
    assert sorted(tmp_path.iterdir()) == []  # no file, no -wal, no -shm


@pytest.fixture
def older_sqlite(tmp_path: Path) -> tuple[str, Path]:
    path = tmp_path / "old.db"
    fencing.open(f"sqlite:///{path}").close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE fencing_schema SET version = ?", (SQLITE_VERSION - 1,))
    conn.close()
    return f"sqlite:///{path}", path


def _sqlite_version(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("SELECT version FROM fencing_schema").fetchone()[0])
    finally:
        conn.close()


@pytest.mark.parametrize("command", COMMANDS)
def test_an_older_sqlite_schema_is_named_and_not_migrated(
    command: str, older_sqlite: tuple[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    url, path = older_sqlite
    code, err = _run(command, url, capsys)
    assert code == 2, err
    assert f"is at schema version {SQLITE_VERSION - 1}, older than this fencing's" in err
    assert _sqlite_version(path) == SQLITE_VERSION - 1


def test_a_file_that_is_no_store_is_refused_and_left_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (x)")
    conn.close()
    code, err = _run("outbox-fail-if-dead", f"sqlite:///{path}", capsys)
    assert code == 2 and "no fencing tables in this file" in err
    conn = sqlite3.connect(path)
    try:  # no fencing table made, and its journal mode not switched to WAL
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        assert names == {"t"}
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    finally:
        conn.close()


def test_the_commands_work_on_a_store_at_this_version(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'app.db'}"
    with fencing.open(url) as store:
        store.collection("orders").create("o-1", {"n": 1})
    for command in COMMANDS:
        code, err = _run(command, url, capsys)
        assert code == 0, (command, err)


def test_open_check_is_the_library_s_too(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'lib.db'}"
    with pytest.raises(fencing.StoreNotMigrated) as caught:
        fencing.open(url, migrate="check")
    assert caught.value.found is None and caught.value.expected == SQLITE_VERSION
    assert isinstance(caught.value, fencing.SchemaError)
    with pytest.raises(fencing.StoreNotMigrated):
        asyncio.run(fencing.open_async(url, migrate="check"))
    assert not (tmp_path / "lib.db").exists()
    with pytest.raises(fencing.InvalidInput, match="migrate must be"):
        fencing.open(url, migrate="yes")  # type: ignore[arg-type]
    with pytest.raises(fencing.StoreNotMigrated):
        fencing.open("memory://", migrate="check")  # a memory store is never there already
    fencing.open(url).close()
    with fencing.open(url, migrate="check") as store:
        assert store.collection("orders").get("o-1") is None

    async def run() -> None:
        store = await fencing.open_async(url, migrate="check")
        await store.close()

    asyncio.run(run())


# -- PostgreSQL: a mistyped ?schema= ------------------------------------------------------------
def _pg_schemas(backends_postgres: Any, name: str) -> int:
    with backends_postgres.admin() as conn:
        row = conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", (name,))
        return int(row.fetchone()[0])


@pytest.mark.parametrize("command", COMMANDS)
def test_a_mistyped_postgres_schema_is_an_error_and_is_not_created(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("psycopg")
    from . import backends_postgres

    require_server("PostgreSQL", backends_postgres.HOST, backends_postgres.PORT)
    schema = "fencing_t_" + uuid.uuid4().hex[:16]
    url = backends_postgres.url_for(schema)
    try:
        code, err = _run(command, url, capsys)
        assert code == 2, err
        assert f"no fencing tables in schema {schema!r}" in err
        assert _pg_schemas(backends_postgres, schema) == 0
    finally:
        backends_postgres.cleanup(url)


def test_an_older_postgres_schema_is_named_and_not_migrated(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytest.importorskip("psycopg")
    from fencing.backends.postgres import SCHEMA_VERSION

    from . import backends_postgres

    require_server("PostgreSQL", backends_postgres.HOST, backends_postgres.PORT)
    schema = "fencing_t_" + uuid.uuid4().hex[:16]
    url = backends_postgres.url_for(schema)
    try:
        fencing.open(url).close()
        with backends_postgres.admin() as conn:
            conn.execute(f"UPDATE {schema}.fencing_schema SET version = {SCHEMA_VERSION - 1}")
        code, err = _run("outbox-fail-if-older", url, capsys)
        assert code == 2 and f"is at schema version {SCHEMA_VERSION - 1}" in err
        with backends_postgres.admin() as conn:
            row = conn.execute(f"SELECT version FROM {schema}.fencing_schema").fetchone()
        assert row[0] == SCHEMA_VERSION - 1
        assert _run("stats", url.replace(schema, schema[:-1]), capsys)[0] == 2
    finally:
        backends_postgres.cleanup(url)


# -- MySQL / MariaDB: the URL's database -------------------------------------------------------
@pytest.fixture
def mysql_database() -> Iterator[tuple[str, Any]]:
    pytest.importorskip("pymysql")
    from . import backends_mysql

    require_server("MySQL", backends_mysql.HOST, backends_mysql.PORT)
    url = backends_mysql.make_url(Path("."))  # an empty database: no fencing tables in it
    try:
        yield url, backends_mysql
    finally:
        backends_mysql.cleanup(url)


def _mysql_tables(backends_mysql: Any, database: str) -> int:
    conn = backends_mysql._admin()
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s",
                (database,),
            )
            return int(cur.fetchone()[0])
    finally:
        conn.close()


@pytest.mark.parametrize("command", COMMANDS)
def test_a_mysql_database_without_fencing_is_an_error_and_gets_no_table(
    command: str, mysql_database: tuple[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    url, backends_mysql = mysql_database
    database = url.rsplit("/", 1)[1]
    code, err = _run(command, url, capsys)
    assert code == 2, err
    assert "no fencing tables in this database" in err
    assert _mysql_tables(backends_mysql, database) == 0
    # a database that does not exist: refused by the server, and not created either
    code, err = _run(command, url + "_typo", capsys)
    assert code == 2, err
    conn = backends_mysql._admin()
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW DATABASES LIKE %s", (database + "_typo",))
            assert cur.fetchall() == ()
    finally:
        conn.close()


# -- Redis: the URL's prefix (reconcile, stats and inspect; Redis has no outbox) ---------------
@pytest.mark.parametrize("command", ["reconcile-fail-if-any", "stats", "inspect"])
def test_a_mistyped_redis_prefix_is_an_error_and_writes_nothing(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    redis = pytest.importorskip("redis")
    from fencing.backends.redis import SCHEMA_VERSION

    from . import backends_redis

    require_server("Redis", backends_redis.HOST, backends_redis.PORT)
    url = backends_redis.redis_url()
    prefix = StoreURL.parse(url).options["prefix"]
    client = redis.Redis(host=backends_redis.HOST, port=backends_redis.PORT, db=0)
    try:
        code, err = _run(command, url, capsys)
        assert code == 2 and f"no '{prefix}:schema' key in this Redis" in err, err
        assert list(client.scan_iter(match=f"{prefix}:*")) == []
        fencing.open(url).close()  # made: the command works, then an older one is refused
        assert _run(command, url, capsys)[0] in (0, 1)
        client.set(f"{prefix}:schema", SCHEMA_VERSION - 1)
        code, err = _run(command, url, capsys)
        assert code == 2 and f"is at schema version {SCHEMA_VERSION - 1}" in err, err
        assert int(client.get(f"{prefix}:schema")) == SCHEMA_VERSION - 1
    finally:
        client.close()
        backends_redis.cleanup(url)


def test_an_older_mysql_schema_is_named_and_not_migrated(
    mysql_database: tuple[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    from fencing.backends.mysql import SCHEMA_VERSION

    url, backends_mysql = mysql_database
    database = url.rsplit("/", 1)[1]
    fencing.open(url).close()
    conn = backends_mysql._admin()
    try:
        with conn.cursor() as cur:
            cur.execute(f"UPDATE `{database}`.fencing_schema SET version = {SCHEMA_VERSION - 1}")
        conn.commit()
        code, err = _run("relay-arq", url, capsys)  # the async opener too
        assert code == 2 and f"is at schema version {SCHEMA_VERSION - 1}" in err, err
        assert _run("reconcile-fail-if-any", url, capsys)[0] == 2
        with conn.cursor() as cur:
            cur.execute(f"SELECT version FROM `{database}`.fencing_schema")
            assert cur.fetchone()[0] == SCHEMA_VERSION - 1
    finally:
        conn.close()
