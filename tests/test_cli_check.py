"""``fencing check HISTORY.jsonl``, in process: its exit status, its table, its JSON, its
error messages and its help, exactly as a user reads them."""

from __future__ import annotations

import errno
import io
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from fencing._cli import main
from fencing.testing import check_file

Event = dict[str, Any]

LONG_KEY = "order-" + "x" * 60  # wider than the examples column: folded, not cut


def _commit(key: str, version: int, intent: str, **extra: Any) -> Event:
    return {
        "event": "outcome",
        "collection": "c",
        "key": key,
        "intent_id": intent,
        "expected_version": version - 1,
        "outcome": "committed",
        "version": version,
        "applied_over": version - 1,
        "token": None,
        "fence": 0,
        **extra,
    }


def _final(key: str, version: int) -> Event:
    return {"event": "final", "collection": "c", "key": key, "version": version, "fence": 0}


def _dirty() -> list[Event]:
    """Five keys, each with one intent committed twice; a stale outcome; a store error."""
    events: list[Event] = []
    for n, key in enumerate((LONG_KEY, "k1", "k2", "k3", "k4")):
        events += [_commit(key, 2, f"a{n}"), _commit(key, 3, f"a{n}~1")]
    events.append(_commit("k1", 3, "s", outcome="stale", applied_over=None))
    events.append(
        {
            "event": "error",
            "worker": "w",
            "collection": "c",
            "key": "k1",
            "intent_id": "e",
            "error": "TransientStoreError: gone",
        }
    )
    return events


HISTORIES: dict[str, list[Event]] = {
    "clean.jsonl": [_commit("k", 2, "a"), _commit("k", 3, "b"), _final("k", 3)],
    "empty.jsonl": [],
    "dirty.jsonl": _dirty(),
}


