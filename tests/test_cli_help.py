"""Every subcommand and every argument of ``fencing`` has a help text, and
``fencing --version`` prints the installed version (issue 14, CLI polish)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from importlib.metadata import version
from pathlib import Path

import pytest

import fencing
from fencing._cli import build_parser, main


def _walk(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, str | None]]:
    """(where, help) for every action of ``parser`` and of every subparser under it."""
    for action in parser._actions:
        name = "/".join(action.option_strings) or action.dest
        yield f"{path} {name}", action.help
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for command, sub in action.choices.items():
                yield f"{path} {command} (the subcommand)", helps.get(command)
                yield from _walk(sub, f"{path} {command}")


def test_every_subcommand_and_argument_has_help() -> None:
    found = list(_walk(build_parser(), "fencing"))
    missing = [where for where, text in found if not text or text == argparse.SUPPRESS]
    assert not missing, f"no help text: {missing}"
    commands = {where.split()[1] for where, _ in found if where.endswith("(the subcommand)")}
    expected = {"demo", "check", "bench", "reconcile", "relay", "outbox", "migrate"}
    assert commands >= expected | {"inspect", "stats"}
    # the positional arguments too (the walk would miss nothing, but say it plainly)
    helps = dict(found)
    for where in ("fencing inspect url", "fencing inspect name", "fencing inspect key"):
        assert helps[where], where
    assert helps["fencing migrate url"] and helps["fencing stats url"]


def test_version_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"fencing {version('fencing')}\n"


def test_version_flag_in_a_real_process() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fencing", "--version"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert done.stdout.startswith("fencing ") and done.stdout.strip() != "fencing"


def test_subcommand_help_prints(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("inspect", "stats", "migrate"):
        with pytest.raises(SystemExit) as exited:
            main([command, "-h"])
        assert exited.value.code == 0
        out = capsys.readouterr().out
        assert "url" in out and "store URL" in out


def _history(path: Path) -> str:
    """A clean recorded history of two commits for ``fencing check``."""
    events = [
        {
            "event": "outcome",
            "collection": "c",
            "key": "k",
            "intent_id": f"i{version}",
            "expected_version": version - 1,
            "outcome": "committed",
            "version": version,
            "applied_over": version - 1,
            "token": None,
            "fence": 0,
        }
        for version in (2, 3)
    ]
    events.append({"event": "final", "collection": "c", "key": "k", "version": 3, "fence": 0})
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return str(path)


def _sqlite_store(path: Path) -> str:
    url = f"sqlite:///{path}"
    with fencing.open(url) as store:
        orders = store.collection("orders")
        for n in range(3):
            orders.create(f"o-{n}", {"status": "new"})
    return url


def _commands() -> list[str]:
    (sub,) = (a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(sub.choices)


# what each run prints: argparse's help and version, and the output of a command's work
RUNS: dict[str, Callable[[Path], list[str]]] = {
    "--help": lambda tmp: ["--help"],
    "--version": lambda tmp: ["--version"],
    **{f"{c} --help": (lambda tmp, c=c: [c, "--help"]) for c in _commands()},
    "stats sqlite": lambda tmp: ["stats", _sqlite_store(tmp / "s.db")],
    "check": lambda tmp: ["check", _history(tmp / "h.jsonl")],
    "inspect": lambda tmp: ["inspect", _sqlite_store(tmp / "i.db"), "orders", "o-1"],
}


@pytest.mark.parametrize("run", list(RUNS))
def test_a_reader_that_goes_away_ends_quietly(run: str, tmp_path: Path) -> None:
    """``fencing ... | head -c 0``: the reader is gone before fencing writes; no
    traceback, nothing on stderr, exit 141 (128 + SIGPIPE, what a shell reports of a
    command the pipe ended). Without ``PYTHONUNBUFFERED``: the output stays in the
    buffer until the last flush, the one at the interpreter's exit unless fencing
    flushes first (argparse's --help and --version exit through SystemExit)."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before fencing starts
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "fencing", *RUNS[run](tmp_path)],
            stdout=write,
            stderr=subprocess.PIPE,
            env=env,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write)
    assert done.stderr.decode() == ""
    assert done.returncode == 141
