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
        if "fencing.contrib" not in block:  # the task-queue examples: see below
            exec(compile(block, "README.md", "exec"), namespace)
    assert store.table("orders").get(42).state["status"] == "shipped"  # type: ignore[attr-defined]
    assert namespace["outcome"].committed  # type: ignore[attr-defined]
    store.close()  # type: ignore[attr-defined]


def _queue_blocks() -> list[str]:
    """The queue examples (the Django one configures Django: tests/test_doc_blocks.py
    runs it in a process of its own)."""
    return [b for b in _blocks() if "fencing.contrib" in b and "django.setup()" not in b]


def test_the_django_example_is_a_model_a_service_and_a_task() -> None:
    (django,) = [b for b in _blocks() if "django.setup()" in b]
    for name in ("class Order(FencedModel)", "def pay(", "@fenced_task(app, target=Order)"):
        assert name in django, name
    # about 25 lines of the project's own code, after the settings and imports
    code = django[django.index("class Order") :]
    assert len([line for line in code.splitlines() if line.strip()]) <= 25


def test_queue_examples_parse_and_name_what_exists() -> None:
    import ast
    import importlib

    blocks = _queue_blocks()
    text = "\n".join(blocks)
    for module in ("celery", "rq", "dramatiq", "arq"):
        assert f"fencing.contrib.{module} import" in text, module
    celery = next(b for b in blocks if "fencing.contrib.celery" in b and "sqlalchemy" not in b)
    assert len(celery.strip().splitlines()) <= 15 + 6  # 15 lines of code, plus blank lines
    assert len([line for line in celery.splitlines() if line.strip()]) <= 15
    # inside your transaction: SQLAlchemy model, service step, fenced task (about 25 lines)
    orm = next(b for b in blocks if "fencing.contrib.celery" in b and "sqlalchemy" in b)
    assert len([line for line in orm.splitlines() if line.strip()]) <= 28
    for block in blocks:
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fencing"):
                module = importlib.import_module(node.module or "")
                for alias in node.names:
                    assert hasattr(module, alias.name), f"{node.module} has no {alias.name}"