@pytest.fixture
def histories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The histories above in the current directory (short names in the output), and a
    plain 80-column terminal whatever the environment says."""
    for name, events in HISTORIES.items():
        (tmp_path / name).write_text("".join(json.dumps(e) + "\n" for e in events))
    (tmp_path / "bad.jsonl").write_text(json.dumps(_commit("k", 2, "a")) + "\n{oops\n")
    (tmp_path / "wrong.jsonl").write_text('{"event": "outcome"}\n')
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("LINES", "25")
    for name in ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "TERM"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def _check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["check", *args])
    out, err = capsys.readouterr()
    return code, out, err


# rich wraps the first line at 80 columns after a space, and leaves the space
TITLE = (
    "dirty.jsonl: 12 events on 5 keys; outcomes: 10 committed, 1 stale; 1 unknown \n"
    "(store errors)\n"
)
CLEAN = """\
┏━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━┳━━━━━━━━━━━━━━━━┓
┃ anomaly                                             ┃ count ┃ first examples ┃
┡━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━╇━━━━━━━━━━━━━━━━┩
│ lost updates                                        │     0 │ none           │
│ acknowledged commits missing from the final state's │       │                │
│ history                                             │       │                │
├─────────────────────────────────────────────────────┼───────┼────────────────┤
│ stale writes                                        │     0 │ none           │
│ commits applied over a version other than the       │       │                │
│ intent's                                            │       │                │
├─────────────────────────────────────────────────────┼───────┼────────────────┤
│ double-applied intents                              │     0 │ none           │
│ intents committed more than once                    │       │                │
├─────────────────────────────────────────────────────┼───────┼────────────────┤
│ fence regressions                                   │     0 │ none           │
│ a lower lease token wrote after a higher one        │       │                │
└─────────────────────────────────────────────────────┴───────┴────────────────┘
clean: no anomaly found
"""
DIRTY = """\
┏━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┓
┃ anomaly                           ┃ count ┃ first examples                   ┃
┡━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┩
│ lost updates                      │     0 │ none                             │
│ acknowledged commits missing from │       │                                  │
│ the final state's history         │       │                                  │
├───────────────────────────────────┼───────┼──────────────────────────────────┤
│ stale writes                      │     0 │ none                             │
│ commits applied over a version    │       │                                  │
│ other than the intent's           │       │                                  │
├───────────────────────────────────┼───────┼──────────────────────────────────┤
│ double-applied intents            │     5 │ order-xxxxxxxxxxxxxxxxxxxxxxxxxx │
│ intents committed more than once  │       │ xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx │
│                                   │       │ xx, line 1, 2: intent a0         │
│                                   │       │ committed 2 times                │
│                                   │       │ k1, line 3, 4: intent a1         │
│                                   │       │ committed 2 times                │
│                                   │       │ k2, line 5, 6: intent a2         │
│                                   │       │ committed 2 times                │
│                                   │       │ ... and 2 more                   │
├───────────────────────────────────┼───────┼──────────────────────────────────┤
│ fence regressions                 │     0 │ none                             │
│ a lower lease token wrote after a │       │                                  │
│ higher one                        │       │                                  │
└───────────────────────────────────┴───────┴──────────────────────────────────┘
5 anomalies in 12 events on 5 keys: 5 double-applied intents
"""
NO_EXAMPLES = """\
┏━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━┳━━━━━━━━━━━━━━━━┓
┃ anomaly                                             ┃ count ┃ first examples ┃
┡━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━╇━━━━━━━━━━━━━━━━┩
│ lost updates                                        │     0 │ none           │
│ acknowledged commits missing from the final state's │       │                │
│ history                                             │       │                │
├─────────────────────────────────────────────────────┼───────┼────────────────┤
│ stale writes                                        │     0 │ none           │
│ commits applied over a version other than the       │       │                │
│ intent's                                            │       │                │
├─────────────────────────────────────────────────────┼───────┼────────────────┤
│ double-applied intents                              │     5 │ ... and 5 more │
│ intents committed more than once                    │       │                │
├─────────────────────────────────────────────────────┼───────┼────────────────┤
│ fence regressions                                   │     0 │ none           │
│ a lower lease token wrote after a higher one        │       │                │
└─────────────────────────────────────────────────────┴───────┴────────────────┘
5 anomalies in 12 events on 5 keys: 5 double-applied intents
"""


@pytest.mark.parametrize(
    ("args", "code", "out"),
    [
        (["clean.jsonl"], 0, "clean.jsonl: 3 events on 1 keys; outcomes: 2 committed\n" + CLEAN),
        (["empty.jsonl"], 0, "empty.jsonl: 0 events on 0 keys\n" + CLEAN),
        # three examples by default, a long key folded over lines, not cut
        (["dirty.jsonl"], 1, TITLE + DIRTY),
        (["dirty.jsonl", "--examples", "3"], 1, TITLE + DIRTY),
        (["dirty.jsonl", "--examples", "0"], 1, TITLE + NO_EXAMPLES),
        (["dirty.jsonl", "--examples", "-1"], 1, TITLE + NO_EXAMPLES),  # as 0
    ],
)
def test_the_table_exactly(
    histories: Path, capsys: pytest.CaptureFixture[str], args: list[str], code: int, out: str
) -> None:
    assert _check(capsys, *args) == (code, out, "")


def _examples_column(out: str) -> list[str]:
    """The non-empty cells of the third column under the header, top to bottom (no line
    folded)."""
    rows = [line.split("│") for line in out.splitlines() if line.startswith("│")]
    return [cells[3].strip() for cells in rows if cells[3].strip()]


def _double(n: int, key: str) -> str:
    line = 2 * n + 1
    return f"{key}, line {line}, {line + 1}: intent a{n} committed 2 times"


@pytest.mark.parametrize(
    ("examples", "shown"),
    [
        ("1", [_double(0, LONG_KEY), "... and 4 more"]),
        (
            "4",
            [_double(n, k) for n, k in enumerate((LONG_KEY, "k1", "k2", "k3"))]
            + ["... and 1 more"],
        ),
        ("5", [_double(n, k) for n, k in enumerate((LONG_KEY, "k1", "k2", "k3", "k4"))]),
        ("50", [_double(n, k) for n, k in enumerate((LONG_KEY, "k1", "k2", "k3", "k4"))]),
    ],
)
def test_the_examples_shown(
    histories: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    examples: str,
    shown: list[str],
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    code, out, err = _check(capsys, "dirty.jsonl", "--examples", examples)
    assert (code, err) == (1, "")
    assert _examples_column(out) == ["none", "none", *shown, "none"]


def _json_error(text: str) -> str:
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        return str(exc)
    raise AssertionError(text)  # pragma: no cover


def _absent(name: str) -> str:
    return str(FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), name))


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("bad.jsonl", f"bad.jsonl: line 2: not JSON ({_json_error('{oops')})"),
        ("wrong.jsonl", "wrong.jsonl: line 1: 'collection' must be a non-empty string, got None"),
        ("absent.jsonl", _absent("absent.jsonl")),
    ],
)
def test_a_history_that_cannot_be_read_exits_2(
    histories: Path, capsys: pytest.CaptureFixture[str], name: str, error: str
) -> None:
    assert _check(capsys, name) == (2, "", f"fencing check: {error}\n")
    assert _check(capsys, name, "--json") == (
        2,
        json.dumps({"ok": False, "error": error}) + "\n",
        "",
    )
    assert _check(capsys, "--json", name) == (
        2,
        '{"ok": false, "error": ' + json.dumps(error) + "}\n",
        "",
    )


@pytest.mark.parametrize(
    ("name", "args", "code", "examples"),
    [
        ("clean.jsonl", [], 0, 3),
        ("dirty.jsonl", [], 1, 3),
        ("dirty.jsonl", ["--examples", "1"], 1, 1),
        ("dirty.jsonl", ["--examples", "0"], 1, 0),
        ("dirty.jsonl", ["--examples", "-2"], 1, 0),
    ],
)
def test_the_json_report_exactly(
    histories: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    args: list[str],
    code: int,
    examples: int,
) -> None:
    expected = {"history": name, **check_file(name).to_dict(examples)}
    assert _check(capsys, name, "--json", *args) == (
        code,
        json.dumps(expected, indent=2, sort_keys=True) + "\n",
        "",
    )
    data = json.loads(json.dumps(expected))
    assert data["ok"] is (code == 0)
    assert data["anomalies"]["double_applied"] == (5 if code else 0)
    assert len(data["examples"]["double_applied"]) == min(examples, 5 if code else 0)


def test_the_json_report_reads_as_json_with_the_counts_first(
    histories: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _check(capsys, "clean.jsonl", "--json")
    assert (code, err) == (0, "")
    assert out == (
        "{\n"
        '  "anomalies": {\n'
        '    "double_applied": 0,\n'
        '    "fence_regression": 0,\n'
        '    "lost_update": 0,\n'
        '    "stale_write": 0\n'
        "  },\n"
        '  "errors": 0,\n'
        '  "events": 3,\n'
        '  "examples": {\n'
        '    "double_applied": [],\n'
        '    "fence_regression": [],\n'
        '    "lost_update": [],\n'
        '    "stale_write": []\n'
        "  },\n"
        '  "history": "clean.jsonl",\n'
        '  "keys": 1,\n'
        '  "leases": 0,\n'
        '  "ok": true,\n'
        '  "outcomes": {\n'
        '    "committed": 2,\n'
        '    "contended": 0,\n'
        '    "duplicate": 0,\n'
        '    "fenced": 0,\n'
        '    "missing": 0,\n'
        '    "skipped": 0,\n'
        '    "stale": 0\n'
        "  }\n"
        "}\n"
    )


HELP = """\
usage: fencing check [-h] [--json] [--examples N] history

