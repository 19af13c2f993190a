"""`fencing demo --queue X --outbox`: the send after the commit, naive and through the outbox.

Each case runs the demo end to end on a real broker with real worker processes and
real relay processes (small ``--tasks``): the naive run, committing then enqueueing
with seeded crashes in between, must lose exactly those tasks; the outbox run, its
relay SIGKILLed after a publish and before the mark (twice) and restarted, must lose
none and apply none twice, its re-published rows answered ``Duplicate`` by the workers
(arq drops a re-published job id it still knows by itself). Brokers are skipped when
absent locally, and fail the test when ``CI`` is set.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from fencing._cli import main
from fencing._demo.queues.outbox import RELAY_KILLS, losses
from fencing._demo.scenario import make_schedule

from ._backends import require_server
from .test_demo_queue import AMQP_HOST, AMQP_PORT, AMQP_URL, REDIS_HOST, REDIS_PORT, _leftover_keys

pytestmark = pytest.mark.slow

CASES = [
    ("celery", "redis"),
    ("rq", "redis"),
    ("dramatiq", "redis"),
    ("arq", "redis"),
    ("celery", "rabbitmq"),
    ("dramatiq", "rabbitmq"),
]
TASKS, SEED = 60, 7


def _demo(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = main(["demo", "--json", *args])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err, captured.err
    return code, json.loads(captured.out)


def _outcomes(history: str) -> dict[str, list[str]]:
    """Each intent's outcomes, in order, from a run's merged history."""
    found: dict[str, list[str]] = defaultdict(list)
    for line in Path(history).read_text().splitlines():
        event = json.loads(line)
        if event.get("outcome") and event.get("root_id"):
            found[str(event["root_id"])].append(str(event["outcome"]))
    return found


@pytest.mark.parametrize(("queue", "broker"), CASES, ids=[f"{q}-{b}" for q, b in CASES])
def test_outbox_demo_loses_nothing_naive_send_loses_tasks(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, queue: str, broker: str
) -> None:
    pytest.importorskip(queue)
    require_server("Redis", REDIS_HOST, REDIS_PORT)
    args = ["--queue", queue, "--outbox", "--tasks", str(TASKS), "--workers", "3"]
    args += ["--seed", str(SEED), "--history", str(tmp_path / "hist")]
    if broker == "rabbitmq":
        require_server("RabbitMQ", AMQP_HOST, AMQP_PORT)
        args += ["--broker", AMQP_URL]

    code, data = _demo(capsys, *args)

    naive, outbox = data["runs"]["naive"], data["runs"]["outbox"]
    assert data["config"]["outbox"] is True and data["config"]["queue"] == queue
    for run in (naive, outbox):
        assert run["decided"] == TASKS  # every decision committed (demo_decisions rows)
        assert run["applied_twice"] == 0
        assert run["errors"] == 0, run["first_errors"]
        assert run["gave_up"] == 0

    # naive: committed, then the application crashed before the enqueue: those are lost
    expected_lost = sorted(losses(SEED, make_schedule(SEED, TASKS, 4)))
    assert naive["enqueue_crashes"] == len(expected_lost) > 0
    assert naive["lost_tasks"] == expected_lost
    assert naive["lost"] == len(expected_lost)
    assert naive["delivered"] == TASKS - naive["lost"]
    assert not naive["ok"]

    # outbox: the relay was killed between publish and mark, twice; nothing lost
    assert outbox["lost"] == 0 and outbox["lost_tasks"] == []
    assert outbox["delivered"] == TASKS
    assert outbox["relay_kills"] == RELAY_KILLS
    assert outbox["republished"] >= RELAY_KILLS  # each kill left its last publish unmarked
    assert outbox["published"] == TASKS + outbox["republished"]
    problems = {k: v for k, v in outbox["anomalies"].items() if v}
    assert not problems, (problems, outbox["examples"])
    assert outbox["balance_drift"] == 0
    assert outbox["ok"] and data["ok"] and code == 0

    # each re-published row ran once: its second delivery is refused as Duplicate
    # (a decision that was stale the first time is refused as stale again)
    outcomes = _outcomes(outbox["history"])
    run_id = outbox["run_id"]
    for task in outbox["republished_tasks"]:
        seen = outcomes[f"{run_id}.outbox.t{task}"]
        assert seen.count("committed") <= 1, (task, seen)
        if queue == "arq":  # arq drops a re-published job id it still knows
            continue
        if "committed" in seen:
            assert "duplicate" in seen, (task, seen)
        else:
            assert len(seen) >= 2, (task, seen)
    if queue != "arq":
        assert outbox["duplicates_refused"] > 0
    assert all(seen.count("committed") <= 1 for seen in outcomes.values())

    assert main(["check", outbox["history"]]) == 0
    capsys.readouterr()

    # nothing of the run is left: no worker or relay process, no broker key
    from fencing._demo.queues import run_processes

    assert run_processes(run_id) == []
    assert _leftover_keys(run_id) == []


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--outbox"], "--outbox needs --queue"),
        (["--queue", "rq", "--outbox", "--store", "sqlite:///x.db"], "drop --store"),
    ],
)
def test_outbox_demo_bad_options(
    capsys: pytest.CaptureFixture[str], args: list[str], problem: str
) -> None:
    assert main(["demo", "--json", "--tasks", "10", *args]) == 2
    assert problem in capsys.readouterr().err


def test_outbox_demo_rich_table(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The table on a terminal: each run's row of lost tasks, and the verdict."""
    monkeypatch.setenv("COLUMNS", "160")  # rich's width: no wrapped row
    pytest.importorskip("dramatiq")
    pytest.importorskip("rich")
    require_server("Redis", REDIS_HOST, REDIS_PORT)
    args = ["--queue", "dramatiq", "--outbox", "--tasks", "40", "--workers", "3"]
    code = main(["demo", *args, "--seed", str(SEED)])
    out = capsys.readouterr().out
    assert code == 0, out
    expected_lost = len(losses(SEED, make_schedule(SEED, 40, 4)))
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if len(cells) == 5 and cells[1]:
            rows[cells[1]] = cells[2:4]
    assert rows["tasks decided (committed)"] == ["40", "40"]
    assert rows["tasks lost"] == [str(expected_lost), "0"]
    assert rows["tasks applied twice"] == ["0", "0"]
    assert rows["relay SIGKILLed (after a publish)"] == ["0", str(RELAY_KILLS)]
    assert rows["history checker anomalies"] == ["0", "0"]
    words = " ".join(out.split())
    assert "PASS" in words and f"lost {expected_lost} of 40 committed decisions" in words
