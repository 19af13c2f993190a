"""Issue 14's "done": a Celery worker with the Prometheus extra shows its outcome counters
moving during ``fencing demo --queue celery``. The demo's workers (prefork, real Redis
broker) serve the metrics on ``FENCING_METRICS_PORT`` through
``fencing.contrib.prometheus.celery_metrics``, in prometheus_client's multiprocess mode;
this test scrapes that endpoint while the demo runs, and reads the counters after.
"""

from __future__ import annotations

import json
import socket
import threading
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("celery")
pytest.importorskip("fencing.contrib.prometheus")

# imported before PROMETHEUS_MULTIPROC_DIR is set: this process stays in ordinary mode
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from fencing._cli import main

from ._backends import require_server

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _committed(text: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "fencing_outcomes_total" and sample.labels["outcome"] == "committed":
                total += sample.value
    return total


def test_celery_demo_outcome_counters_move(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_server("Redis", "127.0.0.1", 6379)
    port = _free_port()
    shared = tmp_path / "prometheus"
    shared.mkdir()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(shared))
    monkeypatch.setenv("FENCING_METRICS_PORT", str(port))
    seen: list[float] = []
    done = threading.Event()

    def scrape() -> None:
        while not done.wait(0.2):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    seen.append(_committed(r.read().decode()))
            except OSError:
                continue  # no worker up (yet, or between the two runs)

    scraper = threading.Thread(target=scrape, daemon=True)
    scraper.start()
    try:
        code = main(["demo", "--json", "--queue", "celery", "--tasks", "60", "--workers", "2"])
    finally:
        done.set()
        scraper.join(5)
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["ok"]
    fenced = data["runs"]["fencing"]["outcomes"]

    # the endpoint was scraped while the workers ran, and the counter moved
    assert len({v for v in seen if v > 0}) >= 2, seen
    # afterwards every worker process's counts are in the multiprocess files
    registry = CollectorRegistry()
    MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    counted: dict[str, float] = {}
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == "fencing_outcomes_total":
                outcome = sample.labels["outcome"]
                counted[outcome] = counted.get(outcome, 0.0) + sample.value
    for outcome in ("committed", "stale", "duplicate"):
        assert counted.get(outcome, 0) > 0, (outcome, counted)
    # a worker paused past its lease is fenced only if another took the lease over
    # meanwhile (else it takes the lease again and commits): as many as the demo saw
    for outcome in ("committed", "fenced"):
        assert counted.get(outcome, 0) >= fenced.get(outcome, 0), (outcome, counted, fenced)
