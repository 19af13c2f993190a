"""fencing.contrib.django in a real Django project (tests/django/project): its own test
suite (project/shop/tests.py) runs under ``manage.py test`` on SQLite, PostgreSQL (psycopg 3,
and psycopg2) and MariaDB (PyMySQL installed as MySQLdb, and mysqlclient), each in a
subprocess, so this process never
configures Django. Each run must exit 0 and leave no test database behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests._backends import require_server
from tests._lenders import require_module
from tests.test_report_browser import chromium, decode_png  # noqa: F401 (a fixture)

pytest.importorskip("django", reason="pip install 'fencing[django]'")

PROJECT = Path(__file__).resolve().parent / "project"
SERVERS = {"postgresql": ("PostgreSQL", 5432), "mysql": ("MariaDB", 3306)}
#: Django's database, by FENCING_DJANGO_DB (testproject/settings.py), and the driver
#: module a vendor's Django connections need (an extra, ``require_driver``)
VENDORS = ["sqlite", "postgresql", "postgresql-psycopg2", "mysql", "mysql-mysqlclient"]
_DRIVERS = {"postgresql-psycopg2": "psycopg2", "mysql-mysqlclient": "MySQLdb"}


def require(vendor: str) -> None:
    """Skip (laptop) or fail (CI) when the vendor's server or driver is missing."""
    server = SERVERS.get(vendor.split("-", 1)[0])
    if server is not None:
        require_server(server[0], "127.0.0.1", server[1])
    if vendor in _DRIVERS:
        require_module(_DRIVERS[vendor])


def environ() -> dict[str, str]:
    """This process's environment for a subprocess in the project's directory: a
    relative PYTHONPATH (``PYTHONPATH=src``) made absolute, so the subprocess imports
    the same fencing as this process."""
    env = dict(os.environ)
    if env.get("PYTHONPATH"):
        parts = env["PYTHONPATH"].split(os.pathsep)
        env["PYTHONPATH"] = os.pathsep.join(str(Path(p).resolve()) if p else p for p in parts)
    return env


