"""NaN, infinity and size (issue 18, item 14).

A ``Decimal`` whose text is tiny but whose positional form is huge (``1E+400000000``)
is refused before anything is bound, in a table state and in an intent's guard (a
159-byte intent made one commit allocate 800 MB before); NaN in a state is refused
before anything is written, and a row holding NaN read back and written back as read is
refused the same way, naming the column (docs/types.md); ``fencing inspect --json``
prints strict JSON: NaN and infinity as ``{"$float": ...}``, bytes as ``{"$bytes":
<base64>}``. (The outbox's NaN send options: ``tests/test_outbox.py``.)
"""

from __future__ import annotations

import json
import sqlite3
import tracemalloc
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

import fencing
from fencing._cli import main
from fencing._types import MAX_DECIMAL_CHARS, column_value, decimal_chars

from .test_guard import raw

TABLES = pytest.mark.backends(only=lambda name: not name.startswith("redis"))


def _intent(guard: dict[str, Any]) -> str:
    data = {
        "v": 2,
        "id": "i-1",
        "kind": "table",
        "collection": "orders_t",
        "key": 1,
        "expected_version": 1,
        "transition": "x",
        "guard": guard,
        "decided_at": 0,
    }
    return json.dumps(data, separators=(",", ":"))


@pytest.mark.parametrize("text", ["1E+400000000", "1E-400000000", "1E+147456", "-9E-200000"])
def test_a_wide_decimal_guard_is_refused_cheaply(text: str) -> None:
    payload = _intent({"total": {"$decimal": text}})
    assert len(payload) < 200
    tracemalloc.start()
    try:
        with pytest.raises(fencing.InvalidIntent, match="Decimal"):
            fencing.Intent.from_json(payload)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000  # never written out


def test_decimal_width_is_bounded_exactly() -> None:
    for text in ("9.50", "1E+2", "-0", "0.001", "123.456", "1E-5", "12345E+3", "-1.5E-7"):
        d = Decimal(text)
        assert decimal_chars(d) >= len(format(d, "f")), text
    edge = Decimal(f"1E+{MAX_DECIMAL_CHARS - 3}")
    assert column_value(edge, "x") is edge  # as wide as the widest numeric: taken
    with pytest.raises(fencing.InvalidState, match="too wide"):
        column_value(Decimal(f"1E+{MAX_DECIMAL_CHARS}"), "column 'total'")
    # a guard's Decimals are bounded in all (a guard travels in a 64 KiB intent)
    fine = {f"c{n}": {"$decimal": "1E+20000"} for n in range(3)}
    assert fencing.Intent.from_json(_intent(fine)).guard is not None
    many = {f"c{n}": {"$decimal": "1E+20000"} for n in range(4)}
    with pytest.raises(fencing.InvalidIntent, match="written out"):
        fencing.Intent.from_json(_intent(many))


@TABLES
def test_a_wide_decimal_state_is_refused_before_anything_is_written(make_table: Any) -> None:
    table = make_table(rows=[{"id": 1, "status": "new"}])
    intent = table.intent(1, "x")
    for wide in (Decimal("1E+400000000"), Decimal("-1E-400000000")):
        with pytest.raises(fencing.InvalidState, match="too wide"):
            table.commit(intent, {"note": wide})
    # counted as written out in the state's size: 8 columns of 147,000 digits > 1 MiB
    big = Decimal(f"1E+{MAX_DECIMAL_CHARS - 3}")
    with pytest.raises(fencing.InvalidState, match="bytes of JSON"):
        table.commit(intent, {"note": big, **{f"c{n}": big for n in range(7)}})
    assert table.get(1).version == 1


def test_a_wide_decimal_in_a_sqlite_commit_peaks_low(tmp_path: Path) -> None:
    """The reported case, measured: a 159-byte intent, committed on SQLite."""
    path = tmp_path / "wide.db"
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE orders_t (id INTEGER PRIMARY KEY, version INTEGER NOT NULL"
            " DEFAULT 1, total NUMERIC, status TEXT)"
        )
        conn.execute("INSERT INTO orders_t (id, total) VALUES (1, 1)")
    with fencing.open(f"sqlite:///{path}") as store:
        table = store.table("orders_t")
        table.get(1)
        payload = _intent({"total": {"$decimal": "1E+400000000"}})
        tracemalloc.start()
        try:
            with pytest.raises(fencing.InvalidIntent):
                table.commit(fencing.Intent.from_json(payload), {"status": "s"})
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 1_000_000, peak  # 800 MB before the bound
        assert table.get(1).version == 1


