"""fencing.contrib.django from the outside, as ``manage.py`` runs it (each command in a
subprocess, on a database of its own): the migration operations (``migrate`` from empty
and back to zero, ``sqlmigrate``, ``--database`` and routers), the system checks, and
the ``fencing_*`` management commands; on SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import fencing
from tests._backends import require_server

pytest.importorskip("django", reason="pip install 'fencing[django]'")

PROJECT = Path(__file__).resolve().parent / "project"
SERVERS = {"postgresql": ("PostgreSQL", 5432), "mysql": ("MariaDB", 3306)}
VENDORS = ["sqlite", "postgresql", "mysql"]
TRIGGER = "fencing_guard_guarded_parcel"


class Project:
    """The test project on a fresh database of ``vendor``, dropped afterwards."""

    def __init__(self, vendor: str, tmp_path: Path) -> None:
        self.vendor, self.dir = vendor, tmp_path
        self.kind = vendor.split("-", 1)[0]  # postgresql-psycopg2, mysql-mysqlclient: the server
        self.name = f"fdj_{uuid.uuid4().hex[:10]}"
        self.env = {
            **os.environ,
            "FENCING_DJANGO_DB": vendor,
            "FENCING_DJANGO_DIR": str(tmp_path),
            "FENCING_DJANGO_NAME": self.name,
            # the tables are the migrations' to make: a store never makes them itself
            "FENCING_DJANGO_MIGRATE": "check",
            "PYTHONDONTWRITEBYTECODE": "1",
            # the fencing this process imported (a relative PYTHONPATH=src would not
            # reach it from the project's directory)
            "PYTHONPATH": os.pathsep.join(
                [str(Path(fencing.__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]
            ),
        }
        self.env.pop("DJANGO_SETTINGS_MODULE", None)

    def manage(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-W", "error", "manage.py", *args],
            cwd=PROJECT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        if ok:
            assert done.returncode == 0, done.stdout + done.stderr
        return done

    def query(self, sql: str, *params: object) -> list[tuple[object, ...]]:
        if self.kind == "sqlite":
            with sqlite3.connect(self.dir / "shop.sqlite3") as conn:
                return list(conn.execute(sql.replace("%s", "?"), params))
        if self.kind == "postgresql":
            import psycopg

            dsn = f"host=127.0.0.1 port=5432 user=root dbname={self.name}"
            with psycopg.connect(dsn) as conn:
                cur = conn.execute(sql, params)
                return list(cur.fetchall()) if cur.description else []
        import pymysql

        conn = pymysql.connect(host="127.0.0.1", port=3306, user="root", database=self.name)
        try:
            with conn.cursor() as cur:
                cur.execute(sql, params or None)
                rows = list(cur.fetchall())
            conn.commit()
            return rows
        finally:
            conn.close()

    def fencing_tables(self) -> list[str]:
        if self.kind == "sqlite":
            sql = "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'fencing%'"
        elif self.kind == "postgresql":  # the project keeps them in a schema "fencing"
            sql = "SELECT tablename FROM pg_tables WHERE schemaname = 'fencing'"
        else:
            sql = (
                "SELECT TABLE_NAME FROM information_schema.TABLES"
                " WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE 'fencing%'"
            )
        return sorted(str(row[0]) for row in self.query(sql))

    def triggers(self) -> list[str]:
        if self.kind == "sqlite":
            sql = "SELECT name FROM sqlite_master WHERE type = 'trigger'"
        elif self.kind == "postgresql":
            sql = "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal"
        else:
            sql = (
                "SELECT TRIGGER_NAME FROM information_schema.TRIGGERS"
                " WHERE TRIGGER_SCHEMA = DATABASE()"
            )
        return sorted(str(row[0]) for row in self.query(sql))

    def create(self) -> None:
        if self.kind == "postgresql":
            import psycopg

            dsn = "host=127.0.0.1 port=5432 user=root dbname=test"
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(f"CREATE DATABASE {self.name}")
        elif self.kind == "mysql":
            import pymysql

            conn = pymysql.connect(host="127.0.0.1", port=3306, user="root")
            try:
                with conn.cursor() as cur:
                    cur.execute(f"CREATE DATABASE {self.name}")
            finally:
                conn.close()

    def drop(self) -> None:
        if self.kind == "postgresql":
            import psycopg

            dsn = "host=127.0.0.1 port=5432 user=root dbname=test"
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")
        elif self.kind == "mysql":
            import pymysql

            conn = pymysql.connect(host="127.0.0.1", port=3306, user="root")
            try:
                with conn.cursor() as cur:
                    cur.execute(f"DROP DATABASE IF EXISTS {self.name}")
            finally:
                conn.close()


@pytest.fixture(params=VENDORS)
def project(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Project]:
    vendor = request.param
    if vendor in SERVERS:
        require_server(*SERVERS[vendor][:1], "127.0.0.1", SERVERS[vendor][1])
    made = Project(vendor, tmp_path)
    made.create()
    try:
        yield made
    finally:
        made.drop()


ALL_TABLES = {
    "sqlite": [
        "fencing_applied",
        "fencing_effects",
        "fencing_fences",
        "fencing_leases",
        "fencing_outbox",
        "fencing_outbox_claims",
        "fencing_records",
        "fencing_schema",
        "fencing_tombstones",
    ],
}
ALL_TABLES["mysql"] = ALL_TABLES["sqlite"]
ALL_TABLES["postgresql"] = [t for t in ALL_TABLES["sqlite"] if t != "fencing_outbox_claims"]


@pytest.mark.slow
def test_migrate_from_empty_and_back_to_zero(project: Project) -> None:
    assert project.fencing_tables() == []
    done = project.manage("migrate")
    assert done.stderr == ""  # (SQLite: no store opened early to complain of no tables)
    assert "Applying fencing.0001_initial... OK" in done.stdout
    assert "Applying guarded.0002_guard_parcel... OK" in done.stdout
    assert project.fencing_tables() == ALL_TABLES[project.vendor]
    expected = [TRIGGER, "fencing_guardlow_guarded_parcel"] if project.vendor == "sqlite" else []
    assert set(project.triggers()) == {TRIGGER, *expected}
    # the guard is there: a blind UPDATE moves the version on
    project.query("INSERT INTO guarded_parcel (version, status) VALUES (1, 'new')")
    project.query("UPDATE guarded_parcel SET status = 'shipped'")
    assert project.query("SELECT version FROM guarded_parcel") == [(2,)]
    # GuardTable backwards: the trigger goes, the table stays
    done = project.manage("migrate", "guarded", "0001")
    assert "Unapplying guarded.0002_guard_parcel... OK" in done.stdout
    assert project.triggers() == []
    project.query("UPDATE guarded_parcel SET status = 'lost'")
    assert project.query("SELECT version FROM guarded_parcel") == [(2,)]
    project.manage("migrate", "guarded")
    assert TRIGGER in project.triggers()
    # and the store opens on them (FENCING["MIGRATE"] = "check" refuses it otherwise)
    stats = json.loads(project.manage("fencing_stats", "--json").stdout)
    assert stats["store"] == project.vendor

    done = project.manage("migrate", "fencing", "zero")
    assert "Unapplying guarded.0002_guard_parcel... OK" in done.stdout
    assert "Unapplying fencing.0001_initial... OK" in done.stdout
    assert project.fencing_tables() == []
    assert project.triggers() == []
    assert project.manage("fencing_stats", ok=False).returncode == 2  # not migrated

    project.manage("migrate")  # and forwards again
    assert project.fencing_tables() == ALL_TABLES[project.vendor]
    assert TRIGGER in project.triggers()


@pytest.mark.slow
def test_sqlmigrate_shows_the_statements_and_runs_none(project: Project) -> None:
    tables = project.manage("sqlmigrate", "fencing", "0001").stdout
    assert "-- Create fencing's tables (or upgrade them to this fencing's schema)" in tables
    assert "CREATE TABLE IF NOT EXISTS" in tables and "fencing_outbox" in tables
    assert "THIS OPERATION CANNOT BE WRITTEN AS SQL" not in tables
    if project.vendor == "postgresql":
        assert 'CREATE SCHEMA IF NOT EXISTS "fencing";' in tables
        assert 'CREATE TABLE IF NOT EXISTS "fencing".fencing_records' in tables
    back = project.manage("sqlmigrate", "fencing", "0001", "--backwards").stdout
    assert "DROP TABLE IF EXISTS" in back and "fencing_schema" in back

    guard = project.manage("sqlmigrate", "guarded", "0002").stdout
    assert "-- Install fencing's guard trigger on Parcel" in guard
    create = {
        "sqlite": f'CREATE TRIGGER "{TRIGGER}" AFTER UPDATE ON "guarded_parcel"',
        "postgresql": f'CREATE OR REPLACE TRIGGER "{TRIGGER}" BEFORE UPDATE ON'
        ' "public"."guarded_parcel"',
        "mysql": f"CREATE TRIGGER `{TRIGGER}` BEFORE UPDATE ON `guarded_parcel`",
    }[project.vendor]
    assert create in guard, guard
    unguard = project.manage("sqlmigrate", "guarded", "0002", "--backwards").stdout
    assert "DROP TRIGGER IF EXISTS" in unguard and TRIGGER in unguard
    assert "CREATE" not in unguard
    # nothing was run
    assert project.fencing_tables() == []


@pytest.mark.slow
def test_routers_and_database_keep_fencing_off_another_database(tmp_path: Path) -> None:
    project = Project("sqlite", tmp_path)
    settings = "--settings=testproject.settings_router"
    project.manage("migrate", "--database", "other", settings)
    with sqlite3.connect(tmp_path / "other.sqlite3") as conn:
        names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    assert "shop_order" in names  # migrated there
    assert not {n for n in names if n.startswith(("fencing", "guarded"))}
    refused = project.manage("fencing_migrate", "--database", "other", settings, ok=False)
    assert refused.returncode == 1
    assert "allow_migrate keeps fencing's tables off database 'other'" in refused.stderr


def test_check_warns_about_a_broken_model_and_databases_fencing_cannot_use(
    tmp_path: Path,
) -> None:
    project = Project("sqlite", tmp_path)
    done = project.manage("check", "--settings", "testproject.settings_broken")
    out = done.stderr
    assert (
        "broken.Ledger: (fencing.W001) broken.Ledger is a FencedModel with a version field of"
        " type IntegerField, not VersionField: its saves are not conditional" in out
    ), out
    assert "?: (fencing.W002) fencing cannot use the database 'default': Django's database" in out
    assert "is an in-memory SQLite database" in out
    assert (
        "?: (fencing.W002) fencing cannot use the database 'legacy': fencing has no backend" in out
    )
    assert "System check identified 3 issues (0 silenced)." in out
    clean = project.manage("check")
    assert "System check identified no issues (0 silenced)." in clean.stdout, clean.stderr


ALTER_FIELD = """
from django.db import connection, models
from guarded.models import Parcel
new = models.CharField(max_length=40, default="new")
new.set_attributes_from_name("status")
new.model = Parcel
with connection.schema_editor() as editor:
    editor.alter_field(Parcel, Parcel._meta.get_field("status"), new)
