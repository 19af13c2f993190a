"""`fencing migrate` and `fencing inspect` on a SQLite file."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

import fencing
from fencing._cli import main


def test_migrate_creates_tables_and_is_idempotent(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'app.db'}"
    assert main(["migrate", url]) == 0
    assert main(["migrate", url]) == 0
    conn = sqlite3.connect(tmp_path / "app.db")
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    conn.close()
    assert {"fencing_records", "fencing_applied", "fencing_leases", "fencing_schema"} <= names


def test_open_without_migrate_reports_schema_error(tmp_path: Path) -> None:
    store = fencing.open(f"sqlite:///{tmp_path / 'empty.db'}", migrate=False)
    with pytest.raises(fencing.SchemaError):
        store.collection("orders").get("o-1")
    store.close()


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'app.db'}"
    fencing.open(url).close()
    conn = sqlite3.connect(tmp_path / "app.db")
    conn.execute("UPDATE fencing_schema SET version = 999")
    conn.commit()
    conn.close()
    with pytest.raises(fencing.SchemaError, match="newer"):
        fencing.open(url)


def test_inspect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'app.db'}"
    with fencing.open(url) as store:
        store.collection("orders").create("o-1", {"status": "new"})
    assert main(["inspect", url, "orders", "o-1"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["version"] == 1 and shown["state"] == {"status": "new"}
    assert main(["inspect", url, "orders", "nope"]) == 1


def test_bad_url_is_a_clean_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["migrate", "bogus://x"]) == 2
    assert "ConfigurationError" in capsys.readouterr().err
