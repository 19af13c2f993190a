"""User code written against the public types passes ``mypy --strict``."""

from __future__ import annotations

from pathlib import Path

import pytest

api = pytest.importorskip("mypy.api")

HERE = Path(__file__).parent / "typing"


@pytest.mark.parametrize("name", sorted(p.name for p in HERE.glob("*.py")))
def test_user_code_type_checks(name: str) -> None:
    out, err, status = api.run(
        ["--strict", "--no-incremental", "--cache-dir=/dev/null", str(HERE / name)]
    )
    assert status == 0, out + err
