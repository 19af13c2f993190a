"""Every subcommand and every argument of ``fencing`` has a help text, and
``fencing --version`` prints the installed version (issue 14, CLI polish)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import version

import pytest

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


@pytest.mark.parametrize("argv", [["--version"], ["stats", "memory://"], ["--help"]])
def test_a_reader_that_goes_away_ends_quietly(argv: list[str]) -> None:
    """``fencing ... | head``: the pipe closes before fencing writes; no traceback,
    exit 141 (128 + SIGPIPE) or 0 when the output was already out."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "fencing", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first write
    with proc.stderr:
        err = proc.stderr.read().decode()
    proc.wait(timeout=60)
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert proc.returncode in (0, 141)
