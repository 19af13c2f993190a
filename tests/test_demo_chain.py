"""`fencing demo --queue X --outbox --chain`: ship -> notify, killed at the worst moments.

Each case runs the demo end to end on a real broker, real worker processes and real
relay processes (20 orders): the seed picks orders whose first ship worker is SIGKILLed
between its own write (the shipment row) and its commit, and orders whose first ship
worker is SIGKILLed after its commit, before the ack. The numbers asserted come from the
demo's database (orders' status, shipment and notification rows per order, notify's
outbox rows) and from the workers' events:

- naive (shipment row, then today's fenced commit, then notify enqueued): every order
  killed before its commit is shipped twice, every order killed after it is never
  notified (the redelivery is ``Duplicate`` and sends nothing);
- in the worker's transaction (commit, shipment row and notify's outbox row together):
  every order shipped once and notified exactly once, nothing lost, the redeliveries
  after a commit refused as ``Duplicate``, one notify outbox row per order.

Brokers are skipped when absent locally, and fail the test when ``CI`` is set.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fencing._cli import main
from fencing._demo.queues._chain import chain_crashes
from fencing._demo.queues.outbox import RELAY_KILLS

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
ORDERS, SEED = 20, 7


def _demo(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = main(["demo", "--json", *args])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err, captured.err
    return code, json.loads(captured.out)


@pytest.mark.parametrize(("queue", "broker"), CASES, ids=[f"{q}-{b}" for q, b in CASES])
def test_chain_in_the_worker_transaction_ships_and_notifies_once(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, queue: str, broker: str
) -> None:
    pytest.importorskip(queue)
    require_server("Redis", REDIS_HOST, REDIS_PORT)
    args = ["--queue", queue, "--outbox", "--chain", "--tasks", str(ORDERS), "--workers", "3"]
    args += ["--seed", str(SEED)]
    if broker == "rabbitmq":
        require_server("RabbitMQ", AMQP_HOST, AMQP_PORT)
        args += ["--broker", AMQP_URL]

    code, data = _demo(capsys, *args)

    before, after = chain_crashes(SEED, ORDERS)
    assert before and after and not before & after
    naive, chain = data["runs"]["naive"], data["runs"]["chain"]
    assert data["config"]["chain"] is True and data["config"]["queue"] == queue
    for run in (naive, chain):
        assert run["orders"] == ORDERS
        assert run["errors"] == 0, run["first_errors"]
        # the seeded SIGKILLs happened, each once, in both runs
        assert run["killed_before_commit"] == len(before)
        assert run["killed_after_commit"] == len(after)
        # each kill after a commit: its redelivery answered Duplicate
        assert run["ship_duplicates_refused"] == len(after)
        assert run["shipped"] == ORDERS and run["ship_lost"] == 0
        assert run["notified_twice"] == 0

    # naive: the row before the commit stays (shipped twice); notify after it is lost
    assert naive["shipped_twice_orders"] == sorted(before)
    assert naive["shipped_once"] == ORDERS - len(before)
    assert naive["notify_lost_orders"] == sorted(after)
    assert naive["notified_once"] == ORDERS - len(after)
    assert naive["notify_sent"] == ORDERS - len(after)
    assert naive["lost"] == len(after) and not naive["ok"]

    # the worker's transaction: all or nothing; the next step sent exactly once
    assert chain["shipped_once"] == ORDERS and chain["shipped_twice"] == 0
    assert chain["notified_once"] == ORDERS and chain["notify_lost"] == 0
    assert chain["lost"] == 0
    assert chain["notify_rows"] == ORDERS  # no row of a killed transaction, none twice
    assert chain["relay_kills"] == RELAY_KILLS
    assert chain["notify_sent"] == ORDERS + chain["notify_republished"]
    if queue != "arq":  # arq drops a re-published job id it still knows
        assert chain["notify_duplicates_refused"] == chain["notify_republished"] > 0
    assert chain["ok"] and data["ok"] and code == 0

    # nothing of the run is left: no worker or relay process, no broker key
    from fencing._demo.queues import run_processes

    assert run_processes(chain["run_id"]) == []
    assert _leftover_keys(chain["run_id"]) == []


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--chain"], "--chain needs --queue and --outbox"),
        (["--queue", "rq", "--chain"], "--chain needs --queue and --outbox"),
    ],
)
def test_chain_bad_options(
    capsys: pytest.CaptureFixture[str], args: list[str], problem: str
) -> None:
    assert main(["demo", "--json", "--tasks", "10", *args]) == 2
    assert problem in capsys.readouterr().err


def test_chain_rich_table(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The table on a terminal: per step, per run, and the verdict."""
    monkeypatch.setenv("COLUMNS", "160")  # rich's width: no wrapped row
    pytest.importorskip("celery")
    pytest.importorskip("rich")
    require_server("Redis", REDIS_HOST, REDIS_PORT)
    args = ["--queue", "celery", "--outbox", "--chain", "--tasks", str(ORDERS)]
    code = main(["demo", *args, "--workers", "3", "--seed", str(SEED)])
    out = capsys.readouterr().out
    assert code == 0, out
    before, after = chain_crashes(SEED, ORDERS)
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if len(cells) == 5 and cells[1]:
            rows[cells[1]] = cells[2:4]
    assert rows["ship: shipped once"] == [str(ORDERS - len(before)), str(ORDERS)]
    assert rows["ship: shipped twice (two shipment rows)"] == [str(len(before)), "0"]
    assert rows["notify: notified exactly once"] == [str(ORDERS - len(after)), str(ORDERS)]
    assert rows["notify: lost (shipped, never notified)"] == [str(len(after)), "0"]
    assert rows["relay SIGKILLed (after a publish)"] == ["0", str(RELAY_KILLS)]
    words = " ".join(out.split())
    assert "PASS" in words and f"{len(after)} notification(s) lost" in words
