"""scripts/bench-pinned.sh: the bench with the client on CPU 0 and the local servers on
the other CPUs while it runs, and every CPU given back to the servers afterwards."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ._backends import require_server

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "bench-pinned.sh"
REDIS = ("--store", "redis://127.0.0.1:6379/0")


def _affinity(pid: int) -> set[int]:
    return os.sched_getaffinity(pid)


def _redis_pid() -> int:
    found = subprocess.run(["pgrep", "-x", "redis-server"], capture_output=True, text=True)
    pids = [int(p) for p in found.stdout.split()]
    if not pids:
        pytest.skip("no redis-server process on this machine (a remote server is not pinned)")
    return pids[0]


def test_the_bench_runs_pinned_and_the_servers_get_every_cpu_back() -> None:
    if shutil.which("taskset") is None or shutil.which("pgrep") is None:
        pytest.skip("taskset or pgrep (util-linux, procps) is not installed")
    cpus = os.cpu_count() or 1
    if cpus < 2:
        pytest.skip("pinning needs at least 2 CPUs")
    require_server("Redis", "127.0.0.1", 6379)
    pid = _redis_pid()
    before = _affinity(pid)
    env = {**os.environ, "VENV": str(Path(sys.executable).parent.parent)}
    done = subprocess.run(
        ["bash", str(SCRIPT), "--quick", "--json", "--only", "commit", *REDIS],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert {r["store"] for r in rows if r["kind"] == "pair"} == {"redis"}
    assert not [r for r in rows if r["kind"] == "skipped"]
    # afterwards the server may run on every CPU again
    assert _affinity(pid) == set(range(cpus)) | before


def test_a_pinned_client_runs_on_cpu_0_only(tmp_path: Path) -> None:
    """The script's own client command: taskset -c 0 (checked through a stand-in)."""
    if shutil.which("taskset") is None or (os.cpu_count() or 1) < 2:
        pytest.skip("taskset is not installed, or only one CPU")
    fake = tmp_path / "bin"
    fake.mkdir()
    stand_in = fake / "fencing"
    show = "print(sorted(os.sched_getaffinity(0)), sys.argv[1:])"
    stand_in.write_text(f"#!{sys.executable}\nimport os, sys\n{show}\n")
    stand_in.chmod(0o755)
    done = subprocess.run(
        ["bash", str(SCRIPT), "--quick"],
        capture_output=True,
        text=True,
        env={**os.environ, "VENV": str(fake.parent)},
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[0] ['bench', '--quick']"
