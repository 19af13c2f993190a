"""The README's examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_main_example_is_at_most_20_lines_and_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    example = _blocks()[0]
    assert len(example.strip().splitlines()) <= 20
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    exec(compile(example, "README.md", "exec"), namespace)
    assert "shipped at version 2" in capsys.readouterr().out
    table_sql = (
        "CREATE TABLE orders (id INTEGER PRIMARY KEY, version INTEGER NOT NULL DEFAULT 1,"
        " status TEXT)"
    )
    store = namespace["store"]
    backend = store.backend  # type: ignore[attr-defined]
    with backend._lock:
        backend.conn.execute(table_sql)
        backend.conn.execute("INSERT INTO orders (id, status) VALUES (42, 'packed')")
    for block in _blocks()[1:]:
        exec(compile(block, "README.md", "exec"), namespace)
    assert store.table("orders").get(42).state["status"] == "shipped"  # type: ignore[attr-defined]
    assert namespace["outcome"].committed  # type: ignore[attr-defined]
    store.close()  # type: ignore[attr-defined]