@TABLES
def test_nan_in_a_state_is_refused_before_anything_is_written(store: Any, make_table: Any) -> None:
    table = make_table(rows=[{"id": 1, "status": "new"}])
    intent = table.intent(1, "x")
    for bad in (float("nan"), float("inf"), -float("inf"), Decimal("NaN"), Decimal("-Inf")):
        with pytest.raises(fencing.InvalidState, match=r"'total'.*finite"):
            table.commit(intent, {"total": bad, "status": "s"})
    assert table.get(1).version == 1
    orders = store.collection("orders")
    record = orders.create("o-1", {"n": 1})
    with pytest.raises(fencing.InvalidState):
        orders.commit(record.intent("x"), {"n": float("nan")})
    assert orders.get("o-1").version == 1


@pytest.mark.backends(only=lambda name: name == "postgresql")
def test_a_row_holding_nan_written_back_as_read_is_refused_clearly(
    store: Any, backend_name: str
) -> None:
    """docs/types.md: a NaN read from a row (PostgreSQL's float and numeric hold one)
    comes back as the driver gives it, and is refused on the way back, naming the
    column, before anything is written; the state without it commits."""
    with raw(store, backend_name) as run:
        run(
            "CREATE TABLE nan_t (id INTEGER PRIMARY KEY, version INTEGER NOT NULL DEFAULT 1,"
            " score DOUBLE PRECISION, amount NUMERIC, status TEXT)"
        )
        run("INSERT INTO nan_t (id, score, amount, status) VALUES (1, 'NaN', 'NaN', 'new')")
    table = store.table("nan_t")
    record = table.get(1)
    assert record.state["score"] != record.state["score"]  # NaN, as psycopg reads it
    intent = record.intent("ship")
    with pytest.raises(fencing.InvalidState, match="'score' must be finite"):
        table.commit(intent, {**record.state, "status": "shipped"})
    assert table.get(1).version == 1 and table.get(1).state["status"] == "new"
    kept = {k: v for k, v in record.state.items() if k not in ("score", "amount")}
    out = table.commit(intent, {**kept, "status": "shipped"})
    assert out.committed and out.record.state["score"] != out.record.state["score"]


def _strict_loads(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(f"not strict JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def test_inspect_json_is_strict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "inspect.db"
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE blobs (id INTEGER PRIMARY KEY, version INTEGER NOT NULL DEFAULT 1,"
            " score REAL, low REAL, ok REAL, pdf BLOB)"
        )
        conn.execute(
            "INSERT INTO blobs (id, score, low, ok, pdf) VALUES (1, ?, ?, 1.5, ?)",
            (float("inf"), -float("inf"), b"%PDF\x00\xff"),
        )
    url = f"sqlite:///{path}"
    assert main(["migrate", url]) == 0
    capsys.readouterr()
    assert main(["inspect", url, "blobs", "1", "--table", "--json", "--applied", "0"]) == 0
    shown = _strict_loads(capsys.readouterr().out)
    assert shown["state"]["score"] == {"$float": "inf"}
    assert shown["state"]["low"] == {"$float": "-inf"}
    assert shown["state"]["ok"] == 1.5
    assert shown["state"]["pdf"] == {"$bytes": "JVBERgD/"}
    assert fencing.Intent.from_json(
        _intent({"pdf": shown["state"]["pdf"]}).replace("orders_t", "blobs")
    ).guard == {"pdf": b"%PDF\x00\xff"}  # the same tag an intent's guard carries


@pytest.mark.backends(only=lambda name: name == "postgresql")
@pytest.mark.apis(only=["sync"])
def test_inspect_json_shows_a_nan_row_strictly(
    store: Any, store_url: str, backend_name: str, api: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with raw(store, backend_name) as run:
        run(
            "CREATE TABLE nan_t (id INTEGER PRIMARY KEY, version INTEGER NOT NULL DEFAULT 1,"
            " score DOUBLE PRECISION, amount NUMERIC, pdf BYTEA)"
        )
        run("INSERT INTO nan_t (id, score, amount, pdf) VALUES (1, 'NaN', 12.50, '\\x0001')")
    assert main(["inspect", store_url, "nan_t", "1", "--table", "--json"]) == 0
    shown = _strict_loads(capsys.readouterr().out)
    assert shown["state"]["score"] == {"$float": "nan"}
    assert shown["state"]["amount"] == {"$decimal": "12.50"}
    assert shown["state"]["pdf"] == {"$bytes": "AAE="}
