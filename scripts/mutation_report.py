"""The score of the last `mutmut run` (`make mutate`), per module, less known equivalents.

Reads mutmut's results under ``mutants/`` and writes ``mutation/REPORT.md``: per module,
the mutants killed (a timeout counts as killed: the mutant broke the code), those that
survived, and those listed as equivalent in ``mutation/equivalent.txt``; then every
survivor with its diff and its stable id.

A mutant's *stable id* is ``<module>:<function>:<hash>``, the hash taken over the lines
the mutant removes and adds (stripped), so it stays the same when other code moves or
other mutants are added; mutmut's own names (``..._mutmut_17``) do not. A line of
``mutation/equivalent.txt`` is ``<stable id>  <one-line reason>``; ``#`` starts a comment.

Usage: ``python scripts/mutation_report.py [--fail-under PERCENT]`` from the repository
root, after ``mutmut run``. Exit 1 if the score is below ``--fail-under`` (default: none).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EQUIVALENT = Path("mutation/equivalent.txt")
REPORT = Path("mutation/REPORT.md")
KILLED = {"killed", "timeout", "caught by type check"}


@dataclass(frozen=True)
class Mutant:
    name: str  # mutmut's
    path: str  # the source file, relative to the root
    status: str

    @property
    def module(self) -> str:
        return self.name.split(".x", 1)[0] if ".x" in self.name else self.name.rsplit(".", 1)[0]

    @property
    def function(self) -> str:
        """``x_apply_flow__mutmut_6`` -> ``apply_flow``; a method -> ``Class.method``."""
        tail = self.name[len(self.module) + 1 :]
        tail = re.sub(r"__mutmut_\d+$", "", tail)
        if tail.startswith("xǁ"):
            return ".".join(part for part in tail[2:].split("ǁ") if part)
        return tail[2:] if tail.startswith("x_") else tail


def diff_of(mutant: Mutant) -> str:
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    return str(get_diff_for_mutant(mutant.name, path=mutant.path))


def stable_id(mutant: Mutant, diff: str) -> str:
    changed = [
        line[0] + line[1:].strip()
        for line in diff.splitlines()
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    digest = hashlib.sha1("\n".join(changed).encode()).hexdigest()[:10]
    return f"{mutant.module}:{mutant.function}:{digest}"


def load_mutants() -> list[Mutant]:
    from mutmut.stats import status_by_exit_code

    found: list[Mutant] = []
    for meta in sorted(Path("mutants").rglob("*.py.meta")):
        source = str(meta.relative_to("mutants"))[: -len(".meta")]
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        for name, code in sorted(codes.items()):
            found.append(Mutant(name, source, status_by_exit_code[code]))
    return found


def load_equivalents() -> dict[str, str]:
    out: dict[str, str] = {}
    if not EQUIVALENT.exists():
        return out
    for line in EQUIVALENT.read_text().splitlines():
        line = line.split("#", 1)[0].strip() if line.lstrip().startswith("#") else line.strip()
        if not line:
            continue
        ident, _, reason = line.partition(" ")
        if not reason.strip():
            raise SystemExit(f"{EQUIVALENT}: {ident} has no reason")
        out[ident] = reason.strip()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fail-under", type=float, default=None)
    args = parser.parse_args(argv)

    mutants = load_mutants()
    if not mutants:
        print("no mutmut results under mutants/: run `make mutate` first", file=sys.stderr)
        return 2
    equivalents = load_equivalents()
    used: set[str] = set()
    per_module: dict[str, Counter[str]] = defaultdict(Counter)
    survivors: list[tuple[Mutant, str, str]] = []  # (mutant, stable id, diff)
    for mutant in mutants:
        counts = per_module[mutant.path]
        counts["total"] += 1
        if mutant.status in KILLED:
            counts["killed"] += 1
            continue
        if mutant.status in ("skipped", "not checked"):
            counts["not run"] += 1
            continue
        diff = diff_of(mutant)
        ident = stable_id(mutant, diff)
        if ident in equivalents:
            used.add(ident)
            counts["equivalent"] += 1
            continue
        counts["survived"] += 1
        survivors.append((mutant, ident, diff))

    total = Counter[str]()
    for counts in per_module.values():
        total.update(counts)

    def score(c: Counter[str]) -> float:
        judged = c["killed"] + c["survived"]
        return 100.0 * c["killed"] / judged if judged else 100.0

    lines = [
        "# Mutation score",
        "",
        "Written by `scripts/mutation_report.py` after `make mutate` (mutmut, the fast",
        "server-free tests). Score: killed / (killed + survived); equivalent mutants",
        "(`mutation/equivalent.txt`) are left out.",
        "",
        "| module | mutants | killed | survived | equivalent | not run | score |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for path, c in sorted(per_module.items()):
        lines.append(
            f"| `{path}` | {c['total']} | {c['killed']} | {c['survived']} | {c['equivalent']}"
            f" | {c['not run']} | {score(c):.1f}% |"
        )
    lines.append(
        f"| **all** | {total['total']} | {total['killed']} | {total['survived']}"
        f" | {total['equivalent']} | {total['not run']} | **{score(total):.1f}%** |"
    )
    stale = sorted(set(equivalents) - used)
    if stale:
        lines += ["", "Listed as equivalent but not found (the code changed?):", ""]
        lines += [f"- `{ident}`" for ident in stale]
    lines += ["", f"## Survivors ({len(survivors)})", ""]
    for mutant, ident, diff in survivors:
        lines += [f"### `{ident}` ({mutant.status})", "", f"mutmut: `{mutant.name}`", ""]
        lines += ["```diff", diff.strip(), "```", ""]
    REPORT.parent.mkdir(exist_ok=True)
    REPORT.write_text("\n".join(lines).rstrip() + "\n")
    print(
        f"mutation score {score(total):.1f}%: {total['killed']} killed, {total['survived']}"
        f" survived, {total['equivalent']} equivalent, {total['not run']} not run"
        f" (of {total['total']}); {REPORT}"
    )
    if args.fail_under is not None and score(total) < args.fail_under:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
