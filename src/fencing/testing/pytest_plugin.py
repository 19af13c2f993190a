"""fencing's pytest plugin: the blind-writer audit (``docs/guard.md``), opt in per test.

Enable it in one line, in a ``conftest.py``::

    pytest_plugins = ["fencing.testing.pytest_plugin"]

(or ``-p fencing.testing.pytest_plugin`` on the command line / in ``addopts``).

Then a test marked ``@pytest.mark.fencing_audit("orders", ...)`` (table names;
``version=`` the version column, ``version`` by default; ``allow="fencing"``: any UPDATE
outside fencing's own commits fails, see :class:`~fencing.testing.WriteAudit`), or
asking for the ``fencing_audit`` fixture (a :class:`~fencing.testing.WriteAudit`:
``fencing_audit.watch("orders")`` adds a table), fails when its code sent an UPDATE of a
watched table that does not move the version, through SQLAlchemy or Django (every model
with fencing's ``VersionField`` is watched too); the failure names each statement and
the test. Only the test's own call is read (not its fixtures' setup). A test neither
marked nor asking for the fixture is not touched.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import Any

import pytest

from ._audit import BlindWriteError, WriteAudit

__all__ = ["fencing_audit"]

_AUDIT = pytest.StashKey[WriteAudit]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "fencing_audit(*tables, version='version', allow='versioned'): fail the test if its"
        " code UPDATEs one of these tables (or a model with fencing's VersionField) without"
        " moving the version (allow='fencing': at all, outside fencing's commits)",
    )


@pytest.fixture
def fencing_audit(request: pytest.FixtureRequest) -> Iterator[WriteAudit]:
    """The test's blind-writer audit: SQLAlchemy's and Django's statements are read
    during the test's call; a blind write to a watched table fails the test."""
    marker = request.node.get_closest_marker("fencing_audit")
    tables: tuple[Any, ...] = marker.args if marker is not None else ()
    kwargs = dict(marker.kwargs) if marker is not None else {}
    audit = WriteAudit(tables, test=request.node.nodeid, **kwargs)
    audit.active = False  # the test's call only (pytest_runtest_call)
    with audit.hooked():
        request.node.stash[_AUDIT] = audit
        yield audit


@pytest.fixture(autouse=True)
def _fencing_audit_marked(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("fencing_audit") is not None:
        request.getfixturevalue("fencing_audit")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    audit = item.stash.get(_AUDIT, None)
    if audit is None:
        return (yield)
    audit.active = True
    try:
        result = yield
    finally:
        audit.active = False
    if audit.findings:
        raise BlindWriteError(audit.report())
    return result
