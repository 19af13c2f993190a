"""`make mutate` hands every test name back to pytest: under mutmut, names are plain."""

from __future__ import annotations

import pytest

from .conftest import plain_test_name


@pytest.mark.parametrize(
    ("name", "plain"),
    [
        ("test_a", "test_a"),
        ("test_a[sqlite-file-sync]", "test_a[sqlite-file-sync]"),
        ("test_a['id'-'\\xe9']", "test_a['id'-'~5c~xe9']"),
        ("test_a[k1.\\U0001f511.x]", "test_a[k1.~5c~U0001f511.x]"),
        ("test_a['A-z_0.9:~x']", "test_a['A-z_0.9:~7e~x']"),
        ("test_a[\u00e9\n]", "test_a[~e9~~a~]"),
    ],
)
def test_a_plain_name_is_printable_ascii_without_a_backslash(name: str, plain: str) -> None:
    assert plain_test_name(name) == plain
    assert plain.isascii() and plain.isprintable() and "\\" not in plain


def test_different_parameters_keep_different_names() -> None:
    params = ["\\xe9", "~5c~xe9", "\u00e9", "~e9~", "\\\\xe9", "~", "~7e~"]
    assert len({plain_test_name(f"t[{p}]") for p in params}) == len(params)
