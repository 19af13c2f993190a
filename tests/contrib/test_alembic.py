"""``fencing.contrib.alembic``: fencing's tables made, upgraded and dropped by a real
Alembic environment's migrations, and left alone by its autogenerate.

Per site (SQLite file; PostgreSQL with fencing's tables beside the application's, and in
their own schema; MariaDB / MySQL): an Alembic environment in a tmp dir (alembic.ini,
env.py using the hook, versions/) whose model is an ``orders`` table. The PostgreSQL
sites work in schemas of their own (the application's first on the search path), the
MySQL site in a database of its own, all dropped afterwards.
"""

from __future__ import annotations

import importlib
import io
import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import fencing

alembic = pytest.importorskip("alembic")
sqlalchemy = pytest.importorskip("sqlalchemy")

from alembic import command  # noqa: E402
from alembic.autogenerate import compare_metadata  # noqa: E402
from alembic.config import Config  # noqa: E402
from alembic.migration import MigrationContext  # noqa: E402
from alembic.operations import Operations  # noqa: E402

from fencing._errors import ConfigurationError  # noqa: E402
from fencing.contrib.alembic import (  # noqa: E402
    downgrade_fencing,
    exclude_fencing,
    guard_table,
    include_name,
    include_object,
    upgrade_fencing,
)

from .._backends import require_server  # noqa: E402
from ..test_migrate_applied import _OLD_APPLIED  # noqa: E402

FENCING_TABLES = {
    "fencing_schema",
    "fencing_records",
    "fencing_applied",
    "fencing_fences",
    "fencing_leases",
    "fencing_tombstones",
    "fencing_effects",
}
#: the outbox's tables (schema 4); PostgreSQL's claim tokens come from a sequence
OUTBOX_TABLES = {"fencing_outbox", "fencing_outbox_claims"}
POSTGRES_OUTBOX_TABLES = {"fencing_outbox"}


def tables_of(site_name: str) -> set[str]:
    """fencing's tables on the store of a site (by its case name)."""
    pg = site_name.startswith("postgresql")
    return FENCING_TABLES | (POSTGRES_OUTBOX_TABLES if pg else OUTBOX_TABLES)


ENV_PY = """\
from alembic import context
from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine
from sqlalchemy.pool import NullPool

from fencing.contrib.alembic import exclude_fencing

metadata = MetaData()
Table(
    "orders", metadata,
    Column("id", Integer, primary_key=True),
    Column("version", Integer, nullable=False),
    Column("status", String(40)),
)
config = context.config
SCHEMAS = {schemas!r}


def only_ours(name, type_, parent_names):  # the application's own include_name hook
    return type_ != "schema" or name is None or name in SCHEMAS


if context.is_offline_mode():  # alembic upgrade --sql
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=metadata,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()
else:
    engine = create_engine(config.get_main_option("sqlalchemy.url"), poolclass=NullPool)
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=metadata,
            include_schemas=bool(SCHEMAS),
            **exclude_fencing(include_name=only_ours),
        )
        with context.begin_transaction():
            context.run_migrations()
"""

MIGRATION = """\
import sqlalchemy as sa
from alembic import op

from fencing.contrib.alembic import downgrade_fencing, guard_table, unguard_table, upgrade_fencing

revision = {revision!r}
down_revision = {down!r}


def upgrade():
{upgrade}


def downgrade():
{downgrade}
"""

CREATE_ORDERS = """\
    op.create_table(
        "orders",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("status", sa.String(40)),
    )"""


@dataclass
class Site:
    """Where an application and its Alembic environment live."""

    name: str  # the case name in test_migrate_applied._OLD_APPLIED
    sa_url: str  # the application's (Alembic's) SQLAlchemy URL
    fencing_url: str  # the store's URL
    schema: str | None = None  # upgrade_fencing's schema= (PostgreSQL)
    app_schema: str | None = None  # the application's own schema (PostgreSQL)
    engines: list[Any] = field(default_factory=list)

    def engine(self) -> Any:
        engine = sqlalchemy.create_engine(self.sa_url)
        self.engines.append(engine)
        return engine

    @property
    def fencing_schema(self) -> str | None:
        return self.schema or self.app_schema

    def fencing_tables(self) -> set[str]:
        with self.engine().connect() as conn:
            names = sqlalchemy.inspect(conn).get_table_names(schema=self.fencing_schema)
        return {n for n in names if n.startswith("fencing_")}

    def run_in_fencing_schema(self, *statements: str) -> list[Any]:
        with self.engine().begin() as conn:
            if self.fencing_schema is not None:
                conn.exec_driver_sql(f'SET LOCAL search_path TO "{self.fencing_schema}"')
            found = []
            for statement in statements:
                result = conn.exec_driver_sql(statement)
                found.append(result.fetchall() if result.returns_rows else None)
            return found


