"""`fencing demo --queue`: the demo's schedule through real brokers and worker processes.

Each case runs the demo end to end (small ``--tasks``): the naive run must show the
anomalies, the fencing run none; no worker process of the run and no broker key of
the run may be left behind. Brokers are skipped when absent locally, and fail the
test when ``CI`` is set (``tests/_backends.require_server``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from fencing._cli import main

from ._backends import require_server

pytestmark = pytest.mark.slow

REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
AMQP_HOST, AMQP_PORT = "127.0.0.1", 5672
AMQP_URL = f"amqp://guest:guest@{AMQP_HOST}:{AMQP_PORT}//"
DEFAULT_REDIS = f"redis://{REDIS_HOST}:{REDIS_PORT}/10"

CASES = [
    ("celery", "redis"),
    ("rq", "redis"),
    ("dramatiq", "redis"),
    ("arq", "redis"),
    ("celery", "rabbitmq"),
    ("dramatiq", "rabbitmq"),
]
#: The queues on which the demo's crash after commit is real (the queue redelivers):
#: all of them. On Dramatiq and arq the crash kills a whole worker process, which the
#: demo replaces; Dramatiq's Redis broker and arq give the message back within seconds.
CRASHING = ("celery", "rq", "dramatiq", "arq")


def _demo(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = main(["demo", "--json", *args])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err, captured.err
    return code, json.loads(captured.out)


def _leftover_keys(run_id: str) -> list[bytes]:
    import redis

    client = redis.Redis.from_url(DEFAULT_REDIS)
    try:
        return list(client.scan_iter(match=f"*fencing-demo-{run_id}*", count=1000))
    finally:
        client.close()


@pytest.mark.parametrize(("queue", "broker"), CASES, ids=[f"{q}-{b}" for q, b in CASES])
def test_queue_demo_naive_breaks_fencing_holds(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, queue: str, broker: str
) -> None:
    pytest.importorskip(queue)  # the queue's fencing extra
    require_server("Redis", REDIS_HOST, REDIS_PORT)
    args = ["--queue", queue, "--tasks", "60", "--workers", "3", "--seed", "7"]
    args += ["--history", str(tmp_path / "hist")]
    if broker == "rabbitmq":
        require_server("RabbitMQ", AMQP_HOST, AMQP_PORT)
        args += ["--broker", AMQP_URL]

    code, data = _demo(capsys, *args)

    naive, fenced = data["runs"]["naive"], data["runs"]["fencing"]
    assert data["config"]["queue"] == queue and data["config"]["tasks"] == 60
    # the naive run must break, or the demo proves nothing
    assert naive["anomalies"]["lost_update"] > 0, naive
    assert naive["anomalies"]["stale_write"] > 0, naive
    assert naive["anomalies"]["double_applied"] > 0, naive  # duplicate deliveries
    assert naive["outcomes"]["stale"] == naive["outcomes"]["duplicate"] == 0
    # fencing refused what it had to and nothing went wrong
    problems = {k: v for k, v in fenced["anomalies"].items() if v}
    assert not problems, (problems, fenced["examples"])
    assert fenced["ok"] and data["ok"] and code == 0
    assert fenced["outcomes"]["stale"] > 0 and fenced["outcomes"]["duplicate"] > 0
    assert fenced["outcomes"]["fenced"] > 0  # the worker paused past its lease
    assert fenced["balance_drift"] == 0 and fenced["gave_up"] == 0
    assert fenced["errors"] == naive["errors"] == 0, (fenced["first_errors"], naive["first_errors"])
    assert naive["duplicate_deliveries"] == fenced["duplicate_deliveries"] > 0
    if queue in CRASHING:  # workers really SIGKILLed after their commit, redelivered
        # (a fencing delivery crashes only after it committed; at 60 tasks every crashing
        # task is an order decision, which may well be stale, so the fencing run may have none)
        assert naive["crashes"] > 0
        for run in (naive, fenced):
            assert run["redeliveries"] >= run["crashes"]
            # each crash's message ran again: more deliveries than tasks and duplicates
            assert run["deliveries"] >= run["tasks"] + run["duplicate_deliveries"] + run["crashes"]
        # the crash came after the commit: each redelivery of one is a Duplicate
        assert fenced["outcomes"]["duplicate"] >= fenced["crashes"]
    else:
        assert naive["crashes"] == fenced["crashes"] == 0

    # the merged histories are judged the same by `fencing check`
    assert main(["check", fenced["history"]]) == 0
    assert main(["check", naive["history"]]) == 1
    capsys.readouterr()

    # nothing of the run is left: no worker process, no broker key
    from fencing._demo.queues import run_processes

    run_id = fenced["run_id"]
    assert run_id and naive["run_id"] == run_id
    assert run_processes(run_id) == []
    assert _leftover_keys(run_id) == []


def test_queue_demo_broker_down_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("rq")
    code = main(
        ["demo", "--json", "--queue", "rq", "--tasks", "10", "--broker", "redis://127.0.0.1:1/0"]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "cannot reach the rq broker at redis://127.0.0.1:1/0" in err
    assert "Traceback" not in err


def test_queue_demo_missing_extra_names_the_pip_install(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("fencing.contrib.dramatiq", "fencing._demo.queues.dramatiq_actors"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setitem(sys.modules, "dramatiq", None)  # import dramatiq fails, as if absent
    code = main(["demo", "--json", "--queue", "dramatiq", "--tasks", "10"])
    err = capsys.readouterr().err
    assert code == 2
    assert "MissingDependency" in err and "pip install 'fencing[dramatiq]'" in err


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--broker", DEFAULT_REDIS], "--broker needs --queue"),
        (["--queue", "rq", "--processes"], "drop --processes"),
        (["--queue", "rq", "--store", "memory://"], "shared between processes"),
        (["--queue", "rq", "--broker", AMQP_URL], "--broker for rq must be a redis"),
    ],
)
def test_queue_demo_bad_options(
    capsys: pytest.CaptureFixture[str], args: list[str], problem: str
) -> None:
    if "--broker" in args and "--queue" in args:
        pytest.importorskip("rq")
    assert main(["demo", "--json", "--tasks", "10", *args]) == 2
    assert problem in capsys.readouterr().err