judge a recorded history (JSONL) for anomalies

positional arguments:
  history       a JSON Lines history file

options:
  -h, --help    show this help message and exit
  --json        print the report as JSON
  --examples N  examples shown per anomaly kind (default 3)
"""


def test_the_help_exactly(histories: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["check", "--help"])
    assert exited.value.code == 0
    assert capsys.readouterr() == (HELP, "")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["dirty.jsonl", "--examples", "two"], "argument --examples: invalid int value: 'two'"),
        (["dirty.jsonl", "--examples"], "argument --examples: expected one argument"),
        ([], "the following arguments are required: history"),
    ],
)
def test_a_wrong_command_line_is_a_usage_error(
    histories: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["check", *args])
    assert exited.value.code == 2
    usage = "usage: fencing check [-h] [--json] [--examples N] history\n"
    assert capsys.readouterr() == ("", f"{usage}fencing check: error: {message}\n")


# -- colours: what a terminal shows ------------------------------------------------------
def _sgr(codes: str, text: str) -> str:
    """``text`` as a terminal shows it in the style ``codes`` (ANSI SGR)."""
    return f"\x1b[{codes}m{text}\x1b[0m"


BOLD, DIM, GREEN, BOLD_RED, BOLD_GREEN = "1", "2", "32", "1;31", "1;32"


def _coloured(name: str, **kwargs: Any) -> list[str]:
    from rich.console import Console

    from fencing.testing._cli import render

    file = io.StringIO()
    console = Console(file=file, width=200, force_terminal=True, color_system="standard")
    render(console, check_file(name), name, **kwargs)
    return file.getvalue().splitlines()


def test_the_colours_of_a_clean_history(histories: Path) -> None:
    lines = _coloured("clean.jsonl")
    assert lines[0].startswith(_sgr(BOLD, "clean.jsonl") + ": ")
    rows = [line for line in lines if line.startswith("│")]
    assert rows[0].startswith("│ lost updates ")
    assert _sgr(GREEN, "0") in rows[0] and _sgr(DIM, "none") in rows[0]
    assert _sgr(DIM, "acknowledged commits missing from the final state's history") in rows[1]
    assert sum(_sgr(GREEN, "0") in row for row in rows) == 4
    assert lines[-1] == _sgr(BOLD_GREEN, "clean") + ": no anomaly found"


def test_the_colours_of_a_dirty_history(histories: Path) -> None:
    lines = _coloured("dirty.jsonl")
    rows = [line for line in lines if line.startswith("│")]
    (double,) = (i for i, row in enumerate(rows) if "double-applied intents" in row)
    assert _sgr(BOLD_RED, "5") in rows[double]
    assert _sgr(DIM, "intents committed more than once") in rows[double + 1]
    assert sum(_sgr(GREEN, "0") in row for row in rows) == 3
    assert sum(_sgr(DIM, "none") in row for row in rows) == 3
    summary = "5 anomalies in 12 events on 5 keys: 5 double-applied intents"
    assert lines[-1].startswith("\x1b[1;31m") and _strip(lines[-1]) == summary
    # three examples, unless told otherwise
    assert sum("committed 2 times" in row for row in rows) == 3
    assert "... and 2 more" in "".join(rows)
    rows = [line for line in _coloured("dirty.jsonl", examples=4) if line.startswith("│")]
    assert sum("committed 2 times" in row for row in rows) == 4


def _strip(text: str) -> str:
    return re.sub("\x1b\\[[0-9;]*m", "", text)