def _pg_site(tmp_path: Path, own_schema: bool) -> Iterator[Site]:
    pg = pytest.importorskip("tests.backends_postgres")
    require_server("PostgreSQL", pg.HOST, pg.PORT)
    app = "fencing_alembic_" + uuid.uuid4().hex[:12]
    schema = app + "_f" if own_schema else None
    with pg.admin() as conn:
        conn.execute(f'CREATE SCHEMA "{app}"')
    parts = pg._parts
    sa_url = sqlalchemy.engine.URL.create(
        "postgresql+psycopg",
        username=parts.username or "root",
        password=parts.password,
        host=pg.HOST,
        port=pg.PORT,
        database=parts.path.lstrip("/"),
        query={"options": f"-csearch_path={app}"},
    )
    site = Site(
        "postgresql",
        sa_url.render_as_string(hide_password=False),
        pg.url_for(schema or app),
        schema=schema,
        app_schema=app,
    )
    try:
        yield site
    finally:
        for engine in site.engines:
            engine.dispose()
        with pg.admin() as conn:
            for name in (app, schema):
                if name is not None:
                    conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def _mysql_site() -> Iterator[Site]:
    my = pytest.importorskip("tests.backends_mysql")
    require_server("MariaDB / MySQL", my.HOST, my.PORT)
    database = "fencing_alembic_" + uuid.uuid4().hex[:12]
    conn = my._admin()
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{database}` CHARACTER SET utf8mb4")
    finally:
        conn.close()
    url = my.url_for(database)
    parts = my._parts
    sa_url = sqlalchemy.engine.URL.create(
        "mysql+pymysql",
        username=parts.username or "root",
        password=parts.password,
        host=my.HOST,
        port=my.PORT,
        database=database,
    )
    site = Site("mysql", sa_url.render_as_string(hide_password=False), url)
    try:
        yield site
    finally:
        for engine in site.engines:
            engine.dispose()
        conn = my._admin()
        try:
            with conn.cursor() as cur:
                cur.execute(f"DROP DATABASE IF EXISTS `{database}`")
        finally:
            conn.close()


@pytest.fixture(params=["sqlite", "postgresql", "postgresql-own-schema", "mysql"])
def site(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Site]:
    if request.param == "sqlite":
        path = tmp_path / "app.db"
        found = Site("sqlite-file", f"sqlite:///{path}", f"sqlite:///{path}")
        yield found
        for engine in found.engines:
            engine.dispose()
    elif request.param == "mysql":
        yield from _mysql_site()
    else:
        yield from _pg_site(tmp_path, own_schema=request.param.endswith("own-schema"))


class Environment:
    """A real Alembic environment in a tmp dir: alembic.ini, env.py, versions/."""

    def __init__(self, site: Site, root: Path) -> None:
        self.site, self.root = site, root
        (root / "versions").mkdir(parents=True)
        schemas = sorted({s for s in (site.app_schema, site.schema) if s})
        (root / "env.py").write_text(ENV_PY.format(schemas=set(schemas) or set()))
        (root / "script.py.mako").write_text(_SCRIPT_MAKO)
        ini = root / "alembic.ini"
        ini.write_text(
            f"[alembic]\nscript_location = {root}\n"
            f"sqlalchemy.url = {site.sa_url.replace('%', '%%')}\n"
        )
        self.config = Config(str(ini))
        schema = f", schema={site.schema!r}" if site.schema else ""
        self.add(
            "0001",
            None,
            f"{CREATE_ORDERS}\n    upgrade_fencing(op, offline_from=0{schema})",
            f"    downgrade_fencing(op{schema})\n    op.drop_table('orders')",
        )

    def add(self, revision: str, down: str | None, upgrade: str, downgrade: str) -> None:
        text = MIGRATION.format(revision=revision, down=down, upgrade=upgrade, downgrade=downgrade)
        (self.root / "versions" / f"{revision}_step.py").write_text(text)

    def diffs(self, *, hooks: bool) -> list[Any]:
        """What autogenerate proposes, with or without fencing's hook."""
        schemas = {s for s in (self.site.app_schema, self.site.schema) if s}

        def only_ours(name: str | None, type_: str, parents: Any) -> bool:
            return type_ != "schema" or name is None or name in schemas

        metadata = sqlalchemy.MetaData()
        sqlalchemy.Table(
            "orders",
            metadata,
            sqlalchemy.Column("id", sqlalchemy.Integer, primary_key=True),
            sqlalchemy.Column("version", sqlalchemy.Integer, nullable=False),
            sqlalchemy.Column("status", sqlalchemy.String(40)),
        )
        options: dict[str, Any] = {"include_schemas": bool(schemas)}
        options |= exclude_fencing(include_name=only_ours) if hooks else {"include_name": only_ours}
        with self.site.engine().connect() as conn:
            context = MigrationContext.configure(conn, opts=options)
            return list(compare_metadata(context, metadata))


_SCRIPT_MAKO = '''\
"""${message}"""
import sqlalchemy as sa
from alembic import op
${imports if imports else ""}
revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}


def upgrade():
    ${upgrades if upgrades else "pass"}


def downgrade():
    ${downgrades if downgrades else "pass"}
'''


def _tables_named(diffs: list[Any]) -> set[str]:
    """The table names autogenerate's operations touch (flattened, any kind)."""
    found: set[str] = set()
    for diff in diffs:
        for item in diff if isinstance(diff, list) else [diff]:
            for part in item:
                name = getattr(part, "name", None)
                table = getattr(part, "table", None)
                found |= {n for n in (name, getattr(table, "name", None)) if isinstance(n, str)}
    return found


def _commit_works(url: str) -> None:
    with fencing.open(url, migrate=False) as store:
        orders = store.collection("orders")
        rec = orders.create("o-1", {"status": "new"})
        assert orders.commit(rec.intent("ship"), {"status": "shipped"}).committed


def test_migrations_make_fencing_tables_and_autogenerate_leaves_them_alone(
    site: Site, tmp_path: Path
) -> None:
    env = Environment(site, tmp_path / "migrations")
    command.upgrade(env.config, "head")
    assert site.fencing_tables() == tables_of(site.name)
    if site.schema is not None:  # in their own schema, none beside the application's
        with site.engine().connect() as conn:
            names = sqlalchemy.inspect(conn).get_table_names(schema=site.app_schema)
        assert set(names) == {"orders", "alembic_version"}
    _commit_works(site.fencing_url)

    # autogenerate with the hook: nothing on fencing's tables, nothing at all here
    assert not any(n.startswith("fencing_") for n in _tables_named(env.diffs(hooks=True)))
    assert env.diffs(hooks=True) == []
    command.check(env.config)  # env.py's own configuration: no difference detected
    script = command.revision(env.config, message="nothing", autogenerate=True, rev_id="0002")
    assert script is not None
    written = Path(script.path).read_text()
    assert "fencing_" not in written and "pass" in written, written
    Path(script.path).unlink()

    # the control: without the hook, autogenerate would drop every one of fencing's tables
    removed = {d[1].name for d in env.diffs(hooks=False) if d[0] == "remove_table"}
    assert removed == tables_of(site.name)

    command.downgrade(env.config, "base")
    assert site.fencing_tables() == set()


def _current_schema(site_name: str) -> int:
    package = {"sqlite": "sqlite", "sqlite-file": "sqlite", "postgresql": "postgres"}
    module = importlib.import_module(f"fencing.backends.{package.get(site_name, site_name)}")
    return int(module.SCHEMA_VERSION)


def test_a_schema_2_store_reaches_the_current_schema_through_the_operation(
    site: Site, tmp_path: Path
) -> None:
    env = Environment(site, tmp_path / "migrations")
    command.upgrade(env.config, "head")
    _commit_works(site.fencing_url)  # an applied intent of o-1, as the old schema keys it
    site.run_in_fencing_schema(*_OLD_APPLIED[site.name])
    assert site.run_in_fencing_schema("SELECT version FROM fencing_schema") == [[(2,)]]

    schema = f"schema={site.schema!r}" if site.schema else ""
    env.add("0002", "0001", f"    upgrade_fencing(op, {schema})", "    pass")
    command.upgrade(env.config, "head")
    current = _current_schema(site.name)
    assert site.run_in_fencing_schema("SELECT version FROM fencing_schema") == [[(current,)]]
    with fencing.open(site.fencing_url, migrate=False) as store:
        orders = store.collection("orders")
        orders.create("o-2", {"status": "new"})
        intent = fencing.Intent(
            id="task-1", collection="orders", key="o-2", expected_version=1, transition="ship"
        )
        assert orders.commit(intent, {"status": "shipped"}).committed  # keyed by key now
        assert isinstance(orders.commit(intent, {"status": "shipped"}), fencing.Duplicate)
    command.upgrade(env.config, "head")  # nothing more to do
    command.downgrade(env.config, "base")
    assert site.fencing_tables() == set()


def test_a_schema_4_outbox_gains_its_dead_rows_through_the_operation(
    site: Site, tmp_path: Path
) -> None:
    from ..test_outbox_dead import _V4

    env = Environment(site, tmp_path / "migrations")
    command.upgrade(env.config, "head")
    site.run_in_fencing_schema(*_V4[site.name], "UPDATE fencing_schema SET version = 4")
    schema = f"schema={site.schema!r}" if site.schema else ""
    env.add("0002", "0001", f"    upgrade_fencing(op, {schema})", "    pass")
    command.upgrade(env.config, "head")
    current = _current_schema(site.name)
    assert site.run_in_fencing_schema("SELECT version FROM fencing_schema") == [[(current,)]]
    (found,) = site.run_in_fencing_schema("SELECT strikes, dead_at FROM fencing_outbox")
    assert found == []  # the columns are there
    command.upgrade(env.config, "head")  # nothing more to do
    command.downgrade(env.config, "base")
    assert site.fencing_tables() == set()


# -- a table's guard trigger in the migration that creates the table ----------------------
CREATE_ITEMS = """\
    op.create_table(
        "items",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("status", sa.String(40)),
    )
    guard_table(op, "items")"""


def _guarded_chain(env: Environment) -> None:
    """0002 creates ``items`` and guards it in one revision; 0003 removes the guard."""
    env.add(
        "0002", "0001", CREATE_ITEMS, "    unguard_table(op, 'items')\n    op.drop_table('items')"
    )
    env.add("0003", "0002", "    unguard_table(op, 'items')", "    guard_table(op, 'items')")


def _bumps(site: Site) -> bool:
    """Whether an UPDATE of ``items`` row 1 that leaves its version alone moves it."""
    with site.engine().begin() as conn:
        before = conn.exec_driver_sql("SELECT version FROM items WHERE id = 1").scalar_one()
        conn.exec_driver_sql("UPDATE items SET status = 'blind' WHERE id = 1")
        after = conn.exec_driver_sql("SELECT version FROM items WHERE id = 1").scalar_one()
    return bool(after == before + 1)


def _add_item(site: Site) -> None:
    with site.engine().begin() as conn:
        conn.exec_driver_sql("INSERT INTO items (id, version, status) VALUES (1, 1, 'new')")


def _guard_function(site: Site) -> bool:
    """PostgreSQL: whether the guard's function is there (the search path's schema)."""
    with site.engine().connect() as conn:
        found = conn.exec_driver_sql("SELECT to_regprocedure('fencing_guard_items()')")
        return found.scalar_one() is not None


def test_a_migration_creates_a_table_and_guards_it(site: Site, tmp_path: Path) -> None:
    env = Environment(site, tmp_path / "migrations")
    _guarded_chain(env)
    command.upgrade(env.config, "0002")  # the table and its guard, in one revision
    _add_item(site)
    assert _bumps(site)
    command.upgrade(env.config, "head")  # 0003: unguarded
    assert not _bumps(site)
    if site.name == "postgresql":
        assert not _guard_function(site)
    command.downgrade(env.config, "0002")  # guarded again
    assert _bumps(site)
    command.downgrade(env.config, "0001")
    with site.engine().connect() as conn:
        assert "items" not in sqlalchemy.inspect(conn).get_table_names()
    if site.name == "postgresql":
        assert not _guard_function(site)
    command.downgrade(env.config, "base")
    assert site.fencing_tables() == set()


def _refuses(site: Site) -> bool:
    """Whether a blind UPDATE of ``items`` row 1 is refused (a strict guard), the row kept."""
    try:
        with site.engine().begin() as conn:
            conn.exec_driver_sql("UPDATE items SET status = 'blind' WHERE id = 1")
    except sqlalchemy.exc.DBAPIError as exc:
        return "fencing_guard_items: UPDATE refused by fencing (strict)" in str(exc)
    return False


def test_a_migration_guards_strictly_and_the_next_one_switches_modes(
    site: Site, tmp_path: Path
) -> None:
    env = Environment(site, tmp_path / "migrations")
    strict = CREATE_ITEMS.replace(
        'guard_table(op, "items")', 'guard_table(op, "items", mode="strict")'
    )
    env.add("0002", "0001", strict, "    unguard_table(op, 'items')\n    op.drop_table('items')")
    env.add(
        "0003",
        "0002",
        "    guard_table(op, 'items')",
        "    guard_table(op, 'items', mode='strict')",
    )
    command.upgrade(env.config, "0002")
    _add_item(site)
    assert _refuses(site)
    command.upgrade(env.config, "head")  # bump mode: the trigger replaced
    assert not _refuses(site) and _bumps(site)
    command.downgrade(env.config, "0002")  # strict again
    assert _refuses(site)
    script = _sql(env, "0002:head") + _sql(env, "head:0002", down=True)
    assert "refused by fencing (strict)" in script  # offline: the strict trigger written out
    command.downgrade(env.config, "base")


@pytest.fixture
def pg_site(tmp_path: Path) -> Iterator[Site]:
    yield from _pg_site(tmp_path, own_schema=False)


def test_the_migrations_connection_sees_the_table_fencings_own_does_not(pg_site: Site) -> None:
    """Why guard_table takes ``op``: in the migration's transaction (PostgreSQL's DDL is
    transactional), the table it created is not there for fencing's own connections (the
    natural attempt, store.guard_table, fails); on the migration's connection it is."""
    site = pg_site
    with fencing.open(site.fencing_url) as store, site.engine().begin() as conn:
        op = Operations(MigrationContext.configure(conn))
        op.create_table(
            "items",
            sqlalchemy.Column("id", sqlalchemy.Integer, primary_key=True),
            sqlalchemy.Column("version", sqlalchemy.Integer, nullable=False),
        )
        with pytest.raises(fencing.SchemaError, match="does not exist"):
            store.guard_table("items")
        guard_table(op, "items")
        conn.exec_driver_sql("INSERT INTO items (id, version) VALUES (1, 1)")
        conn.exec_driver_sql("UPDATE items SET id = 1")
        assert conn.exec_driver_sql("SELECT version FROM items").scalar_one() == 2


def _sql(env: Environment, *args: Any, down: bool = False) -> str:
    """What ``alembic upgrade --sql`` (or ``downgrade --sql``) writes out."""
    buffer = io.StringIO()
    env.config.output_buffer = buffer
    (command.downgrade if down else command.upgrade)(env.config, *args, sql=True)
    return buffer.getvalue()


def _run_script(site: Site, script: str) -> None:
    """Run an offline migration's script as a client would: statement by statement, the
    script's own BEGIN / COMMIT included (the driver in autocommit mode); a MySQL
    ``DELIMITER //`` block as the one statement it holds."""
    raw = site.engine().raw_connection()
    try:
        driver = raw.driver_connection
        if site.name == "mysql":
            driver.autocommit(True)
        elif site.name == "postgresql":
            driver.autocommit = True
        else:
            driver.isolation_level = None
        cursor = driver.cursor()
        for chunk in script.split(";\n\n"):
            lines = [line for line in chunk.splitlines() if not line.startswith("--")]
            statement = "\n".join(lines).strip()
            if statement.startswith("DELIMITER //"):
                statement = statement.split("\n", 1)[1].split("//\nDELIMITER", 1)[0]
            if statement:
                cursor.execute(statement)
        cursor.close()
    finally:
        raw.close()


def test_offline_migrations_write_the_ddl_a_database_runs(site: Site, tmp_path: Path) -> None:
    env = Environment(site, tmp_path / "migrations")
    _guarded_chain(env)
    script = _sql(env, "0002")  # from nothing: fencing's tables, the table, its guard
    assert "CREATE TABLE IF NOT EXISTS" in script and "fencing_records" in script
    assert script.count("fencing_guard_items") >= 2, script
    assert site.fencing_tables() == set()  # written out, not run
    _run_script(site, script)
    assert site.fencing_tables() == tables_of(site.name)
    with fencing.open(site.fencing_url, migrate="check") as store:  # at this version
        assert store.collection("orders").create("o-1", {"n": 1}).version == 1
    _add_item(site)
    assert _bumps(site)
    _run_script(site, _sql(env, "0002:head"))
    assert not _bumps(site)
    _run_script(site, _sql(env, "head:base", down=True))
    assert site.fencing_tables() == set()
    with site.engine().connect() as conn:
        assert "items" not in sqlalchemy.inspect(conn).get_table_names()


def test_offline_upgrade_from_a_known_version(site: Site, tmp_path: Path) -> None:
    """A database at fencing schema 4 (an outbox without its dead rows): the script of
    upgrade_fencing(op, offline_from=4) brings it to this version."""
    from ..test_outbox_dead import _V4

    env = Environment(site, tmp_path / "migrations")
    command.upgrade(env.config, "head")
    site.run_in_fencing_schema(*_V4[site.name], "UPDATE fencing_schema SET version = 4")
    schema = f", schema={site.schema!r}" if site.schema else ""
    env.add("0002", "0001", f"    upgrade_fencing(op, offline_from=4{schema})", "    pass")
    _run_script(site, _sql(env, "0001:0002"))
    current = _current_schema(site.name)
    assert site.run_in_fencing_schema("SELECT version FROM fencing_schema") == [[(current,)]]
    (found,) = site.run_in_fencing_schema("SELECT strikes, dead_at FROM fencing_outbox")
    assert found == []  # the columns are there
    with fencing.open(site.fencing_url, migrate="check"):
        pass


def test_offline_upgrade_from_the_version_before_superseded_rows(
    site: Site, tmp_path: Path
) -> None:
    """A database at the schema before superseded rows (5; MySQL/MariaDB: 6): the script
    of upgrade_fencing(op, offline_from=that) brings it to this version."""
    from ..test_outbox_supersede import _BEFORE_SUPERSEDED, _PREVIOUS

    name = {"sqlite": "sqlite-file"}.get(site.name, site.name)
    env = Environment(site, tmp_path / "migrations")
    command.upgrade(env.config, "head")
    previous = _PREVIOUS[name]
    site.run_in_fencing_schema(
        *_BEFORE_SUPERSEDED[name], f"UPDATE fencing_schema SET version = {previous}"
    )
    schema = f", schema={site.schema!r}" if site.schema else ""
    env.add("0002", "0001", f"    upgrade_fencing(op, offline_from={previous}{schema})", "    pass")
    _run_script(site, _sql(env, "0001:0002"))
    current = _current_schema(site.name)
    assert site.run_in_fencing_schema("SELECT version FROM fencing_schema") == [[(current,)]]
    (found,) = site.run_in_fencing_schema(
        "SELECT superseded_at, due_at, burst_at FROM fencing_outbox"
    )
    assert found == []  # the columns are there
    with fencing.open(site.fencing_url, migrate="check"):
        pass


# -- the hooks and the refusals, without a server ------------------------------------------
def test_hooks_leave_out_fencing_tables_in_any_schema_and_compose() -> None:
    metadata = sqlalchemy.MetaData()
    ours = sqlalchemy.Table("fencing_records", metadata, sqlalchemy.Column("key", sqlalchemy.Text))
    theirs = sqlalchemy.Table(
        "orders", metadata, sqlalchemy.Column("id", sqlalchemy.Integer), schema="shop"
    )
    index = sqlalchemy.Index("fencing_records_key", ours.c.key)
    assert not include_object(ours, "fencing_records", "table", True, None)
    assert not include_object(index, "fencing_records_key", "index", True, None)
    assert not include_object(ours.c.key, "key", "column", True, None)
    assert include_object(theirs, "orders", "table", True, None)
    assert not include_name("fencing_leases", "table", {"schema_name": "fencing"})
    assert not include_name("fencing_applied_at", "index", {"table_name": "fencing_applied"})
    assert include_name("orders", "table", {"schema_name": None})

    seen: list[str | None] = []

    def mine(obj: Any, name: str | None, type_: str, reflected: bool, to: Any) -> bool:
        seen.append(name)
        return name != "legacy"

    hooks = exclude_fencing(include_object=mine)
    assert not hooks["include_object"](ours, "fencing_records", "table", True, None)
    assert hooks["include_object"](theirs, "orders", "table", True, None)
    assert not hooks["include_object"](theirs, "legacy", "table", True, None)
    assert seen == ["orders", "legacy"]  # the application's hook sees only its own
    assert not hooks["include_name"]("fencing_effects", "table", {})
    assert hooks["include_name"]("orders", "table", {})


def test_operations_refuse_what_they_cannot_do(tmp_path: Path) -> None:
    engine = sqlalchemy.create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    try:
        with engine.begin() as conn:
            with pytest.raises(ConfigurationError, match="PostgreSQL"):
                upgrade_fencing(conn, schema="fencing")
            with pytest.raises(ConfigurationError, match="mssql"):
                upgrade_fencing(_Bound(conn, "mssql"))
            with pytest.raises(ConfigurationError, match="schema"):
                upgrade_fencing(_Bound(conn, "postgresql"), schema='x"; DROP TABLE orders; --')
            upgrade_fencing(Operations(MigrationContext.configure(conn)))
            upgrade_fencing(conn)  # again: at this version, nothing to do
            names = set(sqlalchemy.inspect(conn).get_table_names())
            assert names == tables_of("sqlite-file")
            downgrade_fencing(conn)
            assert set(sqlalchemy.inspect(conn).get_table_names()) == set()
        offline = MigrationContext.configure(
            dialect_name="sqlite", opts={"as_sql": True, "output_buffer": _Sink()}
        )
        with pytest.raises(ConfigurationError, match="offline_from=N"):
            upgrade_fencing(Operations(offline))
        with pytest.raises(ConfigurationError, match="offline_from=9"):
            upgrade_fencing(Operations(offline), offline_from=9)
    finally:
        engine.dispose()


class _Bound:
    """An ``op`` whose connection claims another dialect."""

    def __init__(self, conn: Any, dialect: str) -> None:
        self.conn, self.dialect = conn, dialect

    def get_bind(self) -> Any:
        bind = self.conn
        fake = type("Dialect", (), {"name": self.dialect})()
        return type("Bind", (), {"dialect": fake, "execute": bind.execute})()


class _Sink:
    def write(self, text: str) -> None:
        pass

    def flush(self) -> None:
        pass


def test_module_docstring_names_what_exists() -> None:
    import fencing.contrib.alembic as module

    doc = textwrap.dedent(module.__doc__ or "")
    for name in ("upgrade_fencing", "downgrade_fencing", "exclude_fencing", "guard_table"):
        assert name in doc and hasattr(module, name)


@pytest.fixture(params=["postgresql-own-schema", "mysql"])
def server_site(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Site]:
    if request.param == "mysql":
        yield from _mysql_site()
    else:
        yield from _pg_site(tmp_path, own_schema=True)


ASYNC_DRIVERS = {"postgresql": "postgresql+psycopg_async", "mysql": "mysql+aiomysql"}


def test_an_async_env_runs_the_operation_through_run_sync(server_site: Site) -> None:
    """Alembic's async template: the migration runs in ``connection.run_sync``."""
    import asyncio

    from sqlalchemy.ext.asyncio import create_async_engine

    site = server_site

    def migrate(conn: Any) -> None:
        upgrade_fencing(Operations(MigrationContext.configure(conn)), schema=site.schema)

    async def go() -> None:
        url = sqlalchemy.engine.make_url(site.sa_url).set(drivername=ASYNC_DRIVERS[site.name])
        engine = create_async_engine(url)
        try:
            async with engine.begin() as conn:
                await conn.run_sync(migrate)
        finally:
            await engine.dispose()

    asyncio.run(go())
    assert site.fencing_tables() == tables_of(site.name)
    _commit_works(site.fencing_url)
