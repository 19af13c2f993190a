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


def _stale_charge(url: str) -> str:
    """A charge recorded for an order that was cancelled before the charge committed."""
    with fencing.open(url) as store:
        orders = store.collection("orders")
        orders.create("o-1", {"status": "new"})
        late = orders.intent("o-1", "charge")
        fx = orders.effect_done(orders.effect(late, "charge", detail={"amount": 5}))
        orders.commit(orders.intent("o-1", "cancel"), {"status": "cancelled"})
        assert isinstance(orders.commit(late, {"status": "charged"}), fencing.Stale)
        return fx.idempotency_key


def test_reconcile_lists_until_marked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'app.db'}"
    key = _stale_charge(url)
    assert main(["reconcile", url, "--json"]) == 0
    (listed,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert listed["idempotency_key"] == key
    assert (listed["outcome"], listed["status"], listed["reconciled"]) == ("stale", "done", False)
    assert listed["collection"] == "orders" and listed["key"] == "o-1"
    assert main(["reconcile", url, "--fail-if-any"]) == 1
    text = capsys.readouterr().out
    assert key in text and "stale" in text

    assert main(["reconcile", url, "--mark", key]) == 0
    out = capsys.readouterr().out
    assert f"{key} marked reconciled" in out and "no effect needs reconciling" in out
    assert main(["reconcile", url, "--mark", key, "--fail-if-any"]) == 0  # idempotent
    assert "was already reconciled" in capsys.readouterr().out
    with fencing.open(url) as store:
        effect = store.get_effect(key)
        assert effect is not None and effect.reconciled and effect.outcome == "stale"


def test_reconcile_bad_input_is_a_clean_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'app.db'}"
    key = _stale_charge(url)
    assert main(["reconcile", url, "--mark", "not-a-key"]) == 2
    assert "InvalidInput" in capsys.readouterr().err
    assert main(["reconcile", url, "--mark", "fx_" + "0" * 40]) == 2
    assert "RecordNotFound" in capsys.readouterr().err
    assert main(["reconcile", url, "--limit", "0"]) == 2
    assert "InvalidInput" in capsys.readouterr().err
    with fencing.open(url) as store:
        assert [e.idempotency_key for e in store.effects_to_reconcile()] == [key]


def test_reconcile_lists_pending_effects_on_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import time

    url = f"sqlite:///{tmp_path / 'app.db'}"
    with fencing.open(url) as store:
        orders = store.collection("orders")
        orders.create("o-1", {"status": "new"})
        key = orders.effect(orders.intent("o-1", "charge"), "charge").idempotency_key
    time.sleep(0.2)
    assert main(["reconcile", url, "--fail-if-any"]) == 0  # not settled: not listed
    capsys.readouterr()
    assert main(["reconcile", url, "--pending-for", "0.1", "--fail-if-any"]) == 1
    out = capsys.readouterr().out
    assert key in out and "no effect needs reconciling" in out
    assert main(["reconcile", url, "--pending-for", "0.1", "--mark", key, "--fail-if-any"]) == 0