"""


@pytest.mark.slow
def test_check_warns_about_a_guard_gone_missing(project: Project) -> None:
    project.manage("migrate")
    assert "no issues" in project.manage("check", "--database", "default").stdout
    if project.vendor == "sqlite":  # Django's AlterField rebuilds the table, without it
        project.manage("shell", "-v", "0", "-c", ALTER_FIELD)
    elif project.vendor == "postgresql":
        project.query(f'DROP TRIGGER "{TRIGGER}" ON guarded_parcel')
    else:
        project.query(f"DROP TRIGGER {TRIGGER}")
    assert TRIGGER not in project.triggers()
    done = project.manage("check", "--database", "default")
    assert (
        "guarded.Parcel: (fencing.W003) the guard trigger the migrations installed is missing"
        " from table 'guarded_parcel' on database 'default'" in done.stderr
    ), done.stderr
    # a check of the settings only (no --database) asks no database
    assert "no issues" in project.manage("check").stdout
    # an unreachable database: nothing to say about it
    assert "no issues" in project.manage("check", "--database", "odd").stdout
    # installed again by the command
    done = project.manage("fencing_migrate", "--guard-model", "guarded.Parcel")
    assert "guarded model guarded.Parcel (table guarded_parcel)" in done.stdout
    assert "no issues" in project.manage("check", "--database", "default").stdout


@pytest.mark.slow
def test_the_commands_run_on_the_alias_store(project: Project) -> None:
    done = project.manage("fencing_migrate")
    assert done.stdout.startswith(f"migrated {project.vendor}")
    assert project.fencing_tables() == ALL_TABLES[project.vendor]
    project.manage("migrate")
    done = project.manage("fencing_reconcile")
    assert done.stdout == "no effect needs reconciling\n"
    stats = json.loads(project.manage("fencing_stats", "--json").stdout)
    assert stats["outbox"] == {"dead": 0, "oldest_age": 0.0, "pending": 0, "superseded": 0}
    unknown = project.manage("fencing_stats", "--database", "nope", ok=False)
    assert unknown.returncode == 1
    assert "no database 'nope' in settings.DATABASES" in unknown.stderr
    assert "--database" in project.manage("fencing_relay", "--help").stdout
    assert "url" not in project.manage("fencing_relay", "--help").stdout.split("options:")[0]


SEND = """
from fencing.contrib.django import outbox_send
from shop.models import Order
from shop.queue import ship
order = Order.objects.create(status="paid")
print(outbox_send(ship, order, "ship", queue={queue!r}).id)
"""


@pytest.mark.slow
def test_fencing_relay_publishes_the_alias_outbox(project: Project) -> None:
    require_server("Redis", "127.0.0.1", 6379)
    import redis

    queue = f"fdj_{uuid.uuid4().hex[:10]}"
    broker = redis.Redis(host="127.0.0.1", port=6379, db=11)
    project.manage("migrate")
    try:
        project.manage("shell", "-v", "0", "-c", SEND.format(queue=queue))
        relay = ("fencing_relay", "--queue", "celery", "--app", "shop.queue:app", "--once")
        done = project.manage(*relay, "--quiet")
        assert done.stdout.startswith(
            "published 1 row(s), marked 1, failed 0, held back 0, dead 0; 0 pending"
        ), done.stdout + done.stderr
        assert broker.llen(queue) == 1
        message = json.loads(broker.lindex(queue, 0) or b"{}")
        assert message["headers"]["task"] == "shop.queue.ship"
    finally:
        broker.delete(queue)
        broker.close()


STALE_EFFECT = """
from fencing.contrib.django import store
from shop.models import Order
order = Order.objects.create(status="paid")
orders = store().table(Order)
intent = order.intent("charge")
effect = orders.effect(intent, "charge")
Order.objects.filter(pk=order.pk).update(status="cancelled")
assert orders.commit(intent, {"status": "charged"}).kind == "stale"
print(effect.idempotency_key)
"""


@pytest.mark.slow
def test_fencing_reconcile_lists_and_marks_the_alias_effects(project: Project) -> None:
    project.manage("migrate")
    key = project.manage("shell", "-v", "0", "-c", STALE_EFFECT).stdout.strip()
    failed = project.manage("fencing_reconcile", "--fail-if-any", "--json", ok=False)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    (listed,) = [json.loads(line) for line in failed.stdout.splitlines()]
    assert (listed["idempotency_key"], listed["name"]) == (key, "charge")
    assert "CommandError: fencing: effects need reconciling" in failed.stderr
    done = project.manage("fencing_reconcile", "--mark", key, "--fail-if-any")
    assert done.stdout.startswith(f"{key} marked reconciled\n"), done.stdout
    again = project.manage("fencing_reconcile", "--mark", key)
    assert again.stdout.startswith(f"{key} was already reconciled\n")


IN_A_FAILED_MIGRATION = """
from django.db import connection
from django.db.migrations.state import ProjectState
from fencing.contrib.django.operations import CreateFencingTables
state = ProjectState()
try:
    with connection.schema_editor(atomic=True) as editor:
        CreateFencingTables().database_forwards("fencing", editor, state, state)
        raise RuntimeError("the migration's next operation failed")
except RuntimeError:
    print("rolled back")
"""

UPGRADE = """
from django.db import connection
from django.db.migrations.state import ProjectState
from fencing.contrib.django.operations import UpgradeFencingTables
state = ProjectState()
with connection.schema_editor() as editor:
    UpgradeFencingTables().database_forwards("fencing", editor, state, state)
with connection.schema_editor() as editor:
    UpgradeFencingTables().database_backwards("fencing", editor, state, state)
"""


@pytest.mark.slow
@pytest.mark.parametrize("project", ["sqlite", "postgresql"], indirect=True)  # (MySQL: DDL commits)
def test_the_tables_are_made_in_the_migration_transaction(project: Project) -> None:
    done = project.manage("shell", "-v", "0", "-c", IN_A_FAILED_MIGRATION)
    assert done.stdout == "rolled back\n", done.stdout + done.stderr
    assert project.fencing_tables() == []


@pytest.mark.slow
def test_an_upgrade_makes_the_tables_and_is_kept_going_backwards(project: Project) -> None:
    project.manage("shell", "-v", "0", "-c", UPGRADE)
    assert project.fencing_tables() == ALL_TABLES[project.vendor]
