"""docs/queues.md: its examples parse, and every name they import from fencing exists."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "queues.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_doc_has_an_example_per_queue() -> None:
    text = "\n".join(BLOCKS)
    for module in ("celery", "rq", "dramatiq", "arq", "tx"):
        assert f"fencing.contrib.{module} import" in text


@pytest.mark.parametrize("block", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_example_imports_exist(block: str) -> None:
    tree = ast.parse(block)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fencing"):
            module = importlib.import_module(node.module or "")
            for alias in node.names:
                assert hasattr(module, alias.name), f"{node.module} has no {alias.name}"


def _backticked(paragraph: str) -> list[str]:
    return [n for n in re.findall(r"`([a-z_]+)`", paragraph) if not n.endswith("_")]


def test_the_documented_log_and_result_fields_are_the_real_ones() -> None:
    from fencing.contrib._common import Action, TaskReport

    text = DOC.read_text()
    start = text.index("Every run logs exactly one record")
    paragraph = text[start : text.index("\n\n", start)]
    logged = [n for n in _backticked(paragraph) if n.startswith("fencing_")]
    returned_at = paragraph.index("report.to_dict()")
    returned = [n for n in _backticked(paragraph[returned_at:]) if not n.startswith("fencing_")]
    report = TaskReport("ship", Action.ACK, "committed", 1)
    assert sorted(logged) == sorted(report.log_fields())
    assert sorted(returned) == sorted(report.to_dict())
