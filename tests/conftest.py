from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

import fencing

from . import _backends
from ._backends import CASES, TABLE_COLUMNS
from ._lenders import DRIVERS
from ._signals import _signals_as_they_were  # noqa: F401  (autouse: every test)
from ._syncify import Loop, Syncified

# server backends register their cases on import
for _module in ("backends_postgres", "backends_mysql", "backends_redis"):
    try:
        __import__(f"tests.{_module}")
    except ModuleNotFoundError as exc:
        if exc.name != f"tests.{_module}":
            raise

# Under `make mutate` (mutmut sets MUTANT_UNDER_TEST in every phase of `mutmut run`): mutmut
# copies the tree into mutants/ and runs pytest there, in its own process, with mutants/src
# first on sys.path. Two things it does not do are done here.
UNDER_MUTMUT = "MUTANT_UNDER_TEST" in os.environ
if UNDER_MUTMUT:
    # A test's subprocesses (`python -m fencing ...`) import the mutated code too, not the
    # tree the editable install points at.
    _MUTATED_SRC = str(Path(__file__).resolve().parent.parent / "src")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (_MUTATED_SRC, os.environ.get("PYTHONPATH", "")) if p
    )


def plain_test_name(name: str) -> str:
    """A test name mutmut can hand back to pytest: ``[...]`` in plain ASCII without ``\\``.

    pytest writes a parameter's non-ASCII characters as escapes (``'\\xe9'``); mutmut 3.8.1
    records such a test by that name and then cannot select it again ("not found": the whole
    run stops). Each character outside ASCII's printable range and each backslash becomes
    ``~<hex>~``: the name stays readable and two different parameters keep different names.
    """
    base, bracket, params = name.partition("[")
    if not bracket:
        return name
    plain = "".join(c if " " <= c <= "~" and c not in "\\~" else f"~{ord(c):x}~" for c in params)
    return f"{base}[{plain}"


if UNDER_MUTMUT:

    @pytest.hookimpl(wrapper=True)
    def pytest_pycollect_makeitem(collector: pytest.Collector, name: str, obj: object) -> Any:
        made = yield
        for item in made if isinstance(made, list) else [made] if made is not None else []:
            if isinstance(item, pytest.Function) and plain_test_name(item.name) != item.name:
                item.name = plain_test_name(item.name)
                nodeid = f"{collector.nodeid}::{item.name}"
                if hasattr(item, "_id"):  # pytest 9: a structured id, parsed from the string
                    item._id = type(item._id).parse(nodeid)
                else:  # pytest 8
                    item._nodeid = nodeid
        return made


settings.register_profile(
    "ci", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=60, deadline=None)
settings.load_profile("ci" if _backends.CI else os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend_name" in metafunc.fixturenames:
        names = list(CASES)
        if "shared_backend_name" in metafunc.fixturenames:
            names = [n for n in names if CASES[n].shared_between_processes]
        only = metafunc.definition.get_closest_marker("backends")
        if only is not None:  # a test that means something on some backends only
            names = [n for n in names if only.kwargs["only"](n)]
        if "lender_name" in metafunc.fixturenames:  # once per driver lending a connection
            keep = metafunc.definition.get_closest_marker("lenders")
            pairs = [
                (name, driver)
                for name in names
                for driver, lender in DRIVERS.get(name, {}).items()
                if keep is None or keep.kwargs["only"](lender)
            ]
            ids = [f"{name}-{driver}" for name, driver in pairs]
            metafunc.parametrize(("backend_name", "lender_name"), pairs, ids=ids)
        else:
            metafunc.parametrize("backend_name", names)
    if "api" in metafunc.fixturenames:
        apis = metafunc.definition.get_closest_marker("apis")  # a test one api means enough
        metafunc.parametrize("api", ["sync", "async"] if apis is None else apis.kwargs["only"])


@pytest.fixture
def shared_backend_name(backend_name: str) -> str:
    """Only backends whose store can be shared between processes."""
    return backend_name


@pytest.fixture
def store_url(backend_name: str, tmp_path: Path) -> Iterator[str]:
    """A URL of a fresh, empty store on the backend (isolated per test)."""
    case = CASES[backend_name]
    url = case.url(tmp_path)
    yield url
    if case.cleanup is not None:
        case.cleanup(url)


@pytest.fixture
def loop() -> Iterator[Loop]:
    lp = Loop()
    yield lp
    lp.close()


@pytest.fixture
def store(store_url: str, api: str, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A fresh store on each backend, through the sync API and through the async API."""
    if api == "sync":
        s = fencing.open(store_url)
        yield s
        s.close()
        return
    lp: Loop = request.getfixturevalue("loop")
    s = Syncified(lp.run(fencing.open_async(store_url)), lp)
    yield s
    s.close()


@pytest.fixture
def make_table(store: Any, backend_name: str) -> Any:
    """make_table(name, rows, key='id', version='version') -> a guarded table front."""

    def make(
        name: str = "orders_t",
        rows: list[dict[str, Any]] | None = None,
        *,
        key: str = "id",
        version: str | None = "version",
    ) -> Any:
        target = store.unwrapped if isinstance(store, Syncified) else store
        create = CASES[backend_name].create_table
        assert create is not None, f"{backend_name} cannot create test tables"
        create(target, name, key, version, TABLE_COLUMNS, rows or [])
        return store.table(name, key=key, version=version)

    return make


@pytest.fixture
def pg() -> Iterator[Any]:
    """A fresh schema on the PostgreSQL server (``backends_postgres.Setup``), dropped after."""
    from .backends_postgres import cleanup, new_setup

    setup = new_setup(max_size="4")
    yield setup
    cleanup(setup.url)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Per backend: the histories and operations the linearizability tests judged."""
    from ._lin_churn import STATS

    if not STATS:
        return
    terminalreporter.section("linearizability")
    for backend, row in sorted(STATS.items()):
        terminalreporter.write_line(
            f"{backend}: {row['histories']} histories, {row['operations']} operations judged"
            f" ({row['unknown']} with unknown outcome, {row['kills']} connections killed)"
        )
