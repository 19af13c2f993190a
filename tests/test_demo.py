"""`fencing demo` (naive vs fencing on one seeded schedule) and `fencing check`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import fencing
from fencing._cli import main
from fencing._demo import make_schedule
from fencing.testing import MemoryHistory, Recorder, check_history


def run_demo(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = main(["demo", "--json", *args])
    captured = capsys.readouterr()
    return code, json.loads(captured.out)


def assert_naive_broke_and_fencing_held(data: dict[str, Any]) -> None:
    naive, fenced = data["runs"]["naive"], data["runs"]["fencing"]
    # the naive run must fail, or the demo proves nothing
    assert naive["anomalies"]["lost_update"] > 0, naive
    assert naive["anomalies"]["stale_write"] > 0, naive
    assert naive["anomalies"]["double_applied"] > 0, naive
    assert naive["anomalies"]["fence_regression"] > 0, naive  # the paused zombie overwrote
    assert naive["outcomes"]["stale"] == naive["outcomes"]["duplicate"] == 0
    # fencing refused what it had to, and nothing else went wrong
    problems = {k: v for k, v in fenced["anomalies"].items() if v}
    assert not problems, (problems, fenced["examples"])
    assert fenced["ok"] and data["ok"]
    assert fenced["outcomes"]["duplicate"] > 0 and fenced["outcomes"]["stale"] > 0
    assert fenced["outcomes"]["fenced"] > 0
    assert fenced["balance_drift"] == 0 and fenced["gave_up"] == 0
    assert fenced["errors"] == naive["errors"] == 0, (fenced["first_errors"], naive["first_errors"])
    assert naive["tasks"] == fenced["tasks"]


def test_demo_with_threads(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, data = run_demo(
        capsys, "--tasks", "120", "--seed", "11", "--history", str(tmp_path / "hist")
    )
    assert_naive_broke_and_fencing_held(data)
    assert code == 0
    assert data["config"]["processes"] is False and data["config"]["tasks"] == 120
    # the kept histories are judged the same by `fencing check`
    naive, fenced = data["runs"]["naive"]["history"], data["runs"]["fencing"]["history"]
    assert Path(naive).parent == tmp_path / "hist"
    assert main(["check", naive]) == 1
    assert main(["check", fenced]) == 0
    capsys.readouterr()


def test_demo_with_processes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    code, data = run_demo(
        capsys, "--processes", "--workers", "3", "--tasks", "90", "--seed", "5", "--store", url
    )
    assert_naive_broke_and_fencing_held(data)
    assert code == 0
    assert data["config"]["processes"] is True


def test_the_fencing_worker_does_not_apply_a_redelivered_credit_twice(tmp_path: Path) -> None:
    """The demo's credit path: Recompute, then the task is redelivered (crash before ack).

    The first delivery's commit is refused as stale (a write landed between its probe
    and its commit) and lands as a recomputed attempt; the redelivery must then be a
    Duplicate, not a second credit.
    """
    with fencing.open(f"sqlite:///{tmp_path / 'a.db'}") as store:
        accounts = store.collection("accounts")
        accounts.create("a", {"balance": 0})
        sink = MemoryHistory()
        rec = Recorder(accounts, sink, worker="w")
        intent = rec.intent("a", "credit")  # captured when the task is enqueued
        raced = [False]

        def decide(record: fencing.Record) -> dict[str, Any]:
            if not raced[0]:
                raced[0] = True  # another worker's credit lands meanwhile
                rec.commit(rec.intent("a", "credit"), {"balance": record.state["balance"] + 100})
            return {"balance": record.state["balance"] + 1}

        first = rec.apply(intent, decide, on_stale=fencing.Recompute())
        assert first.committed
        again = rec.apply(intent, decide, on_stale=fencing.Recompute())
        rec.write_final(["a"])
        report = check_history(sink.events)
        balance = accounts.get("a")
        assert balance is not None
        assert isinstance(again, fencing.Duplicate), (again, report.summary())
        assert report.ok, report.summary()
        assert balance.state["balance"] == 101


def test_schedule_is_seeded() -> None:
    assert make_schedule(3, 200, 4) == make_schedule(3, 200, 4)
    assert make_schedule(3, 200, 4) != make_schedule(4, 200, 4)
    specs = make_schedule(3, 200, 4)
    assert len(specs) == 200
    paused = [s for s in specs if s.pause > 0]
    takeovers = [s for s in specs if s.takes_over is not None]
    assert len(paused) == len(takeovers) == 5
    assert {s.takes_over for s in takeovers} == {s.task for s in paused}
    assert any(s.duplicate is not None for s in specs) and any(s.crash for s in specs)


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--tasks", "0"], "--tasks must be from"),
        (["--workers", "0"], "--workers must be from"),
        (["--processes", "--store", "memory://"], "shared between processes"),
        (["--store", "bogus://x"], "unknown store URL scheme"),
    ],
)
def test_demo_bad_options(
    capsys: pytest.CaptureFixture[str], args: list[str], problem: str
) -> None:
    assert main(["demo", "--json", *args]) == 2
    assert problem in capsys.readouterr().err


# -- fencing check ----------------------------------------------------------------------
def _event(version: int, intent: str, **extra: Any) -> dict[str, Any]:
    return {
        "event": "outcome",
        "collection": "c",
        "key": "k",
        "intent_id": intent,
        "expected_version": version - 1,
        "outcome": "committed",
        "version": version,
        "applied_over": version - 1,
        "token": None,
        "fence": 0,
        **extra,
    }


def _history(path: Path, events: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return str(path)


def test_check_exit_codes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    final = {"event": "final", "collection": "c", "key": "k", "version": 3, "fence": 0}
    clean = _history(tmp_path / "clean.jsonl", [_event(2, "a"), _event(3, "b"), final])
    dirty = _history(
        tmp_path / "dirty.jsonl", [_event(2, "a"), _event(3, "a~1", expected_version=1), final]
    )
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(_event(2, "a")) + "\n{oops\n")

    assert main(["check", clean]) == 0
    out = capsys.readouterr().out
    assert "clean" in out and "lost updates" in out

    assert main(["check", dirty]) == 1
    out = capsys.readouterr().out
    assert "double-applied" in out and "line 1, 2" in out

    assert main(["check", str(bad)]) == 2
    assert "line 2: not JSON" in capsys.readouterr().err
    assert main(["check", str(tmp_path / "absent.jsonl")]) == 2
    capsys.readouterr()


def test_check_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    dirty = _history(tmp_path / "d.jsonl", [_event(2, "a", token=5), _event(3, "b", token=2)])
    assert main(["check", dirty, "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is False and data["anomalies"]["fence_regression"] == 1
    assert data["examples"]["fence_regression"][0]["lines"] == [1, 2]
    assert data["outcomes"]["committed"] == 2

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"event": "outcome"}\n')
    assert main(["check", str(bad), "--json"]) == 2
    assert "line 1" in json.loads(capsys.readouterr().out)["error"]
