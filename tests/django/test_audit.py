"""The Django trial's blind writers (issue 22, item 2), under pytest-django in a
subprocess (project/audited/pytest_audit.py, settings ``testproject.settings_audit``), on
SQLite, PostgreSQL and MariaDB: a full-row ``save()`` of a stale plain instance, a
``save(update_fields=...)`` and ``QuerySet.update()`` are each refused by the strict
guard (``GuardTable(..., mode="strict")``) and each reported by the ``fencing_audit``
marker, which names the statement and the test; ``FencedModel`` saves, its
``QuerySet.update()`` and a fenced commit are neither."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests._backends import require_server

from .test_django import PROJECT, SERVERS, databases, environ, manage

pytest.importorskip("django", reason="pip install 'fencing[django]'")

REPORTED = {
    # the statement as Django sent it (quoted "x" or `x`): the version set blindly ...
    "test_reported_full_row_save_of_a_stale_instance": r"UPDATE .audited_sack. SET .version. = %s",
    # ... or left out
    "test_reported_queryset_update": r"UPDATE .audited_sack. SET .status. = %s WHERE",
    "test_reported_save_of_some_fields": r"UPDATE .audited_sack. SET .status. = %s WHERE",
    "test_reported_and_refused": r"UPDATE .audited_crate. SET .status. = %s WHERE",
    # allow="fencing": a FencedModel save moves the version, but is not fencing's commit
    "test_reported_outside_fencing": r"outside fencing \(django\): UPDATE .audited_box.",
}


@pytest.mark.slow
@pytest.mark.parametrize("vendor", ["sqlite", "postgresql", "mysql"])
def test_the_django_trials_blind_writers_are_refused_and_reported(
    vendor: str, tmp_path: Path
) -> None:
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
        "COLUMNS": "1000",  # the summary's lines whole
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run(
        [
            *(sys.executable, "-W", "error", "-m", "pytest", "-p", "fencing.testing.pytest_plugin"),
            *("--ds", "testproject.settings_audit", "-q", "-rf", "--strict-markers"),
            "audited/pytest_audit.py",
        ],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 1 and "5 failed, 3 passed" in output, output
    for test in REPORTED:
        nodeid = f"audited/pytest_audit.py::{test}"
        assert f"FAILED {nodeid} - fencing.testing._audit.BlindWriteError" in output, output
        assert f"{nodeid}: UPDATE of table " in output, output
    for test, statement in REPORTED.items():
        part = output.split(f"_ {test} _", 1)[1]
        assert "BlindWriteError" in part and re.search(statement, part), (test, output)
    if vendor == "sqlite":
        assert sorted(p.name for p in tmp_path.iterdir()) == [], output
    else:
        assert databases(vendor, name) == [], output


def test_the_audited_apps_migration_is_as_its_models_say(tmp_path: Path) -> None:
    done, _ = manage(
        "sqlite",
        tmp_path,
        "makemigrations",
        "audited",
        "--check",
        "--dry-run",
        "--settings=testproject.settings_audit",
    )
    assert done.returncode == 0 and "No changes detected" in done.stdout, done.stdout + done.stderr


def test_fencing_migrate_guards_a_model_strictly(tmp_path: Path) -> None:
    audit = "--settings=testproject.settings_audit"
    done, _ = manage("sqlite", tmp_path, "migrate", audit)
    assert done.returncode == 0, done.stderr
    args = ("fencing_migrate", "--guard-model", "audited.Sack", "--guard-mode", "strict", audit)
    done, _ = manage("sqlite", tmp_path, *args)
    assert done.returncode == 0, done.stderr
    assert "guarded model audited.Sack (table audited_sack, strict)" in done.stdout
    with sqlite3.connect(tmp_path / "shop.sqlite3") as conn:
        conn.execute("INSERT INTO audited_sack (id, version, status) VALUES (1, 1, 'new')")
        with pytest.raises(sqlite3.IntegrityError, match="fencing_guard_audited_sack: UPDATE"):
            conn.execute("UPDATE audited_sack SET status = 'blind' WHERE id = 1")
        conn.execute("UPDATE audited_sack SET status = 'moved', version = version + 1")
        assert conn.execute("SELECT version, status FROM audited_sack").fetchall() == [(2, "moved")]