def manage(vendor: str, tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], str]:
    name = f"test_fencing_django_{uuid.uuid4().hex[:10]}"
    env = {
        **environ(),
        "FENCING_DJANGO_DB": vendor,
        "FENCING_DJANGO_DIR": str(tmp_path),
        "FENCING_DJANGO_TEST_NAME": name,
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run(
        [sys.executable, "-W", "error", "manage.py", *args],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    return done, name


def databases(vendor: str, name: str) -> list[str]:
    """The databases named ``name`` left on the server."""
    if vendor.startswith("postgresql"):
        import psycopg

        with psycopg.connect("host=127.0.0.1 port=5432 user=root dbname=test") as conn:
            rows = conn.execute("SELECT datname FROM pg_database WHERE datname = %s", (name,))
            return [row[0] for row in rows]
    import pymysql

    conn = pymysql.connect(host="127.0.0.1", port=3306, user="root")
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW DATABASES LIKE %s", (name,))
            return [row[0] for row in cur.fetchall()]
    finally:
        conn.close()


@pytest.mark.slow
@pytest.mark.parametrize("vendor", VENDORS)
def test_manage_py_test_passes_and_leaves_no_test_database(vendor: str, tmp_path: Path) -> None:
    """The whole suite of the project on each database and driver: psycopg2's and
    mysqlclient's Django connections given to store.using() (its tests' fenced commits
    inside Django's transactions) as psycopg 3's and PyMySQL's."""
    require(vendor)
    done, name = manage(vendor, tmp_path, "test", "shop", "--noinput", "-v", "2")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    ran = re.search(r"^Ran (\d+) tests", output, re.M)
    assert ran is not None and int(ran.group(1)) >= 20 and "\nOK" in output, output
    if vendor == "sqlite":
        assert sorted(p.name for p in tmp_path.iterdir()) == [], output  # no -wal, -shm
    else:
        assert databases(vendor, name) == [], output


def test_the_migration_is_as_the_models_say(tmp_path: Path) -> None:
    """VersionField deconstructs to what the committed migration has."""
    done, _ = manage("sqlite", tmp_path, "makemigrations", "shop", "--check", "--dry-run")
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_first_use_inside_atomic_does_not_wait_on_its_own_lock(tmp_path: Path) -> None:
    """SQLite: the store is opened when Django connects, before Django's transaction
    takes the write lock (opened inside it, it waited 30 s: "database is locked")."""
    env = {**environ(), "FENCING_DJANGO_DB": "sqlite", "FENCING_DJANGO_DIR": str(tmp_path)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run(
        [sys.executable, "-W", "error", "first_use.py"],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    version, seconds = done.stdout.split()
    assert version == "1" and float(seconds) < 5, done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("vendor", ["sqlite", "postgresql", "mysql"])
def test_pytest_django_runs_the_project_without_a_custom_runner(
    vendor: str, tmp_path: Path
) -> None:
    """pytest-django over the same project (project/pytest.ini, shop/pytest_checks.py):
    a fenced task in a test's transaction through fencing.contrib.django.testing, and
    no test database left behind."""
    pytest.importorskip("pytest_django", reason="pip install pytest-django")
    if vendor in SERVERS:
        label, port = SERVERS[vendor]
        require_server(label, "127.0.0.1", port)
    name = f"test_fencing_django_{uuid.uuid4().hex[:10]}"
    env = {
        **environ(),
        "FENCING_DJANGO_DB": vendor,
        "FENCING_DJANGO_DIR": str(tmp_path),
        "FENCING_DJANGO_TEST_NAME": name,
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run(
        [sys.executable, "-W", "error", "-m", "pytest", "-q", "shop/pytest_checks.py"],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "3 passed" in output, output
    if vendor == "sqlite":
        assert sorted(p.name for p in tmp_path.iterdir()) == [], output
    else:
        assert databases(vendor, name) == [], output


@pytest.mark.slow
def test_the_admin_conflict_page_in_headless_chromium(chromium: str, tmp_path: Path) -> None:  # noqa: F811
    """The live server's admin, a stale change form posted by the browser itself
    (project/shop/browser.py): the page Chromium renders says the order changed
    meanwhile, with its current values; the DOM and the screenshot are in tmp_path."""
    shots = tmp_path / "shots"
    shots.mkdir()
    env = {**environ(), "FENCING_CHROMIUM": chromium, "FENCING_DJANGO_SHOTS": str(shots)}
    env.update(FENCING_DJANGO_DB="sqlite", FENCING_DJANGO_DIR=str(tmp_path))
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run(
        [sys.executable, "-W", "error", "manage.py", "test", "shop.browser", "--noinput"],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "Ran 1 test" in output, output
    dom = (shots / "conflict.html").read_text()
    assert "was changed by someone else after you opened this page" in dom
    assert "Status: shipped" in dom
    width, height, colours = decode_png((shots / "conflict.png").read_bytes())
    assert (width, height) == (1280, 900)
    assert len(colours) > 50  # a page was drawn (the DOM above says which)


@pytest.mark.slow
@pytest.mark.parametrize("vendor", ["sqlite", "postgresql", "mysql"])
def test_manage_py_test_parallel_follows_the_test_database_clones(
    vendor: str, tmp_path: Path
) -> None:
    """``manage.py test --parallel 2``: each worker process's store follows its own clone
    of the test database (Django renames it after the store's settings were read), and
    neither the test database nor its clones are left behind."""
    require(vendor)
    done, name = manage(vendor, tmp_path, "test", "shop", "--noinput", "--parallel", "2")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    ran = re.search(r"^Ran (\d+) tests", output, re.M)
    assert ran is not None and int(ran.group(1)) >= 20 and "\nOK" in output, output
    assert "Cloning test database" in output or "clone" in output.lower(), output
    if vendor == "sqlite":
        assert sorted(p.name for p in tmp_path.iterdir()) == [], output
    else:
        for db in (name, f"{name}_1", f"{name}_2"):
            assert databases(vendor, db) == [], output


@pytest.fixture(scope="session")
def django_42(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Django 4.2 LTS installed on its own (``pip install --target``, no dependencies:
    the same asgiref and sqlparse serve both), put first on a subprocess's path."""
    target = tmp_path_factory.mktemp("django42")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--target",
            str(target),
            "Django>=4.2,<5",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        message = f"cannot install Django 4.2: {done.stderr[-2000:]}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return target


@pytest.mark.slow
@pytest.mark.parametrize("vendor", ["sqlite", "postgresql", "mysql"])
def test_manage_py_test_passes_on_django_4_2(
    vendor: str, tmp_path: Path, django_42: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The project's whole suite on Django 4.2 LTS, the oldest Django supported."""
    require(vendor)
    monkeypatch.setenv(
        "PYTHONPATH",
        os.pathsep.join(p for p in (str(django_42), os.environ.get("PYTHONPATH")) if p),
    )
    done, name = manage(vendor, tmp_path, "test", "shop", "--noinput", "-v", "2")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    version = subprocess.run(
        [sys.executable, "-c", "import django; print(django.get_version())"],
        env=environ(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert version.startswith("4.2."), version
    ran = re.search(r"^Ran (\d+) tests", output, re.M)
    assert ran is not None and int(ran.group(1)) >= 20 and "\nOK" in output, output
    if vendor != "sqlite":
        assert databases(vendor, name) == [], output
