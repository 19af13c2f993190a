"""The package's layers only point down, with no import circle (issue: one shape for
every backend). Read from the source with ``ast``: every import counts, those inside
functions and under ``TYPE_CHECKING`` too, so no circle can hide behind a late import.

From the bottom:

0. ``base``: errors, the flow driver, the sync/async primitives, input checks;
1. ``values``: intents, records, outcomes, rules, effects, signing, the request/answer
   values a store and its backend exchange, store URLs;
2. ``policy``: stale policies and the apply/lease flows;
3. ``backend core``: the contract, the flow-driven base, the pool, the servers' shared
   self-deadlock watchdog;
4. ``backends``: one package (or module) per store; no store imports another;
5. ``stores``: the sync and async fronts and ``open``;
6. ``api``: ``fencing`` itself;
7. ``wings``: ``testing``, ``contrib``, the demo, the benchmarks, the CLI.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = SRC / "fencing"

# (layer, pattern of module names), first match wins; "fencing" alone is the api.
LAYERS: list[tuple[int, str]] = [
    (0, r"fencing\.(_errors|_flow|_observe|_runner|_types|_validate)"),
    (
        1,
        r"fencing\.(_values|_rules|_effects|_outbox|_signing|_reconcile|_request|_url|_checks|_borrow|_onupdate)",
    ),
    (2, r"fencing\._policy"),
    (3, r"fencing\.backends(\.(_contract|_abase|_base|_abound|_bound|_pool|_watch))?"),
    (4, r"fencing\.backends\.[a-z]\w*(\..+)?"),
    (5, r"fencing\.(_storebase|_alease|_lease|_aoutbox|_outbox_front|_astore|_store|_open)"),
    (6, r"fencing"),
    (7, r"fencing\.(testing|contrib|_demo|_bench|_html|_cli\w*|__main__)(\..+)?"),
]
NAMES = {0: "base", 1: "values", 2: "policy", 3: "backend core", 4: "backends"}
NAMES |= {5: "stores", 6: "api", 7: "wings"}
MAX_LINES = 600  # a hand-written module; generated ones say so in their first lines


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = modules()


def layer(module: str) -> int:
    for level, pattern in LAYERS:
        if re.fullmatch(pattern, module):
            return level
    raise AssertionError(f"module {module} is in no layer: add it to LAYERS")


def imported(module: str, path: Path) -> Iterator[str]:
    """The fencing modules ``module`` imports (each import's longest known module)."""
    package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join([*base, *([node.module] if node.module else [])])
            else:
                stem = node.module or ""
            targets = [stem, *(f"{stem}.{alias.name}" for alias in node.names)]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            # a module's own package (its __init__) is not a dependency it can avoid
            if target and target != module and not module.startswith(target + "."):
                yield target


EDGES = {m: set(imported(m, p)) for m, p in MODULES.items()}


def test_every_module_has_a_layer() -> None:
    for module in MODULES:
        layer(module)


def test_layers_point_down() -> None:
    upward = [
        f"{m} ({NAMES[layer(m)]}) imports {t} ({NAMES[layer(t)]})"
        for m, targets in EDGES.items()
        for t in targets
        if layer(t) > layer(m)
    ]
    assert upward == []


def _store(module: str) -> str | None:
    """The store package (or module) a backend module belongs to, if any."""
    if layer(module) != 4:
        return None
    return module.split(".")[2]


def test_no_backend_imports_another_store() -> None:
    crossing = [
        f"{m} imports {t}"
        for m, targets in EDGES.items()
        for t in targets
        if _store(m) is not None and _store(t) is not None and _store(m) != _store(t)
    ]
    assert crossing == []


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle() -> None:
    assert circles(EDGES) == []


def test_the_circle_check_finds_a_planted_circle() -> None:
    planted = {m: set(t) for m, t in EDGES.items()}
    planted["fencing._flow"].add("fencing._policy")  # the driver back in the policy
    assert ["fencing._flow", "fencing._policy"] in circles(planted)


def _generated(path: Path) -> bool:
    return any("generated" in line.lower() for line in path.read_text().splitlines()[:3])


@pytest.mark.parametrize("module", sorted(MODULES))
def test_modules_are_short(module: str) -> None:
    path = MODULES[module]
    if _generated(path):
        return
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{module} has {lines} lines: split it by job"
